"""The legacy lane: TransformerLens 2.x / 3.x's ``HookedTransformer`` (and ``HookedEncoder``).

TL-format weights (``W_Q [head, d_model, d_head]``, ``W_O [head, d_head, d_model]``, ``W_in
[d_model, d_mlp]``, ``W_out [d_mlp, d_model]``, GQA's real ``_W_K`` / ``_W_V`` parameters),
the normalised-stream hooks that feed the linears (``ln1.hook_normalized``, before the
``RMSNorm`` gain), the public ``setup()`` route for extra hook points, ``start_at_layer``, the
deep-copy clone and the pad-id fix of ``generate``.

``HookedTransformer`` is never imported here (it does not exist on TL >= 4).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..families.hf import from_pretrained_kwargs
from .base import (
    BlockInput,
    Lane,
    LinearSpec,
    Unembedding,
    deep_copy_model,
    float_copy,
    quiet_transformers,
)
from .legacy_config import check_rope_scaling, legacy_config_dict, legacy_family, legacy_refusal


def _legacy_setup(model) -> None:
    """``HookedRootModule.setup()`` (rebuild ``hook_dict`` / ``mod_dict`` from ``named_modules``),
    keeping the entries that are not module paths (aliases added by ``add_hook_point``)."""
    modules = {n for n, _ in model.named_modules() if n}
    extra_hooks = {n: hp for n, hp in model.hook_dict.items() if n not in modules}
    extra_mods = {n: m for n, m in model.mod_dict.items() if n not in modules}
    model.setup()
    model.hook_dict.update(extra_hooks)
    model.mod_dict.update(extra_mods)


class _NoPadTokenizer:
    """The real tokenizer with ``pad_token_id = -1``, for TL 2.18's mask-from-zeros step."""

    pad_token_id = -1

    def __init__(self, tokenizer):
        object.__setattr__(self, "_tok", tokenizer)

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __setattr__(self, name, value):
        setattr(self._tok, name, value)

    def __call__(self, *args, **kwargs):
        return self._tok(*args, **kwargs)


def _needs_pad_view(model) -> bool:
    tok = getattr(model, "tokenizer", None)
    return tok is not None and getattr(tok, "pad_token_id", None) == 0


