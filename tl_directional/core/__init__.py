"""tl_directional.core: see docs/architecture.md for this floor and its rules."""
