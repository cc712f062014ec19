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
from ..families.hf import from_pretrained_kwargs, hf_architecture
from ..lanes import quiet_transformers


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


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """``{tensor name: shape}`` from the headers of ``path``'s ``*.safetensors`` files (no data
    read); None when the directory holds no safetensors file."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for weights in files:
        with safe_open(str(weights), framework="pt") as f:
            shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    return shapes


def _names(names, n: int = 4) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _check_config_fits_files(cls: Any, hf_config: Any, path: Path, argument: str) -> None:
    """Refuse, before anything is allocated, a ``config.json`` that does not describe the weight
    files beside it (most of the tensors it needs are absent by name or shape). ``transformers``'
    own check (:func:`_weights_loading_info`) allocates every missing tensor on the CPU on some
    versions (4.57: a Llama config with a GPT-2's weights built the full 7B default before any
    error), so a config/weights mix-up is caught here from the file headers and a meta-device
    model (no data)."""
    in_file = _file_shapes(path)
    if not in_file:
        return
    try:
        with torch.device("meta"), quiet_transformers():
            expected = {k: tuple(v.shape) for k, v in cls(hf_config).state_dict().items()}
    except (NotImplementedError, RuntimeError, TypeError, ValueError):
        # an architecture whose __init__ computes with tensors (Apertus' xIELU activation)
        # cannot be built on the meta device: transformers' own check below still runs
        return
    prefix = getattr(cls, "base_model_prefix", "") + "."

    def found(name: str) -> tuple[int, ...] | None:
        return in_file.get(name, in_file.get(name.removeprefix(prefix)))

    fits = sum(found(k) == shape for k, shape in expected.items())
    if fits * 2 >= len(expected):
        return  # mostly right: transformers' check names the few that are not
    n_expected = sum(int(torch.Size(s).numel()) for s in expected.values())
    n_file = sum(int(torch.Size(s).numel()) for s in in_file.values())
    raise DamagedWeightsError(
        f"{argument}={str(path)!r}: config.json describes {cls.__name__} ({len(expected)} tensors, "
        f"{n_expected:,} values) but the weight files hold {len(in_file)} tensors ({n_file:,} values), of which "
        f"only {fits} fit by name and shape (the files hold e.g. {_names(set(in_file) - set(expected))}; the "
        f"config needs e.g. {_names(k for k in expected if found(k) is None)}): this config.json does not "
        "belong to these weights, and nothing was built. Put the model's own config.json beside its weights",
        [k for k in expected if found(k) is None], sorted(set(in_file) - set(expected)))


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
    _check_config_fits_files(cls, hf_config, path, argument)
    model, info = _weights_loading_info(cls, path, dtype)
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = _mismatched(info.get("mismatched_keys"), model, path)
    del model
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"missing tensor(s) {_names(missing, 12)}")
    if unexpected:
        parts.append(f"unexpected tensor(s) {_names(unexpected, 12)}")
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
