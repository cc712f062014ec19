"""tl_directional.model: see docs/architecture.md for this floor and its rules."""
