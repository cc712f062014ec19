"""Claim 3"s compression study (studies/compression): a thin entry point kept for the commands the result pages cite (see forward.py)."""

import sys

from forward import forward

ROUTES = {
    "run": ["studies", "run", "compression"],
    "merge": ["studies", "run", "compression", "merge"],
    "build": ["studies", "build"],
}

if __name__ == "__main__":
    sys.exit(forward(ROUTES))
