"""Mixtral (``MixtralForCausalLM``): Mistral attention with a sparse mixture-of-experts MLP
(4 experts, top-2, in the tiny model).

MoE: the MLP unit's update is the MoE block's output (the router-weighted sum of the chosen
experts), split against the MLP's reference like any MLP; there is no single MLP value space,
so nothing per expert is measured or compressed."""

from ._base import (
    HF_SHAPE_GQA,
    Family,
    Layout,
    head_dim,
    kv_heads_field,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    require_default_rope(c, "mixtral")
    d_head = head_dim(c)
    window = getattr(c, "sliding_window", None)
    d = {
        **shape_fields(c, d_head=d_head, eps=c.rms_norm_eps, act_fn=c.hidden_act),
        **kv_heads_field(c),
        "normalization_type": "RMS",
        **rotary_fields(d_head, rope_theta(c)),
        "final_rms": True,
        "gated_mlp": True,
        "num_experts": c.num_local_experts,
        "experts_per_token": c.num_experts_per_tok,
    }
    if window:
        d.update(use_local_attn=True, window_size=int(window), attn_types=["local"] * c.num_hidden_layers)
    return d


FAMILY = Family(
    name="mixtral",
    hf_class="MixtralForCausalLM",
    model_types=("mixtral",),
    config_class="MixtralConfig",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", sliding_window=None,
                      attention_dropout=0.0, tie_word_embeddings=False, num_local_experts=4,
                      num_experts_per_tok=2, router_jitter_noise=0.0, output_router_logits=False,
                      router_aux_loss_coef=0.0),
    kv_heads="half",
    gqa_allowed=True,
    layout=Layout(gqa=True, moe=True),
    legacy_config=legacy_config,
    legacy_converter="convert_mixtral_weights",
)
