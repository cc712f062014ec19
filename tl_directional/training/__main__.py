"""``python -m tl_directional.training {train,experiment} ...``."""

import sys

from ..cli.train import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
