"""A sparse autoencoder's weights, read without SAELens: from a SAELens ``SAE`` object
(duck-typed) or from SAELens's saved format on disk (``cfg.json`` + ``sae_weights.safetensors``).

What: :class:`SAEWeights` holds the encoder and decoder of an SAE trained on one hook point of a
TransformerLens model (``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_in]``,
``b_dec [d_in]``, a JumpReLU ``threshold [d_sae]`` or a TopK ``k``) and its provenance (hook
name, layer, where it was read, whether its model's weights were processed), and computes the
SAE's forward pass from those weights alone, as SAELens does for its ``standard``, ``jumprelu``
and ``topk`` architectures::

    acts  = f((x - apply_b_dec_to_input * b_dec) @ W_enc + b_enc)     f: ReLU / JumpReLU / TopK
    recon = acts @ W_dec + b_dec

so the same numbers come out on every lane, SAELens installed or not (SAELens 6 needs
TransformerLens < 4: it lives on the legacy lane only). Files are read with ``safetensors``,
never with pickle. SAEs that normalise their input at run time (``normalize_activations`` other
than ``"none"``) or reshape ``hook_z`` are refused with the fix.

Whether the SAE's model had processed weights (:attr:`SAEWeights.weights_processed`) is read
from the cfg's record of how its model was loaded, ``model_from_pretrained_kwargs``
(TransformerLens's ``fold_ln`` / ``center_writing_weights`` / ``fold_value_biases``; any of them
True: processed). A key it does not name defaults as SAELens 6 loads models
(``HookedTransformer.from_pretrained_no_processing``: every step off) when the cfg says it was
trained with SAELens >= 6; otherwise, or without the record, it is None (unknown).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from safetensors.torch import load_file
from torch import Tensor

from ..core.errors import TLDirectionalError

#: SAELens's file names in a saved SAE folder.
CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
#: The architectures whose forward pass :class:`SAEWeights` computes.
ARCHITECTURES = ("standard", "jumprelu", "topk")
#: SAEs shipped with the package, by name: trained by ``python -m studies.data.train_sae``.
BUNDLED_SAES = {"default": "default-blocks.2.hook_resid_pre"}
#: The TransformerLens weight-processing steps that change the residual stream's coordinates.
PROCESSING_KEYS = ("fold_ln", "center_writing_weights", "fold_value_biases")


class SAEError(TLDirectionalError, ValueError):
    """An SAE that cannot be used as given (bad file, unsupported architecture, wrong width for
    the model, feature ids out of range); the message names the argument and the fix."""


@dataclass(frozen=True)
class SAEWeights:
    """An SAE's weights (float32 or float64) and provenance (see the module docstring).

    Attributes:
        W_enc: ``[d_in, d_sae]`` encoder.
        b_enc: ``[d_sae]`` encoder bias.
        W_dec: ``[d_sae, d_in]`` decoder; row ``i`` is feature ``i``'s direction in the space of
            the hook point (``d_in = d_model`` for a residual-stream SAE).
        b_dec: ``[d_in]`` decoder bias (subtracted from the input first when
            ``apply_b_dec_to_input``).
        architecture: ``"standard"``, ``"jumprelu"`` or ``"topk"``.
        hook_name: the TransformerLens hook point it was trained on (None when the cfg lacks it).
        layer: the block of ``hook_name`` (None when it names none).
        weights_processed: whether its model's weights were processed; None when unknown.
        source: where it was read: a file path or ``"SAELens SAE object"``.
        cfg: the SAE's config as a plain dict (SAELens's ``cfg.json``).
        threshold: ``[d_sae]`` JumpReLU thresholds (jumprelu only).
        k: active features per token (topk only).
        apply_b_dec_to_input: subtract ``b_dec`` from the input before encoding.
    """

    W_enc: Float[Tensor, "d_in d_sae"]
    b_enc: Float[Tensor, " d_sae"]
    W_dec: Float[Tensor, "d_sae d_in"]
    b_dec: Float[Tensor, " d_in"]
    architecture: str
    hook_name: str | None
    layer: int | None
    weights_processed: bool | None
    source: str
    cfg: dict[str, Any] = field(default_factory=dict)
    threshold: Float[Tensor, " d_sae"] | None = None
    k: int | None = None
    apply_b_dec_to_input: bool = True

    @property
    def d_in(self) -> int:
        """Width of the hook point's space (``d_model`` for a residual-stream SAE)."""
        return int(self.W_dec.shape[1])

    @property
    def d_sae(self) -> int:
        """Number of features."""
        return int(self.W_dec.shape[0])

    def encode(self, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch d_sae"]:
        """Feature activations of ``x`` (the hook point's activations), in ``x``'s dtype."""
        w_enc, b_enc, b_dec = (t.to(device=x.device, dtype=x.dtype) for t in (self.W_enc, self.b_enc, self.b_dec))
        sae_in = x - b_dec * float(self.apply_b_dec_to_input)
        pre = sae_in @ w_enc + b_enc
        if self.architecture == "topk":
            values, indices = torch.topk(pre, k=int(self.k), dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, indices, values.relu())
        acts = pre.relu()
        if self.architecture == "jumprelu":
            acts = acts * (pre > self.threshold.to(device=x.device, dtype=x.dtype)).to(acts.dtype)
        return acts

    def decode(self, acts: Float[Tensor, "*batch d_sae"]) -> Float[Tensor, "*batch d_in"]:
        """The reconstruction ``acts @ W_dec + b_dec`` in the hook point's space."""
        w_dec, b_dec = (t.to(device=acts.device, dtype=acts.dtype) for t in (self.W_dec, self.b_dec))
        return acts @ w_dec + b_dec


def bundled_sae_path(name: str = "default") -> Path:
    """The folder of the SAE shipped as package data under ``name`` (:data:`BUNDLED_SAES`)."""
    if name not in BUNDLED_SAES:
        raise SAEError(f"no bundled SAE named {name!r}; the package ships {sorted(BUNDLED_SAES)}")
    return Path(str(resources.files("tl_directional") / "data" / "sae" / BUNDLED_SAES[name]))


def _layer_of(hook_name: str | None, cfg: dict) -> int | None:
    m = re.match(r"blocks\.(\d+)\.", hook_name or "")
    if m is not None:
        return int(m.group(1))
    layer = cfg.get("hook_layer")  # SAELens < 6 kept it at the top level
    return int(layer) if isinstance(layer, int) and not isinstance(layer, bool) else None


def _meta(cfg: dict, key: str, default: Any = None) -> Any:
    """``cfg["metadata"][key]`` (SAELens 6) or ``cfg[key]`` (earlier versions)."""
    meta = cfg.get("metadata")
    if isinstance(meta, dict) and key in meta:
        return meta[key]
    return cfg.get(key, default)


def weights_processed_from_cfg(cfg: dict) -> bool | None:
    """Whether the model an SAE was trained on had processed weights, from its cfg's
    ``model_from_pretrained_kwargs`` (module docstring); None when the cfg does not say."""
    kwargs = _meta(cfg, "model_from_pretrained_kwargs")
    if not isinstance(kwargs, dict):
        return None
    named = [bool(kwargs[k]) for k in PROCESSING_KEYS if k in kwargs]
    if any(named):
        return True
    if len(named) == len(PROCESSING_KEYS):
        return False
    version = str(_meta(cfg, "sae_lens_training_version") or _meta(cfg, "sae_lens_version") or "")
    major = re.match(r"(\d+)\.", version)
    cls = _meta(cfg, "model_class_name", "HookedTransformer")
    if major and int(major.group(1)) >= 6 and cls in ("HookedTransformer", "HookedSAETransformer"):
        return False  # SAELens 6 loads with from_pretrained_no_processing
    return None


def _check_cfg(cfg: dict, where: str) -> tuple[str, int | None]:
    """``(architecture, k)`` after refusing what :class:`SAEWeights` cannot compute."""
    arch = str(cfg.get("architecture", "standard"))
    if arch not in ARCHITECTURES:
        raise SAEError(f"{where}: SAE architecture {arch!r} is not supported; supported are "
                       f"{ARCHITECTURES} (decoder rows of any SAE: pass its W_dec as a tensor)")
    norm = cfg.get("normalize_activations", "none") or "none"
    if norm != "none":
        raise SAEError(f"{where}: normalize_activations={norm!r} rescales the input at run time; "
                       "fold it into the weights first (SAELens: sae.fold_activation_norm_scaling_factor"
                       "(factor), then sae.save_model(path)), or pass the folded SAE object")
    if (cfg.get("reshape_activations") or "none") != "none":
        raise SAEError(f"{where}: reshape_activations={cfg['reshape_activations']!r} (an SAE on "
                       "hook_z) is not supported; use an SAE on a residual-stream hook point")
    k = cfg.get("k")
    if arch == "topk" and (not isinstance(k, int) or k < 1):
        raise SAEError(f"{where}: a topk SAE needs an integer k >= 1 in its cfg, got {k!r}")
    if arch == "topk" and cfg.get("rescale_acts_by_decoder_norm"):
        raise SAEError(f"{where}: topk with rescale_acts_by_decoder_norm=True is not supported; "
                       "fold the decoder norms first (SAELens: sae.fold_W_dec_norm())")
    return arch, (k if arch == "topk" else None)


def _from_tensors(tensors: dict[str, Tensor], cfg: dict, source: str) -> SAEWeights:
    arch, k = _check_cfg(cfg, source)
    missing = [n for n in ("W_enc", "b_enc", "W_dec", "b_dec") if n not in tensors]
    if arch == "jumprelu" and "threshold" not in tensors and "log_threshold" not in tensors:
        missing.append("threshold")
    if missing:
        raise SAEError(f"{source}: the SAE's weights lack {missing}; found {sorted(tensors)}. "
                       "Pass a SAELens SAE (or the folder SAE.save_model wrote)")
    t = {n: v.detach().float() if v.dtype != torch.float64 else v.detach() for n, v in tensors.items()}
    d_sae, d_in = t["W_dec"].shape if t["W_dec"].ndim == 2 else (None, None)
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    bad = {n: tuple(t[n].shape) for n, s in shapes.items() if d_in is None or tuple(t[n].shape) != s}
    if bad:
        raise SAEError(f"{source}: inconsistent SAE weight shapes {bad}; expected W_enc [d_in, d_sae], "
                       "b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]")
    for name in ("d_in", "d_sae"):
        want = {"d_in": d_in, "d_sae": d_sae}[name]
        if name in cfg and cfg[name] != want:
            raise SAEError(f"{source}: cfg {name}={cfg[name]} but the weights have {name}={want}")
    threshold = t.get("threshold")
    if threshold is None and "log_threshold" in t:
        threshold = t["log_threshold"].exp()
    hook = _meta(cfg, "hook_name")
    return SAEWeights(W_enc=t["W_enc"], b_enc=t["b_enc"], W_dec=t["W_dec"], b_dec=t["b_dec"],
                      architecture=arch, hook_name=hook, layer=_layer_of(hook, cfg),
                      weights_processed=weights_processed_from_cfg(cfg), source=source, cfg=cfg,
                      threshold=threshold if arch == "jumprelu" else None, k=k,
                      apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)))


