"""Hugging Face config -> ``HookedTransformerConfig`` fields for the legacy lane (TL 2.x / 3.x).

Read from the local config only (TransformerLens' own ``convert_hf_model_config`` resolves
names on the hub); plus the stand-in that TL's BERT weight converter expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .hf import ARCH_TO_FAMILY, DEFAULT_PREPEND_BOS, hf_architecture


def _rope_value(hf_config: Any, key: str, attrs: tuple[str, ...], default: float) -> float:
    """A rotary setting under either transformers spelling: ``rope_parameters[key]`` (5.x),
    else the first of the 4.x attributes ``attrs`` that is set, else ``default``."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params.get(key) is not None:
        return float(params[key])
    for attr in attrs:
        value = getattr(hf_config, attr, None)
        if value is not None:
            return float(value)
    return default


def _rope_theta(hf_config: Any, default: float = 10000.0) -> float:
    """Rotary base under either transformers spelling (4.x attribute or 5.x rope_parameters)."""
    return _rope_value(hf_config, "rope_theta", ("rope_theta", "rotary_emb_base"), default)


def _partial_rotary(hf_config: Any) -> float:
    """Share of each head's dimensions that rotate (1.0 unless the config says otherwise)."""
    return _rope_value(hf_config, "partial_rotary_factor", ("rotary_pct", "partial_rotary_factor"), 1.0)


def _shape_fields(c: Any, *, d_head: int, eps: float, act_fn: str, n_ctx: int | None = None) -> dict:
    """The shape fields of a config with the usual HF names (``hidden_size``,
    ``num_attention_heads``, ``intermediate_size``, ``num_hidden_layers``, ...)."""
    return {
        "d_model": c.hidden_size,
        "d_head": d_head,
        "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings if n_ctx is None else n_ctx,
        "eps": eps,
        "d_vocab": c.vocab_size,
        "act_fn": act_fn,
    }


def _rotary_fields(rotary_dim: int, base: float) -> dict:
    """Rotary positions with TL's half-split (not adjacent-pair) layout, as HF's models use."""
    return {
        "positional_embedding_type": "rotary",
        "rotary_adjacent_pairs": False,
        "rotary_dim": rotary_dim,
        "rotary_base": base,
    }


def check_rope_scaling(hf_config: Any, arg_path: Path) -> None:
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    rope_type = params.get("rope_type", params.get("type", "default")) if params else "default"
    if rope_type not in (None, "default"):
        raise NotImplementedError(
            f"{arg_path}: rope scaling type {rope_type!r} is not supported on the legacy lane; "
            "use TransformerLens >= 4 (bridge lane)."
        )


