"""``python -m tl_directional.cli``: the ``tl-directional`` command."""

import sys

from . import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
