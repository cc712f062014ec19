"""``python -m tl_directional.train``: one training run (the ``tl-directional train`` command).

The training workflow lives in :mod:`tl_directional.training`; this module keeps the documented
entry point (also for ``torchrun ... -m tl_directional.train``) and re-exports its public names.
"""

import sys

from .cli.train import add_config_arguments, config_from_args
from .cli.train import build_train_parser as build_parser
from .cli.train import train_main as main
from .training import *  # noqa: F403
from .training import __all__ as _training_all

__all__ = [*_training_all, "add_config_arguments", "build_parser", "config_from_args", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