def load_legacy_dir(path: Path, *, device: Any, dtype: torch.dtype) -> Any:
    """A ``HookedTransformer`` (``HookedEncoder`` for BERT) from a local directory, without the
    hub: the family's file (:mod:`tl_directional.model.families`) gives the config fields and
    names TransformerLens' weight converter; unprocessed weights."""
    import transformers
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained import weight_conversions as wc

    hf_config = transformers.AutoConfig.from_pretrained(str(path))
    family = legacy_family(hf_config)  # ValueError naming what is missing for other families
    check_rope_scaling(hf_config, path)
    cfg_dict = legacy_config_dict(hf_config, device=device, dtype=dtype)
    cfg_dict["model_name"] = path.name
    cfg = HookedTransformerConfig(**cfg_dict)

    with quiet_transformers():
        hf_model = getattr(transformers, family.hf_class).from_pretrained(
            str(path), **from_pretrained_kwargs(dtype)
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    convert = family.legacy_converter
    if isinstance(convert, str):
        convert = getattr(wc, convert)
    state_dict = convert(hf_model, cfg)
    # Converters return views of the HF tensors; clone so the HF model can be freed.
    state_dict = {k: v.detach().clone() for k, v in state_dict.items()}
    del hf_model

    if family.legacy_encoder:
        from transformer_lens import HookedEncoder

        model = HookedEncoder(cfg, tokenizer=tokenizer, move_to_device=False)
        # strict=False: HookedEncoder has no parameters beyond the converted ones, but TL's own
        # loader uses strict=False too (buffers such as IGNORE are not in the state dict).
        model.load_state_dict(state_dict, strict=False)
    else:
        from transformer_lens import HookedTransformer

        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_and_process_state_dict(
            state_dict,
            fold_ln=False,
            center_writing_weights=False,
            center_unembed=False,
            fold_value_biases=False,
            refactor_factored_attn_matrices=False,
        )
    # print_details=False: TL otherwise prints "Moving model to device" on every load.
    model.to(device, print_details=False)
    return model


class LegacyLane(Lane):
    """TransformerLens 2.x / 3.x: ``HookedTransformer`` (see the module docstring)."""

    __slots__ = ()
    hf_export = False
    hook_kind = "transformer_lens"
    resolves_encoders = False
    requirement = "transformer-lens<4"

    def family_refusal(self, family) -> str:
        return legacy_refusal(family)

    def claims(self, model) -> bool:
        # TransformerLens's hook API, by duck typing (HookedTransformer, HookedEncoder, a
        # HookedRootModule stand-in); lane_of asks the bridge lane first, which has it too
        return hasattr(model, "run_with_hooks")

    def hook_layout_key(self, model) -> tuple:
        return tuple(model.hook_dict)

    def final_norm_weight(self, model) -> Tensor | None:
        # the legacy converters fold Gemma's 1 + weight into ln_final.w already
        return getattr(model.ln_final, "w", None)

    def linear_inputs(self, model, layer: int, hook_names) -> dict[str, tuple[str, Tensor | None]]:
        # W_Q/W_K/W_V read ln1.hook_normalized (times ln1.w for RMSNorm, whose hook fires before
        # the weight), W_O reads attn.hook_z, W_in/W_gate read ln2.hook_normalized, W_out reads
        # mlp.hook_post.
        block = model.blocks[layer]
        b = f"blocks.{layer}"
        out: dict[str, tuple[str, Tensor | None]] = {}

        def norm_input(ln_name: str) -> tuple[str, Tensor | None]:
            ln = getattr(block, ln_name)
            scale = getattr(ln, "w", None) if type(ln).__name__ == "RMSNorm" else None
            return f"{b}.{ln_name}.hook_normalized", scale

        hook, scale = norm_input("ln1")
        for k in ("q", "k", "v"):
            out[f"attn.{k}"] = (hook, scale)
        out["attn.o"] = (f"{b}.attn.hook_z", None)
        if getattr(block, "mlp", None) is not None and hasattr(block, "ln2"):
            hook, scale = norm_input("ln2")
            out["mlp.in"] = (hook, scale)
            if getattr(block.mlp, "W_gate", None) is not None:
                out["mlp.gate"] = (hook, scale)
            out["mlp.out"] = (f"{b}.mlp.hook_post", None)
        return out

    def linear_weights(self, model, layer: int) -> list[LinearSpec]:
        block = model.blocks[layer]
        attn = block.attn
        out: list[LinearSpec] = []

        def qkv_weight(name):
            # GQA: the real parameter is _W_K / _W_V ([n_kv, d_model, d_head]); W_K repeats it.
            return getattr(attn, f"_{name}", None) if isinstance(getattr(attn, f"_{name}", None), torch.nn.Parameter) else getattr(attn, name)

        for k, pname in (("q", "W_Q"), ("k", "W_K"), ("v", "W_V")):
            w = qkv_weight(pname)  # [h, d_model, d_head] -> [h * d_head, d_model]
            h, dm, dh = w.shape

            def get(w=w, h=h, dm=dm, dh=dh):
                return float_copy(w.permute(0, 2, 1).reshape(h * dh, dm))

            def set_(m, w=w, h=h, dm=dm, dh=dh):
                with torch.no_grad():
                    w.copy_(m.reshape(h, dh, dm).permute(0, 2, 1).to(w.dtype))

            out.append((f"attn.{k}", (h * dh, dm), get, set_))
        w_o = attn.W_O  # [h, d_head, d_model] -> [d_model, h * d_head]
        h, dh, dm = w_o.shape

        def get_o(w=w_o, h=h, dh=dh, dm=dm):
            return float_copy(w.reshape(h * dh, dm).T)

        def set_o(m, w=w_o, h=h, dh=dh, dm=dm):
            with torch.no_grad():
                w.copy_(m.T.reshape(h, dh, dm).to(w.dtype))

        out.append(("attn.o", (dm, h * dh), get_o, set_o))
        mlp = getattr(block, "mlp", None)
        if mlp is not None:
            for key, pname in (("mlp.in", "W_in"), ("mlp.gate", "W_gate"), ("mlp.out", "W_out")):
                w = getattr(mlp, pname, None)
                if not isinstance(w, torch.nn.Parameter):
                    continue

                def get(w=w):
                    return float_copy(w.T)

                def set_(m, w=w):
                    with torch.no_grad():
                        w.copy_(m.T.to(w.dtype))

                out.append((key, (w.shape[1], w.shape[0]), get, set_))
        return out

    def output_biases(self, model, layer: int) -> list[Tensor]:
        block = model.blocks[layer]
        return [t for t in (getattr(block.attn, "b_O", None), getattr(getattr(block, "mlp", None), "b_out", None))
                if isinstance(t, torch.nn.Parameter)]

    def boot_by_name(self, name: str, *, device: Any, dtype: torch.dtype):
        from transformer_lens import HookedTransformer

        model = HookedTransformer.from_pretrained_no_processing(name, device=device, dtype=dtype)
        model.eval()
        return model

    def load_dir(self, path, *, device: Any, dtype: torch.dtype):
        return load_legacy_dir(path, device=device, dtype=dtype)

    def clone(self, model):
        return deep_copy_model(model)

    def add_hook_point(self, model, name: str, hook_point) -> None:
        # The public route: where name is <an existing module>.<child> the hook point becomes a
        # real submodule (the SAELens way) and setup() rebuilds hook_dict / mod_dict; a name with
        # no module above it (an alias) is an entry of those two public dicts.
        parent_name, _, child = name.rpartition(".")
        parent = model.mod_dict.get(parent_name) if parent_name else None
        if parent is not None and child.isidentifier() and child not in parent._modules and not hasattr(parent, child):
            parent.add_module(child, hook_point)
            _legacy_setup(model)
        else:
            model.hook_dict[name] = hook_point
            model.mod_dict[name] = hook_point

    def remove_hook_point(self, model, name: str) -> None:
        parent_name, _, child = name.rpartition(".")
        parent = model.mod_dict.get(parent_name) if parent_name else None
        hook_point = model.mod_dict.get(name)
        model.hook_dict.pop(name, None)
        model.mod_dict.pop(name, None)
        if parent is not None and hook_point is not None and parent._modules.get(child) is hook_point:
            delattr(parent, child)  # a real submodule: drop it and rebuild the dicts
            _legacy_setup(model)

    @contextlib.contextmanager
    def from_block(self, model, block_input: BlockInput, repeat: int = 1) -> Iterator:
        # HookedTransformer.forward(resid, start_at_layer=start): no embedding, no earlier block.
        # Shortformer models add positions at every layer, so they take the shared form.
        if getattr(model.cfg, "positional_embedding_type", "") == "shortformer":
            with super().from_block(model, block_input, repeat) as run:
                yield run
            return
        b = block_input
        resid = b.resid.repeat(repeat, 1, 1) if repeat > 1 else b.resid

        def run_legacy(tokens, attention_mask):  # noqa: ARG001 - tokens: same call on both lanes
            mask = None if attention_mask is None else attention_mask.to(resid.device)
            return model(resid, start_at_layer=b.start, attention_mask=mask)

        yield run_legacy

    def unembedding(self, model) -> Unembedding | None:
        if float(getattr(model.cfg, "output_logits_soft_cap", 0.0) or 0.0) > 0.0:
            return None
        last = f"blocks.{int(model.cfg.n_layers) - 1}.hook_resid_post"
        if last not in model.hook_dict or not hasattr(model, "unembed"):
            return None
        ln_final = getattr(model, "ln_final", None)
        return Unembedding(last, (model.unembed,) if ln_final is None else (ln_final, model.unembed))

    def wrap_generate(self, model, original):
        # TL 2.18 builds each step's mask from zeros compared with pad_token_id: with pad id 0
        # every position looks like padding. generate gets a tokenizer view with pad id -1.
        @functools.wraps(original)
        def generate(input="", *args, **kwargs):
            if not _needs_pad_view(model):
                return original(input, *args, **kwargs)
            tok = model.tokenizer
            if isinstance(input, (str, list)):  # tokenise with the real pad id, as generate would
                input = model.to_tokens(input, prepend_bos=kwargs.get("prepend_bos"),
                                        padding_side=kwargs.get("padding_side"))
                if kwargs.get("return_type", "input") == "input":
                    kwargs["return_type"] = "str"
                kwargs.pop("prepend_bos", None)
            model.tokenizer = _NoPadTokenizer(tok)
            try:
                return original(input, *args, **kwargs)
            finally:
                model.tokenizer = tok

        return generate


__all__ = ["LegacyLane", "load_legacy_dir"]
