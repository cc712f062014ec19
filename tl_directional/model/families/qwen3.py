"""Qwen3 dense (``Qwen3ForCausalLM``): Llama layout plus q/k RMSNorm (per head), grouped-query
attention, an explicit ``head_dim``."""

from ._base import (
    HF_SHAPE_GQA,
    Family,
    Layout,
    head_dim,
    kv_heads_field,
    llama_style_modules,
    refuse_if,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    require_default_rope(c, "qwen3")
    refuse_if(bool(getattr(c, "use_sliding_window", False)), "qwen3", "use_sliding_window=True")
    refuse_if(bool(getattr(c, "attention_bias", False)), "qwen3", "attention_bias=True")
    d_head = head_dim(c)
    return {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
        **kv_heads_field(c),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "final_rms": True,
        "gated_mlp": True,
        "use_qk_norm": True,
    }


FAMILY = Family(
    name="qwen3",
    hf_class="Qwen3ForCausalLM",
    model_types=("qwen3",),
    config_class="Qwen3Config",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", use_sliding_window=False,
                      attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False),
    kv_heads="half",
    gqa_allowed=True,
    prepend_bos=False,  # as the TL 4 bridge adapter sets it
    layout=Layout(gqa=True, qk_norm=True),
    legacy_config=legacy_config,
    legacy_converter="convert_qwen3_weights",
    hf_modules=llama_style_modules("Qwen3"),
)
