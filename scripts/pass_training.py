"""Protocol sec. 10"s single-pass training (studies/pass_training): a thin entry point kept for the commands the result pages cite (see forward.py)."""

import sys

from forward import forward

ROUTES = {
    "run": ["studies", "run", "pass-training", "run"],
    "task": ["studies", "run", "pass-training", "task"],
    "collect": ["studies", "run", "pass-training", "collect"],
    "bench": ["studies", "run", "pass-training", "bench"],
}

if __name__ == "__main__":
    sys.exit(forward(ROUTES))
