"""Hugging Face model directories and safetensors files, checked before they are loaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .atomic import ArtefactError
from .locks import recover_interrupted_swap
from .records import verify_manifest

_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")


def check_safetensors_file(path: str | os.PathLike) -> None:
    """Raise :class:`ArtefactError` unless ``path`` is a complete safetensors file (its
    header parses and its size is exactly header + every tensor's bytes)."""
    path = Path(path)
    size = path.stat().st_size
    fix = "copy or write the model again"
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ArtefactError(f"{path} is truncated ({size} bytes, not a safetensors file); {fix}")
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            raise ArtefactError(f"{path} is truncated ({size} bytes; its header alone needs {8 + n}); {fix}")
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise ArtefactError(f"{path} is corrupt (its safetensors header does not parse); {fix}") from None
    if 8 + n + end != size:
        raise ArtefactError(f"{path} is truncated or corrupt ({size} bytes; its header describes "
                            f"{8 + n + end}); {fix}")


def check_model_dir(path: str | os.PathLike, argument: str, *, must_exist: bool = False) -> None:
    """Check a Hugging Face model directory before loading it: its manifest (when it
    has one), ``config.json``, complete safetensors weights and a tokenizer file.
    Names that are not existing paths (``"default"``, a TransformerLens name) pass,
    unless ``must_exist`` (:func:`tl_directional.model.load.load_model` with a path).

    Raises :class:`ArtefactError` naming ``argument``, the file and the fix.
    """
    p = Path(path)
    recover_interrupted_swap(p)
    if not p.exists():
        if must_exist:
            raise ArtefactError(
                f"{argument}={str(p)!r} does not exist. Pass a directory written by "
                "build_tiny_hf_model() or save_pretrained(), or a TransformerLens model name.")
        return
    if not p.is_dir():
        raise ArtefactError(f"{argument} {p} is a file; pass a Hugging Face model directory")
    try:
        verify_manifest(p, required=False, fix="copy or write the model again")
    except ArtefactError as err:
        raise ArtefactError(f"{argument}: {err}") from None
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ArtefactError(f"{argument} {p} has no config.json; pass a directory written by "
                            "save_pretrained (or tl-directional compress)")
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtefactError(f"{argument}: {cfg} is corrupt or truncated ({err}); copy or write the "
                            "model again") from None
    weights = sorted(p.glob("*.safetensors"))
    if not weights and not any(p.glob("pytorch_model*.bin")):
        raise ArtefactError(f"{argument} {p} has no model.safetensors (no weights); copy the model's "
                            "weight files into it or write it again")
    for w in weights:
        try:
            check_safetensors_file(w)
        except ArtefactError as err:
            raise ArtefactError(f"{argument}: {err}") from None
    if not any((p / name).is_file() for name in _TOKENIZER_FILES):
        raise ArtefactError(f"{argument} {p} has no tokenizer.json; save the model's tokenizer into it "
                            f"(tokenizer.save_pretrained('{p}')) or copy tokenizer.json from the model "
                            "it was made from")
