"""Claim D"s depth study (studies/depth): a thin entry point kept for the commands the result pages cite (see forward.py)."""

import sys

from forward import forward

ROUTES = {
    "run": ["studies", "run", "depth"],
    "build": ["studies", "build"],
}

if __name__ == "__main__":
    sys.exit(forward(ROUTES))
