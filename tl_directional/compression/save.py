"""Saving a compressed bridge-lane model as a Hugging Face directory, swapped in atomically with its
manifest and the compression record.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..io.atomic import ArtefactError
from ..io.outputs import replace_dir
from ..model.handle import save_hf_directory
from ..model.sites import lane_of
from .compressors import RECORD_FILE, CompressionRecord


def save_compressed(model, path, record: CompressionRecord | None = None, *, force: bool = False,
                    force_hint: str = "pass force=True") -> Path:
    """Write a (compressed) bridge-lane model as a Hugging Face directory.

    Written into a temporary sibling with a ``manifest.json`` and swapped in
    (:func:`tl_directional.io.outputs.replace_dir`): an interrupted save leaves the previous
    directory intact, and a non-empty ``path`` that is not a previous compressed model is
    refused unless ``force``.

    The model's wrapped ``transformers`` modules are read parameter by parameter into a
    fresh model of the same class and config (the bridge's own ``save_pretrained`` path
    fails on GPT-2's split-qkv views), then saved with ``save_pretrained`` together with
    the tokenizer and, when given, the record as ``tl_directional_compression.json``.
    """
    if not lane_of(model).hf_export:
        raise NotImplementedError(
            "save_compressed writes Hugging Face directories from a TransformerLens 4 bridge model; "
            "on the legacy HookedTransformer lane keep the model in memory (compression_geometry "
            "takes model objects) or compress with TransformerLens >= 4")
    given, path = path, Path(path)
    with replace_dir(given, "compressed-model", force=force, force_hint=force_hint,
                     command="tl-directional compress") as tmp:
        try:
            save_hf_directory(model, tmp, tokenizer=getattr(model, "tokenizer", None))
            if record is not None:
                (tmp / RECORD_FILE).write_text(json.dumps(record.as_dict(), indent=2) + "\n")
        except (ValueError, TypeError, NotImplementedError):
            raise
        except Exception as err:  # a full disk: safetensors raises its own SafetensorError
            raise ArtefactError(
                f"writing {path} failed ({type(err).__name__}: {' '.join(str(err).split())[:400]}); "
                "nothing was written to it (the previous output, if any, is kept): free disk space "
                "or choose another output directory, then rerun") from None
    return path


__all__ = ["save_compressed"]
