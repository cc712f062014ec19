"""Phi-1/1.5/2 (``PhiForCausalLM``): one LayerNorm feeding attention and MLP in parallel,
partial rotary (half of each head's dims rotate in the tiny model), biases everywhere, a biased
unembed."""

from ._base import (
    HF_SHAPE,
    Family,
    Layout,
    partial_rotary,
    refuse_if,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    require_default_rope(c, "phi")
    refuse_if(bool(getattr(c, "qk_layernorm", False)), "phi", "qk_layernorm=True")
    d_head = c.hidden_size // c.num_attention_heads
    return {
        **shape_fields(c, d_head=d_head, eps=c.layer_norm_eps, act_fn=c.hidden_act),
        "normalization_type": "LN",
        **rotary_fields(round(partial_rotary(c) * d_head), rope_theta(c)),
        "use_attn_scale": True,
        "parallel_attn_mlp": True,
    }


FAMILY = Family(
    name="phi",
    hf_class="PhiForCausalLM",
    model_types=("phi",),
    config_class="PhiConfig",
    config_names=HF_SHAPE,
    config_fixed=dict(layer_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.5,
                      hidden_act="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                      qk_layernorm=False, tie_word_embeddings=False),
    prepend_bos=False,  # as the TL 4 bridge adapter sets it
    layout=Layout(parallel=True, norm_gain="LN", positions="rotary (partial)"),
    legacy_config=legacy_config,
    legacy_converter="convert_phi_weights",
)
