"""A model directory's weight files checked against its architecture before loading.

:func:`check_model_weights` asks ``transformers`` (on the meta device, no tensor data read)
which tensors loading would leave missing, unexpected or wrong-shaped, and refuses (or, on
request, warns about) a directory where any would be.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ...io.atomic import ArtefactError
from ..adapter import quiet_transformers
from ..families.hf import from_pretrained_kwargs, hf_architecture


class DamagedWeightsError(ArtefactError):
    """A model directory's weight files do not match its architecture: a tensor is missing,
    unexpected or of the wrong shape (:func:`check_model_weights`). ``missing``,
    ``unexpected`` and ``mismatched`` hold the tensor names (``mismatched``: ``(name, shape in
    the file, shape the architecture needs)``)."""

    def __init__(self, message: str, missing=(), unexpected=(), mismatched=()):
        super().__init__(message)
        self.missing, self.unexpected, self.mismatched = tuple(missing), tuple(unexpected), tuple(mismatched)


class DamagedWeightsWarning(UserWarning):
    """A damaged model directory loaded on request (``damaged_weights="warn"``): the named
    tensors were not loaded from the files and hold ``transformers``' random initialisation."""


def _weights_loading_info(cls: Any, path: Path, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    """The (meta-device) model and ``transformers``' own report of what loading ``path`` into
    ``cls`` would leave missing, unexpected or mismatched, read without loading tensor data."""
    from transformers.utils import logging as hf_logging

    kwargs = {**from_pretrained_kwargs(dtype), "output_loading_info": True, "ignore_mismatched_sizes": True}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report is what this function returns
    try:
        with quiet_transformers():
            try:
                return cls.from_pretrained(str(path), device_map="meta", **kwargs)
            except (TypeError, ValueError, ImportError, NotImplementedError):
                # a transformers without meta loading (or without accelerate): a CPU load
                return cls.from_pretrained(str(path), **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


def _mismatched(entries, model: Any, path: Path) -> list[tuple[str, tuple, tuple]]:
    """``(name, shape in the file, shape expected)`` per mismatched tensor: transformers 5 reports
    the shapes, transformers 4 only the names (then read from the file headers and the model)."""
    from safetensors import safe_open

    out = []
    for entry in entries or ():
        if not isinstance(entry, str):
            name, in_file, expected = entry
            out.append((str(name), tuple(in_file), tuple(expected)))
            continue
        expected = tuple(model.state_dict()[entry].shape) if entry in model.state_dict() else ()
        in_file: tuple = ()
        for weights in sorted(path.glob("*.safetensors")):
            with safe_open(str(weights), framework="pt") as f:
                if entry in f.keys():
                    in_file = tuple(f.get_slice(entry).get_shape())
                    break
        out.append((entry, in_file, expected))
    return sorted(out)


def check_model_weights(path: str | os.PathLike[str], argument: str = "path", *,
                        damaged_weights: str = "error", dtype: torch.dtype = torch.float32) -> None:
    """Check that a model directory's weight files hold exactly the tensors its architecture
    (``config.json``) needs, each of the right shape, before a loader turns a missing tensor
    into a randomly initialised one.

    The check is ``transformers``' own (``from_pretrained(..., output_loading_info=True)`` on
    the meta device, so no tensor data is read): tensors that ``transformers`` ties or ignores
    on purpose (a tied ``lm_head``, non-persistent buffers) are not reported.

    Args:
        path: A Hugging Face model directory (already checked by
            :func:`~tl_directional.io.model_files.check_model_dir`).
        argument: The argument's name, for the message (``"--candidate"``).
        damaged_weights: ``"error"`` raises, ``"warn"`` emits a :class:`DamagedWeightsWarning`.
        dtype: The dtype the caller loads in.

    Raises:
        DamagedWeightsError: (``damaged_weights="error"``) naming the directory, each missing,
            unexpected or wrong-shaped tensor and the fix.
    """
    import transformers

    if damaged_weights not in ("error", "warn"):
        raise ValueError(f"damaged_weights must be 'error' or 'warn', got {damaged_weights!r}")
    path = Path(path)
    hf_config = transformers.AutoConfig.from_pretrained(str(path))
    cls = getattr(transformers, hf_architecture(hf_config), None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        return  # an architecture transformers does not know: the loader names it
    model, info = _weights_loading_info(cls, path, dtype)
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = _mismatched(info.get("mismatched_keys"), model, path)
    del model
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"missing tensor(s) {', '.join(missing)}")
    if unexpected:
        parts.append(f"unexpected tensor(s) {', '.join(unexpected)}")
    if mismatched:
        parts.append("wrong-shaped tensor(s) " + ", ".join(
            f"{k} (shape {list(a)} in the file, {list(b)} expected)" for k, a, b in mismatched))
    message = (f"{argument}={str(path)!r}: the weight files do not match {cls.__name__} of its config.json: "
               f"{'; '.join(parts)}. Loaded as is, a missing weight would hold random numbers and an "
               "unexpected one would be dropped; copy or write the model again (save_pretrained)")
    if damaged_weights == "error":
        raise DamagedWeightsError(message + "; in Python, load_model(..., damaged_weights='warn') loads it anyway.",
                                  missing, unexpected, mismatched)
    import warnings

    warnings.warn(message + " (loaded anyway: damaged_weights='warn').", DamagedWeightsWarning, stacklevel=3)
