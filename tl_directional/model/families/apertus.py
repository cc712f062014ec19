"""Apertus (``ApertusForCausalLM``, Swiss AI): Llama attention with q/k RMSNorm (per head) and
GQA, a non-gated MLP with the trainable xIELU activation, RMSNorm, rotary."""

from ._base import (
    HF_SHAPE,
    Family,
    Layout,
    kv_heads_field,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def config_extra(shape):
    """No rope scaling: transformers 5 keeps its llama3 default unless ``rope_parameters`` says."""
    if shape["transformers_major"] >= 5:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    return {}


def legacy_config(c):
    """TL 2.18's ApertusForCausalLM branch, read from the local config. Unlike that branch, q/k
    norms are always on: HF's Apertus attention always has them (there is no ``qk_norm`` flag)."""
    require_default_rope(c, "apertus")
    d_head = c.hidden_size // c.num_attention_heads
    return {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
        **kv_heads_field(c),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "gated_mlp": False,
        "final_rms": True,
        "use_qk_norm": True,
    }


def _softplus_inv(y):
    import torch

    return y + torch.log(-torch.expm1(-y))


def convert(hf_model, cfg):
    """TL's ``convert_apertus_weights``, with xIELU's alphas matched to what HF computes.

    HF's ``XIELUActivation`` keeps its parameters in bfloat16 (its default dtype), so
    ``softplus(alpha_p)`` and ``beta + softplus(alpha_n)`` are rounded to bfloat16 before they
    touch the float32 input; TL's ``XIELU`` computes them in float32 (a ~0.5% difference in
    the MLP output). Storing the softplus-inverse of HF's rounded values makes TL's float32
    activation compute exactly HF's coefficients."""
    import torch
    import torch.nn.functional as F
    from transformer_lens.pretrained.weight_conversions import convert_apertus_weights

    state_dict = convert_apertus_weights(hf_model, cfg)
    for layer, block in enumerate(hf_model.model.layers):
        act = block.mlp.act_fn
        if not hasattr(act, "alpha_p"):
            continue
        with torch.no_grad():
            alpha_p = F.softplus(act.alpha_p).float().reshape(())  # in HF's dtype, then exact
            alpha_n = (act.beta + F.softplus(act.alpha_n)).float().reshape(())
            beta = act.beta.float().reshape(())
        key = f"blocks.{layer}.mlp.act_fn"
        state_dict[f"{key}.alpha_p"] = _softplus_inv(alpha_p.double()).float()
        state_dict[f"{key}.alpha_n"] = _softplus_inv((alpha_n - beta).double()).float()
        state_dict[f"{key}.beta"] = beta
    return state_dict


FAMILY = Family(
    name="apertus",
    hf_class="ApertusForCausalLM",
    model_types=("apertus",),
    config_class="ApertusConfig",
    config_names={**HF_SHAPE, "num_key_value_heads": "n_kv_heads"},
    config_fixed=dict(rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, hidden_act="xielu",
                      attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False),
    config_extra=config_extra,
    kv_heads="half",
    gqa_allowed=True,
    layout=Layout(gqa=True, qk_norm=True),
    legacy_config=legacy_config,
    legacy_converter=convert,
)
