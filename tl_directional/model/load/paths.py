"""Where tl-directional keeps things on disk: the cache root and the bundled default model."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Root of tl-directional's on-disk cache: ``$TL_DIRECTIONAL_CACHE`` or
    ``~/.cache/tl_directional``."""
    env = os.environ.get("TL_DIRECTIONAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tl_directional"


#: Package-data directory of the bundled pretrained default model.
BUNDLED_MODEL_DIR = "default_model"

def bundled_model_dir() -> Path | None:
    """``tl_directional/data/default_model`` when the bundled pretrained model is installed
    (``config.json`` + ``model.safetensors`` + ``tokenizer.json``), else ``None``."""
    from importlib import resources

    base = Path(str(resources.files("tl_directional") / "data" / BUNDLED_MODEL_DIR))
    needed = ("config.json", "model.safetensors", "tokenizer.json")
    return base if all((base / f).is_file() for f in needed) else None


__all__ = ["BUNDLED_MODEL_DIR", "bundled_model_dir", "cache_dir"]
