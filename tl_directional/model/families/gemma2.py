"""Gemma-2 (``Gemma2ForCausalLM``): sandwich norms (a norm after attention and after the MLP,
before each residual add), RMSNorm gain ``1 + w``, attention-score and final-logit tanh
soft-capping, alternating sliding-window (6 tokens in the tiny model) and full attention, GQA.
The sec. 3 factorization is NaN (sandwich-norm note)."""

from ._base import (
    HF_SHAPE_GQA,
    Family,
    Layout,
    refuse_if,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def config_extra(shape):
    return {
        "query_pre_attn_scalar": shape["d_head"],
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(shape["n_layers"])],
    }


def legacy_config(c):
    """TransformerLens 2.18 hard-codes google/gemma-2-*; the same fields from the local config."""
    require_default_rope(c, "gemma2")
    layer_types = list(getattr(c, "layer_types", None) or [])
    if not layer_types:  # transformers < 4.53: layer 0 slides, then every second layer
        layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c.num_hidden_layers)]
    refuse_if(len(layer_types) != c.num_hidden_layers, "gemma2", "a config without one layer_types entry per layer")
    d_head = c.head_dim
    d = {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_activation),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "use_attn_scale": True,
        "attn_scale": float(c.query_pre_attn_scalar) ** 0.5,
        "n_key_value_heads": c.num_key_value_heads,
        "gated_mlp": True,
        "final_rms": True,
        "use_normalization_before_and_after": True,
        "window_size": int(c.sliding_window),
        "use_local_attn": True,
        "attn_types": ["local" if t == "sliding_attention" else "global" for t in layer_types],
    }
    if getattr(c, "attn_logit_softcapping", None):
        d["attn_scores_soft_cap"] = float(c.attn_logit_softcapping)
    if getattr(c, "final_logit_softcapping", None):
        d["output_logits_soft_cap"] = float(c.final_logit_softcapping)
    return d


FAMILY = Family(
    name="gemma2",
    hf_class="Gemma2ForCausalLM",
    model_types=("gemma2",),
    config_class="Gemma2Config",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                      hidden_act="gelu_pytorch_tanh", sliding_window=6, attn_logit_softcapping=50.0,
                      final_logit_softcapping=30.0, attention_bias=False, attention_dropout=0.0,
                      tie_word_embeddings=True),
    config_extra=config_extra,
    kv_heads="half",
    gqa_allowed=True,
    layout=Layout(norm="sandwich", soft_cap=True, gqa=True, norm_gain="RMS 1+w", local_attn=True),
    legacy_config=legacy_config,
    legacy_converter="convert_gemma_weights",
    notes=("Sandwich norms: the sec. 3 factorization columns are NaN with the sandwich-norm note.",),
)
