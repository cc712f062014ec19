"""``python -m tl_directional.experiment``: every variant x seed, then the report (the
``tl-directional experiment`` command).

The experiment runner lives in :mod:`tl_directional.training.experiment`; this module keeps the
documented entry point and re-exports its public names.
"""

import sys

from .cli.train import build_experiment_parser as build_parser
from .cli.train import experiment_main as main
from .training.experiment import (
    DEFAULT_SEEDS,
    EXPERIMENT_DEFAULTS,
    paired_comparison,
    pre_edit_geometry,
    run_experiment,
    run_name,
    t975,
    write_report,
)

__all__ = ["DEFAULT_SEEDS", "EXPERIMENT_DEFAULTS", "build_parser", "main", "paired_comparison",
           "pre_edit_geometry", "run_experiment", "run_name", "t975", "write_report"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
