"""Gemma (1) (``GemmaForCausalLM``): pre-RMSNorm with gain ``1 + w``, embeddings scaled by
``sqrt(d_model)``, gated GELU MLP, multi-query attention (one KV head, as Gemma-2B), tied
embeddings."""

from ._base import (
    HF_SHAPE_GQA,
    Family,
    Layout,
    head_dim,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    """TransformerLens 2.18 hard-codes google/gemma-2b / 7b; the same fields from the local config."""
    require_default_rope(c, "gemma")
    d_head = head_dim(c)
    act = getattr(c, "hidden_activation", None) or c.hidden_act
    return {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=act),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "use_attn_scale": True,
        "n_key_value_heads": c.num_key_value_heads,
        "gated_mlp": True,
        "final_rms": True,
    }


FAMILY = Family(
    name="gemma",
    hf_class="GemmaForCausalLM",
    model_types=("gemma",),
    config_class="GemmaConfig",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="gelu_pytorch_tanh",
                      hidden_activation="gelu_pytorch_tanh", attention_bias=False, attention_dropout=0.0,
                      tie_word_embeddings=True),
    kv_heads="one",
    gqa_allowed=True,
    layout=Layout(gqa=True, norm_gain="RMS 1+w"),
    legacy_config=legacy_config,
    legacy_converter="convert_gemma_weights",
)
