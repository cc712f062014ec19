"""Phi-3 (``Phi3ForCausalLM``): Llama layout with fused qkv and gate/up projections, RMSNorm,
rotary."""

from ._base import (
    HF_SHAPE,
    Family,
    Layout,
    kv_heads_field,
    partial_rotary,
    refuse_if,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    require_default_rope(c, "phi3")
    refuse_if(bool(getattr(c, "sliding_window", None)), "phi3", "sliding_window")
    refuse_if(partial_rotary(c) != 1.0, "phi3", "partial_rotary_factor != 1")
    d_head = c.hidden_size // c.num_attention_heads
    return {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
        **kv_heads_field(c),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "use_attn_scale": True,
        "gated_mlp": True,
        "final_rms": True,
        "parallel_attn_mlp": False,
    }


FAMILY = Family(
    name="phi3",
    hf_class="Phi3ForCausalLM",
    model_types=("phi3",),
    config_class="Phi3Config",
    config_names=HF_SHAPE,
    config_fixed=dict(rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", sliding_window=None,
                      resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, rope_scaling=None,
                      tie_word_embeddings=False),
    layout=Layout(),
    legacy_config=legacy_config,
    legacy_converter="convert_phi3_weights",
)
