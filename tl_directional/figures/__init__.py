"""tl_directional.figures: see docs/architecture.md for this floor and its rules."""