def _read_folder(path: Path, argument: str) -> tuple[dict[str, Tensor], dict, str]:
    if path.is_dir():
        weights, cfg_path = path / WEIGHTS_FILE, path / CFG_FILE
    else:
        weights, cfg_path = path, path.with_name(CFG_FILE)
    if not weights.is_file():
        raise FileNotFoundError(
            f"{argument}={str(path)!r}: no SAE weights at {weights} (SAELens saves a folder with "
            f"{WEIGHTS_FILE} and {CFG_FILE}: SAE.save_model(path)); pass that folder, its "
            f".safetensors file, a SAELens SAE object or 'default' (the bundled SAE)")
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{argument}={str(path)!r}: no {CFG_FILE} beside {weights.name}; "
                                "the SAE's config (architecture, hook_name) is needed: copy it from "
                                "where the SAE was saved")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        tensors = load_file(str(weights))
    except (ValueError, OSError) as err:  # bad JSON or a file that is not safetensors
        raise SAEError(f"{argument}={str(path)!r}: cannot read the SAE ({err}); "
                       "restore the files SAE.save_model wrote") from None
    if not isinstance(cfg, dict):
        raise SAEError(f"{argument}={str(path)!r}: {cfg_path} is not a JSON object")
    return tensors, cfg, str(weights)