def legacy_config_dict(hf_config: Any, *, device: Any = "cpu", dtype: Any = torch.float32) -> dict:
    """``HookedTransformerConfig`` fields for a Hugging Face config (legacy lane).

    Mirrors TransformerLens' own ``convert_hf_model_config`` for the four supported families,
    but reads every field from the local config (that function resolves names on the hub, and
    e.g. ignores GPT-2's ``n_inner``).

    Args:
        hf_config: A ``transformers`` config of a ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
            ``GPTNeoXForCausalLM`` or ``BertForMaskedLM``.
        device: Recorded as ``cfg.device``.
        dtype: Recorded as ``cfg.dtype``.

    Returns:
        A dict for ``HookedTransformerConfig(**d)``.
    """
    arch = hf_architecture(hf_config)
    family = ARCH_TO_FAMILY.get(arch)
    c = hf_config
    if family == "gpt2":
        d = {
            "d_model": c.n_embd,
            "d_head": c.n_embd // c.n_head,
            "n_heads": c.n_head,
            "d_mlp": c.n_inner if c.n_inner is not None else 4 * c.n_embd,
            "n_layers": c.n_layer,
            "n_ctx": c.n_positions,
            "eps": c.layer_norm_epsilon,
            "d_vocab": c.vocab_size,
            "act_fn": c.activation_function,
            "use_attn_scale": bool(getattr(c, "scale_attn_weights", True)),
            "scale_attn_by_inverse_layer_idx": bool(c.scale_attn_by_inverse_layer_idx),
            "normalization_type": "LN",
            "positional_embedding_type": "standard",
        }
    elif family == "llama":
        d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        d = {
            **_shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
            # TL switches to grouped-query attention iff this is not None.
            "n_key_value_heads": n_kv if n_kv != c.num_attention_heads else None,
            "normalization_type": "RMS",
            **_rotary_fields(d_head, _rope_theta(c)),
            "final_rms": True,
            "gated_mlp": True,
        }
    elif family == "neox":
        d_head = c.hidden_size // c.num_attention_heads
        d = {
            **_shape_fields(c, d_head=d_head, eps=c.layer_norm_eps, act_fn=c.hidden_act),
            "parallel_attn_mlp": bool(getattr(c, "use_parallel_residual", True)),
            **_rotary_fields(round(_partial_rotary(c) * d_head), _rope_theta(c)),
            "normalization_type": "LN",
        }
        if not d["parallel_attn_mlp"]:
            raise NotImplementedError(
                "GPTNeoX with use_parallel_residual=False is not supported on the legacy lane."
            )
    elif family == "bert":
        d = {
            **_shape_fields(c, d_head=c.hidden_size // c.num_attention_heads, eps=c.layer_norm_eps, act_fn="gelu"),
            "attention_dir": "bidirectional",
        }
    elif family == "gemma3":
        d = _legacy_gemma3_fields(c)
    else:
        raise ValueError(
            f"architecture {arch!r} is not supported on the legacy lane; supported: "
            f"{sorted(ARCH_TO_FAMILY)}. Use TransformerLens >= 4 (bridge lane) for others."
        )
    d.update(
        original_architecture=arch,
        device=str(device),
        dtype=dtype,
        default_prepend_bos=DEFAULT_PREPEND_BOS[family],
        # TL's own loader records the name AutoTokenizer can load; ours is the directory.
        tokenizer_name=None,
    )
    return d


#: Rotary tables are ``n_ctx x d_head`` per layer on the legacy lane; Gemma-3 declares 32k
#: positions, which would cost ~1 GB of tables. TransformerLens' own Gemma-3 configs use 8192.
LEGACY_MAX_CTX = 8192

def _gemma3_rope_bases(c: Any) -> tuple[float, float]:
    """(global, local) rotary bases of a Gemma-3 config under transformers 4.x or 5.x."""
    params = getattr(c, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        full = params["full_attention"].get("rope_theta", 1_000_000.0)
        local = (params.get("sliding_attention") or {}).get("rope_theta", 10_000.0)
        return float(full), float(local)
    return float(getattr(c, "rope_theta", 1_000_000.0)), float(
        getattr(c, "rope_local_base_freq", 10_000.0)
    )


def _legacy_gemma3_fields(c: Any) -> dict:
    """``HookedTransformerConfig`` fields of a ``Gemma3ForCausalLM`` config (legacy lane), read
    from the local config the way TransformerLens 2.18 hard-codes them for google/gemma-3-*."""
    for attr in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(c, attr, None) not in (None, 0):
            raise NotImplementedError(f"Gemma-3 with {attr}={getattr(c, attr)} is not supported.")
    layer_types = list(getattr(c, "layer_types", None) or [])
    if len(layer_types) != c.num_hidden_layers:
        raise NotImplementedError("Gemma-3 config without one layer_types entry per layer.")
    glob, local = _gemma3_rope_bases(c)
    d_head = c.head_dim
    return {
        **_shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_activation,
                        n_ctx=min(int(c.max_position_embeddings), LEGACY_MAX_CTX)),
        "normalization_type": "RMS",
        **_rotary_fields(d_head, glob),
        "rotary_base_local": local,
        "use_attn_scale": True,
        "attn_scale": float(c.query_pre_attn_scalar) ** 0.5,
        "n_key_value_heads": c.num_key_value_heads,
        "gated_mlp": True,
        "final_rms": True,
        "use_normalization_before_and_after": True,
        "use_qk_norm": True,
        "window_size": int(c.sliding_window),
        "use_local_attn": True,
        "attn_types": ["local" if t == "sliding_attention" else "global" for t in layer_types],
    }


class _Namespace:
    """Attribute bag used to hand TL's BERT converter the sub-modules it reads."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def bert_for_converter(hf_model: Any) -> Any:
    """``BertForMaskedLM`` dressed up as the ``BertForPreTraining`` TL's converter expects.

    ``convert_bert_weights`` also reads a pooler and an NSP head, which a masked-LM model does not
    have; zero-valued stand-ins fill those slots (they never touch the MLM logits).
    """
    from transformers.models.bert.modeling_bert import BertPooler

    d_model = hf_model.config.hidden_size
    pooler = getattr(hf_model.bert, "pooler", None)
    if pooler is None:
        pooler = BertPooler(hf_model.config)
        torch.nn.init.zeros_(pooler.dense.weight)
        torch.nn.init.zeros_(pooler.dense.bias)
    nsp = torch.nn.Linear(d_model, 2)
    torch.nn.init.zeros_(nsp.weight)
    torch.nn.init.zeros_(nsp.bias)
    bert = _Namespace(
        embeddings=hf_model.bert.embeddings, encoder=hf_model.bert.encoder, pooler=pooler
    )
    cls = _Namespace(predictions=hf_model.cls.predictions, seq_relationship=nsp)
    return _Namespace(bert=bert, cls=cls)


__all__ = ["LEGACY_MAX_CTX", "bert_for_converter", "check_rope_scaling", "legacy_config_dict"]
