"""tl_directional.io: see docs/architecture.md for this floor and its rules."""