def _cfg_dict(cfg: object) -> dict:
    if isinstance(cfg, dict):
        return dict(cfg)
    to_dict = getattr(cfg, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}


def load_sae_weights(sae_or_path: object, *, argument: str = "sae") -> SAEWeights:
    """Read an SAE's weights and provenance without SAELens.

    Args:
        sae_or_path: a SAELens ``SAE`` object (anything with ``W_enc``, ``b_enc``, ``W_dec``,
            ``b_dec`` tensors and a ``cfg``), a folder SAELens saved (``cfg.json`` +
            ``sae_weights.safetensors``), that ``.safetensors`` file (its ``cfg.json`` beside
            it), a bundled SAE's name (``"default"``: trained by SAELens on the default model's
            ``blocks.2.hook_resid_pre``), or an :class:`SAEWeights` (returned as is).
        argument: the argument name errors use.

    Returns:
        An :class:`SAEWeights` (float32 tensors, float64 kept), detached from any graph.

    Raises:
        FileNotFoundError: the weights or the ``cfg.json`` are missing.
        SAEError: (a ``ValueError``) unreadable files, inconsistent shapes, an architecture or
            run-time normalisation it cannot compute, or an object that is not an SAE.
    """
    if isinstance(sae_or_path, SAEWeights):
        return sae_or_path
    if isinstance(sae_or_path, str) and sae_or_path in BUNDLED_SAES:
        sae_or_path = bundled_sae_path(sae_or_path)
    if isinstance(sae_or_path, (str, os.PathLike)):
        tensors, cfg, source = _read_folder(Path(sae_or_path), argument)
        return _from_tensors(tensors, cfg, source)
    names = ("W_enc", "b_enc", "W_dec", "b_dec")
    if not all(isinstance(getattr(sae_or_path, n, None), Tensor) for n in names) or not hasattr(sae_or_path, "cfg"):
        raise SAEError(f"{argument} must be a SAELens SAE (W_enc, b_enc, W_dec, b_dec and cfg), a "
                       f"saved SAE folder or .safetensors file, or a bundled name {sorted(BUNDLED_SAES)}; "
                       f"got {type(sae_or_path).__name__}")
    cfg = _cfg_dict(sae_or_path.cfg)
    tensors = {n: getattr(sae_or_path, n) for n in names}
    for extra in ("threshold", "log_threshold"):
        if isinstance(getattr(sae_or_path, extra, None), Tensor):
            tensors[extra] = getattr(sae_or_path, extra)
    return _from_tensors(tensors, cfg, "SAELens SAE object")


__all__ = ["ARCHITECTURES", "BUNDLED_SAES", "SAEError", "SAEWeights", "bundled_sae_path",
           "load_sae_weights", "weights_processed_from_cfg"]
