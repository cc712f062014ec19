"""tl_directional.evaluate: see docs/architecture.md for this floor and its rules."""
