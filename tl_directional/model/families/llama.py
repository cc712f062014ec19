"""Llama (``LlamaForCausalLM``, Llama-2/3 and SmolLM2): pre-RMSNorm, rotary, gated SiLU MLP,
grouped-query attention (two query heads per KV head in the tiny model, as Llama-3 does)."""

from ._base import (
    HF_SHAPE_GQA,
    Family,
    Layout,
    head_dim,
    kv_heads_field,
    llama_style_modules,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    require_default_rope(c, "llama")
    d_head = head_dim(c)
    return {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
        **kv_heads_field(c),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "final_rms": True,
        "gated_mlp": True,
    }


FAMILY = Family(
    name="llama",
    hf_class="LlamaForCausalLM",
    model_types=("llama",),
    config_class="LlamaConfig",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", attention_bias=False,
                      mlp_bias=False, attention_dropout=0.0, tie_word_embeddings=False),
    kv_heads="half",
    gqa_allowed=True,
    layout=Layout(gqa=True),
    legacy_config=legacy_config,
    legacy_converter="convert_llama_weights",
    hf_modules=llama_style_modules("Llama"),
)
