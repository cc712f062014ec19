"""The bridge lane: TransformerLens 4's ``TransformerBridge``.

A wrapper around a Hugging Face ``transformers`` model; each wrapped HF module is reachable
as a component's ``_original_component``. Everything the package does specially for it lives
here: the HF modules behind components (``LinearBridge`` linears, GPT-2's ``Conv1D``, a fused
``qkv`` kept in step with its split copies), the HF state dict and a plain HF copy, the reboot
that clones it, the private hook registry, the unembedding and the KV-cache check of
``generate``.

Checked on TransformerLens 4.3. ``transformer_lens`` and ``transformers`` are imported inside
the methods that need them.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch import Tensor

from ...core.geometry import dtype_tolerance
from ..tl_compat import check_hook_registry, registry_changed
from .base import Lane, LinearSpec, Unembedding, float_copy, quiet_transformers

#: The bridge's attribute holding the wrapped Hugging Face module of a component.
_HF_CHILD = "_original_component"

#: HF config fields that change the logits after the unembedding's linear map (softcapping,
#: scaling); a model that sets one is not given an :class:`Unembedding`.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


# ---------------------------------------------------------------------------------------------
# The Hugging Face side of a bridge
# ---------------------------------------------------------------------------------------------


def hf_module(component):
    """The Hugging Face module a bridge component wraps (``attn.q`` -> its ``nn.Linear`` /
    ``Conv1D``); follows nested wrappers. A module that wraps nothing is returned as is."""
    obj = component
    while _HF_CHILD in getattr(obj, "_modules", {}):
        obj = obj._modules[_HF_CHILD]
    return obj


def hf_attention_module(attn):
    """The HF attention module behind a bridge attention component (``original_component``
    where the bridge exposes one, else the wrapped child)."""
    return getattr(attn, "original_component", None) or hf_module(attn)


def hf_state_key(name: str) -> str:
    """A bridge-wrapped HF parameter name with the wrapper hops removed
    (``transformer.h.0.attn._original_component.c_attn.weight`` -> ``...attn.c_attn.weight``)."""
    return name.replace(f".{_HF_CHILD}", "").replace(f"{_HF_CHILD}.", "")


def hf_state_dict(model, *, keep_vars: bool = False) -> dict[str, Tensor]:
    """The wrapped HF model's state dict of a bridge under the HF model's own names
    (what ``save_pretrained`` of the unwrapped model holds)."""
    return {hf_state_key(k): v for k, v in model.original_model.state_dict(keep_vars=keep_vars).items()}


def _is_conv1d(mod) -> bool:
    return type(mod).__name__ == "Conv1D"  # HF Conv1D stores [in, out]


def _linear_children(comp) -> tuple[list[str], bool]:
    """Names of a component's wrapped linears, without a fused ``qkv`` whose split ``q, k, v``
    are what forward reads; and whether such a fused ``qkv`` was left out."""
    names = [n for n, c in comp.named_children() if type(c).__name__ == "LinearBridge"]
    fused = "qkv" in names and {"q", "k", "v"} <= set(names)
    if fused:
        names.remove("qkv")
    return names, fused


def _fused_rows(attn) -> dict[str, Tensor] | None:
    """For a fused-QKV attention bridge whose split ``q, k, v`` are copies (NeoX: interleaved
    per head), the rows of the fused ``[out, in]`` weight each split row came from.

    Found by running the bridge's own split function on a probe weight whose rows hold their
    own index, so the map is exact for any row permutation the adapter uses. None when the
    split weights are views into the fused one (GPT-2), where in-place writes already reach it.
    """
    fused_mod = hf_module(attn.qkv)
    fused = fused_mod.weight
    storage = fused.untyped_storage().data_ptr()
    if all(hf_module(getattr(attn, n)).weight.untyped_storage().data_ptr() == storage
           for n in ("q", "k", "v")):
        return None
    split = getattr(attn, "split_qkv_matrix", None)
    hf_attn = hf_attention_module(attn)
    if split is None:
        raise NotImplementedError("fused QKV weight without a split function: cannot keep it in sync")
    conv = _is_conv1d(fused_mod)
    n_out = fused.shape[1] if conv else fused.shape[0]
    probe = torch.arange(n_out, dtype=torch.float64).unsqueeze(1).expand(n_out, fused.shape[0] if conv else fused.shape[1])
    saved = fused.data
    try:
        fused.data = (probe.T if conv else probe).to(saved.dtype).contiguous()
        parts = split(hf_attn)
    finally:
        fused.data = saved
    out = {}
    for name, mod in zip(("q", "k", "v"), parts, strict=True):
        w = mod.weight.detach()
        rows = (w.T if _is_conv1d(mod) else w)[:, 0]
        out[name] = rows.round().long()
    if torch.cat(list(out.values())).sort().values.tolist() != list(range(n_out)):
        raise NotImplementedError("fused QKV split is not a row permutation: cannot keep it in sync")
    return out


# ---------------------------------------------------------------------------------------------
# generate: the KV-cache check
# ---------------------------------------------------------------------------------------------

#: model -> whether one KV-cached step reproduces the full forward (see kv_cache_matches).
_KV_CACHE_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kv_cache_matches(model) -> bool:
    """Whether one KV-cached step gives the logits of the full forward pass (bridge lane).

    Checked on a short fixed token sequence, in the model's dtype tolerance; the result is
    kept per model instance.
    """
    try:
        known = _KV_CACHE_OK.get(model)
    except TypeError:  # not weak-referenceable: check every time
        known = None
    if known is not None:
        return known

    device = next(model.parameters()).device
    n_vocab = int(model.cfg.d_vocab)
    tokens = (torch.arange(2, 8, device=device) * 7919 % n_vocab).unsqueeze(0).long()
    with torch.no_grad():
        full = model(tokens)[:, -1].float()
        _, past = model(tokens[:, :-1], return_type="logits_and_cache")
        step = model(tokens[:, -1:], past_key_values=past)[:, -1].float()
    tol = max(1e-3, 10 * dtype_tolerance(full.dtype)) * max(1.0, float(full.abs().max()))
    ok = bool((full - step).abs().max() <= tol)
    try:
        _KV_CACHE_OK[model] = ok
    except TypeError:
        pass
    return ok


# ---------------------------------------------------------------------------------------------
# The lane
# ---------------------------------------------------------------------------------------------


class BridgeLane(Lane):
    """TransformerLens >= 4: ``TransformerBridge`` (see the module docstring)."""

    __slots__ = ()
    hf_export = True
    hook_kind = "transformer_lens"
    resolves_encoders = True
    requirement = "transformer-lens>=4"

    def family_refusal(self, family) -> str:
        return family.bridge_refusal

    def claims(self, model) -> bool:
        names = {cls.__name__ for cls in type(model).__mro__}
        return "TransformerBridge" in names or "BridgeCore" in names

    def hook_layout_key(self, model) -> tuple:
        # hook_dict is rebuilt from the private registry on every access (a few ms); the
        # registry's names say the same (the aliases are derived from them).
        registry = getattr(model, "_hook_registry", None)
        return tuple(registry) if registry is not None else tuple(model.hook_dict)

    def weights_processed_flag(self, model) -> bool | None:
        return getattr(model, "_weights_processed", None)

    def final_norm_weight(self, model) -> Tensor | None:
        # HF's Gemma*RMSNorm computes x * (1 + weight); the bridge exposes the raw weight.
        ln = model.ln_final
        inner = getattr(ln, "original_component", None)
        if inner is not None and type(inner).__name__.startswith("Gemma") and getattr(inner, "weight", None) is not None:
            return 1.0 + inner.weight
        w = getattr(ln, "w", None)
        return w if w is not None else getattr(inner, "weight", None)

    def linear_inputs(self, model, layer: int, hook_names) -> dict[str, tuple[str, Tensor | None]]:
        # each wrapped linear has its own blocks.L.<attn|mlp>.<name>.hook_in
        block = model.blocks[layer]
        out: dict[str, tuple[str, Tensor | None]] = {}
        for unit in ("attn", "mlp"):
            comp = getattr(block, unit, None)
            if comp is None:
                continue
            for n in _linear_children(comp)[0]:
                hook = f"blocks.{layer}.{unit}.{n}.hook_in"
                if hook in hook_names:
                    out[f"{unit}.{n}"] = (hook, None)
        return out

    def linear_weights(self, model, layer: int) -> list[LinearSpec]:
        block = model.blocks[layer]
        out: list[LinearSpec] = []
        for unit in ("attn", "mlp"):
            comp = getattr(block, unit, None)
            if comp is None:
                continue
            names, fused = _linear_children(comp)
            # forward reads q, k, v: compress each once, keeping a copied fused weight in step
            fused_rows = _fused_rows(comp) if fused else None
            for n in names:
                mod = hf_module(getattr(comp, n))
                w = mod.weight
                transposed = _is_conv1d(mod)
                sync = None
                if fused_rows is not None and n in fused_rows:
                    fmod = hf_module(comp.qkv)
                    sync = (fmod.weight, _is_conv1d(fmod), fused_rows[n])

                def get(w=w, t=transposed):
                    return float_copy(w.T if t else w)

                def set_(m, w=w, t=transposed, sync=sync):
                    with torch.no_grad():
                        w.copy_((m.T if t else m).to(w.dtype))
                        if sync is not None:  # keep the fused weight (what is saved) in step
                            fw, fconv, rows = sync
                            if fconv:
                                fw[:, rows] = m.T.to(fw.dtype)
                            else:
                                fw[rows] = m.to(fw.dtype)

                shape = (w.shape[1], w.shape[0]) if transposed else (w.shape[0], w.shape[1])
                out.append((f"{unit}.{n}", tuple(shape), get, set_))
        return out

    def output_biases(self, model, layer: int) -> list[Tensor]:
        block = model.blocks[layer]
        out = []
        for unit, name in (("attn", "o"), ("mlp", "out")):
            mod = hf_module(getattr(getattr(block, unit), name))
            if getattr(mod, "bias", None) is not None:
                out.append(mod.bias)
        return out

    def native_state_dict(self, model, *, keep_vars: bool = False) -> dict[str, Tensor]:
        return hf_state_dict(model, keep_vars=keep_vars)

    def boot_by_name(self, name: str, *, device: Any, dtype: torch.dtype):
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(name, device=device, dtype=dtype)
        model.eval()
        return model

    def load_dir(self, path, *, device: Any, dtype: torch.dtype):
        from transformer_lens.model_bridge import TransformerBridge

        # Boot from the path string: TL then reads config, weights and tokenizer from disk. Passing
        # an in-memory tokenizer / hf_model instead makes TL look the name up on the hub.
        with quiet_transformers():
            return TransformerBridge.boot_transformers(str(path), device=device, dtype=dtype)

    def clone(self, model):
        # A deep copy is not safe (see tl_directional.model.handle.clone_model): boot afresh and copy
        # every parameter and buffer of the wrapped transformers model over.
        from transformer_lens.model_bridge import TransformerBridge

        hf = model.original_model
        source = getattr(hf.config, "_name_or_path", None) or getattr(model.cfg, "model_name", None)
        if not source:
            raise ValueError("cannot copy this TransformerBridge: it records no directory or model name "
                             "to boot a fresh copy from (config._name_or_path is empty)")
        param = next(hf.parameters())
        try:
            with quiet_transformers():
                fresh = TransformerBridge.boot_transformers(str(source), device=param.device, dtype=param.dtype)
        except Exception as exc:  # pragma: no cover - depends on what the source is
            raise ValueError(f"cannot copy this TransformerBridge: booting a fresh copy from {source!r} "
                             f"failed ({type(exc).__name__}: {exc})") from exc
        state = hf.state_dict()
        with torch.no_grad():
            missing, unexpected = fresh.original_model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"cannot copy this TransformerBridge: the fresh copy booted from {source!r} has "
                             f"a different structure (missing {missing[:3]}, unexpected {unexpected[:3]})")
        fresh.eval()
        probe = torch.arange(min(8, int(model.cfg.d_vocab)), device=param.device).unsqueeze(0)
        with torch.no_grad():
            # bit-equal, NaN where the original is NaN (a model with a NaN weight copies exactly too)
            same = torch.allclose(model(probe), fresh(probe), rtol=0, atol=0, equal_nan=True)
        if not same:
            raise ValueError(f"cannot copy this TransformerBridge: a fresh copy booted from {source!r} with "
                             "the same weights gives different logits")
        return fresh

    def to_hf_model(self, model):
        # The bridge's own save_pretrained path fails on GPT-2's split-qkv views, so every
        # parameter of a fresh model is read, name by name, through the wrappers.
        import transformers

        hf = model.original_model
        config = hf.config
        arch = (getattr(config, "architectures", None) or [type(hf_module(hf)).__name__])[0]
        fresh = getattr(transformers, arch)(config)
        with torch.no_grad():
            for name, p in fresh.named_parameters():
                obj = hf
                for part in name.split("."):
                    obj = getattr(hf_module(obj), part)
                p.copy_(obj.detach().to(p.dtype))
        return fresh

    def save_hf_directory(self, model, directory, *, tokenizer: Any = None) -> None:
        fresh = self.to_hf_model(model)
        with quiet_transformers():
            fresh.save_pretrained(str(directory))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))

    def add_hook_point(self, model, name: str, hook_point) -> None:
        # No public registration in TL 4.3: hook_dict is built from the private _hook_registry,
        # and the public clear_hook_registry() has only a private re-scan that would name a
        # nested point by its component path, not by the TL names the package uses. The
        # registry's shape is checked first and the new entry after (tl_compat names the version).
        registry = check_hook_registry(model)
        registry[name] = hook_point
        if model.hook_dict.get(name) is not hook_point:
            registry.pop(name, None)
            raise registry_changed(f"took {name!r} but hook_dict does not serve it")

    def remove_hook_point(self, model, name: str) -> None:
        model._hook_registry.pop(name, None)

    def unembedding(self, model) -> Unembedding | None:
        hf_cfg = getattr(getattr(model, "original_model", None), "config", None)
        for name in _LOGIT_TRANSFORMS:
            value = getattr(hf_cfg, name, None)
            if value not in (None, 0, 0.0, 1, 1.0):
                return None
        unembed = getattr(model, "unembed", None)
        if unembed is None or "unembed.hook_in" not in model.hook_dict or not isinstance(hf_module(unembed), torch.nn.Linear):
            return None
        return Unembedding("unembed.hook_in", (unembed,))

    def wrap_generate(self, model, original):
        # TL 4.3 bridges give wrong logits with the KV cache for some architectures: off by
        # default, and checked once per model when asked for.
        @functools.wraps(original)
        def generate(input="", *args, use_past_kv_cache: bool = False, **kwargs):
            if use_past_kv_cache and not kv_cache_matches(model):
                from importlib.metadata import version

                raise ValueError(
                    f"use_past_kv_cache=True: on this TransformerLens {version('transformer-lens')} bridge "
                    f"({getattr(model.cfg, 'model_name', 'model')}) one KV-cached step does not reproduce "
                    "the full forward pass (an upstream bug), so cached generation would give wrong "
                    "tokens. Pass use_past_kv_cache=False (tl_directional's default on the bridge)."
                )
            return original(input, *args, use_past_kv_cache=use_past_kv_cache, **kwargs)

        return generate


__all__ = ["BridgeLane", "hf_attention_module", "hf_module", "hf_state_dict", "hf_state_key",
           "kv_cache_matches"]
