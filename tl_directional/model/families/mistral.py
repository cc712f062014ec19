"""Mistral (``MistralForCausalLM``): Llama layout with grouped-query attention and an optional
sliding window (off in the tiny model, as in Mistral-7B v0.2+)."""

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


def legacy_config(c, family: str = "mistral"):
    require_default_rope(c, family)
    d_head = head_dim(c)
    window = getattr(c, "sliding_window", None)
    d = {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
        **kv_heads_field(c),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "final_rms": True,
        "gated_mlp": True,
    }
    if window:
        d.update(use_local_attn=True, window_size=int(window), attn_types=["local"] * c.num_hidden_layers)
    return d


FAMILY = Family(
    name="mistral",
    hf_class="MistralForCausalLM",
    model_types=("mistral",),
    config_class="MistralConfig",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", sliding_window=None,
                      attention_dropout=0.0, tie_word_embeddings=False),
    kv_heads="half",
    gqa_allowed=True,
    layout=Layout(gqa=True),
    legacy_config=legacy_config,
    legacy_converter="convert_mistral_weights",
    hf_modules=llama_style_modules("Mistral"),
)
