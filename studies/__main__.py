"""``python -m studies``: see :mod:`studies.cli`."""

from studies import common
from studies.cli import main

common.run_main(main)
