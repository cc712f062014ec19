"""The IOI attribution exploration (studies/explore/ioi_attribution.py): a thin entry point kept for the commands the result pages cite (see forward.py)."""

import sys

from forward import forward

ROUTES = {
    "run": ["studies.explore.ioi_attribution", "run"],
}

if __name__ == "__main__":
    sys.exit(forward(ROUTES))
