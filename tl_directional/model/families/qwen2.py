"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): Llama layout with biases on q, k and v, grouped-query
attention, RMSNorm, rotary, gated SiLU MLP."""

from ._base import (
    HF_SHAPE,
    Family,
    Layout,
    kv_heads_field,
    llama_style_modules,
    refuse_if,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    require_default_rope(c, "qwen2")
    refuse_if(bool(getattr(c, "use_sliding_window", False)), "qwen2", "use_sliding_window=True")
    d_head = c.hidden_size // c.num_attention_heads
    return {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
        **kv_heads_field(c),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "final_rms": True,
        "gated_mlp": True,
    }


FAMILY = Family(
    name="qwen2",
    hf_class="Qwen2ForCausalLM",
    model_types=("qwen2",),
    config_class="Qwen2Config",
    config_names={**HF_SHAPE, "num_key_value_heads": "n_kv_heads"},
    config_fixed=dict(rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", use_sliding_window=False,
                      attention_dropout=0.0, tie_word_embeddings=False),
    kv_heads="half",
    gqa_allowed=True,
    prepend_bos=False,  # as the TL 4 bridge adapter sets it
    layout=Layout(gqa=True),
    legacy_config=legacy_config,
    legacy_converter="convert_qwen2_weights",
    hf_modules=llama_style_modules("Qwen2"),
)
