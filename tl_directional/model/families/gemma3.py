"""Gemma-3 text decoder (``Gemma3ForCausalLM``): sandwich norms (a norm after attention and
after the MLP, before each residual add), q/k RMSNorm, RMSNorm gain ``1 + w``, alternating
sliding-window (6 tokens in the tiny model, so short test sequences exercise both) and full
attention, one KV head, tied embeddings. The sec. 3 factorization is NaN (sandwich-norm note)."""

from ._base import HF_SHAPE_GQA, Family, HFModules, Layout, refuse_if, rotary_fields, shape_fields


def config_extra(shape):
    """Layer types (every second layer full attention) and rotary bases, under transformers 5's
    ``rope_parameters`` or 4's two attributes."""
    n_layers = shape["n_layers"]
    extra = {
        "layer_types": ["full_attention" if (i + 1) % 2 == 0 else "sliding_attention" for i in range(n_layers)],
        "query_pre_attn_scalar": shape["d_head"],
    }
    if shape["transformers_major"] >= 5:
        extra["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }
    else:
        extra.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)
    return extra


def rope_bases(c):
    """(global, local) rotary bases of a Gemma-3 config under transformers 4.x or 5.x."""
    params = getattr(c, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        full = params["full_attention"].get("rope_theta", 1_000_000.0)
        local = (params.get("sliding_attention") or {}).get("rope_theta", 10_000.0)
        return float(full), float(local)
    return float(getattr(c, "rope_theta", 1_000_000.0)), float(getattr(c, "rope_local_base_freq", 10_000.0))


def attn_types(c):
    layer_types = list(getattr(c, "layer_types", None) or [])
    refuse_if(len(layer_types) != c.num_hidden_layers, "gemma",
              "a config without one layer_types entry per layer")
    return ["local" if t == "sliding_attention" else "global" for t in layer_types]


def legacy_config(c):
    """Read from the local config the way TransformerLens 2.18 hard-codes google/gemma-3-*."""
    for attr in ("attn_logit_softcapping", "final_logit_softcapping"):
        refuse_if(getattr(c, attr, None) not in (None, 0), "gemma3", f"{attr}={getattr(c, attr, None)}")
    glob, local = rope_bases(c)
    d_head = c.head_dim
    return {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_activation),
        "normalization_type": "RMS",
        **rotary_fields(d_head, glob),
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
        "attn_types": attn_types(c),
    }


FAMILY = Family(
    name="gemma3",
    hf_class="Gemma3ForCausalLM",
    model_types=("gemma3_text",),
    config_class="Gemma3TextConfig",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", sliding_window=6,
                      attn_logit_softcapping=None, final_logit_softcapping=None, attention_bias=False,
                      attention_dropout=0.0, tie_word_embeddings=True),
    config_extra=config_extra,
    kv_heads="one",
    gqa_allowed=True,
    layout=Layout(norm="sandwich", gqa=True, norm_gain="RMS 1+w", qk_norm=True, local_attn=True),
    legacy_config=legacy_config,
    legacy_converter="convert_gemma_weights",
    hf_modules=HFModules("Gemma-3 text", ("model.layers",), "self_attn", "o_proj", "v_proj", "separate",
                         "input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm",
                         "post_feedforward_layernorm", sandwich=True),
    notes=("Sandwich norms: the sec. 3 factorization columns are NaN with the sandwich-norm note.",),
)
