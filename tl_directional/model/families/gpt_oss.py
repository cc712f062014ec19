"""GPT-OSS (``GptOssForCausalLM``): attention with learned per-head sinks and alternating
sliding-window (6 tokens in the tiny model) / full layers, GQA, a sparse mixture-of-experts MLP
(4 experts, top-2, in the tiny model) with a clamped SwiGLU, RMSNorm, rotary. Bridge lane only.

MoE: as for Mixtral, the MLP unit's update is the MoE block's output."""

from ._base import HF_SHAPE_GQA, Family, Layout


def config_extra(shape):
    extra = {"layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                             for i in range(shape["n_layers"])]}
    if shape["transformers_major"] >= 5:
        extra["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        extra.update(rope_scaling=None, rope_theta=10000.0)
    return extra


FAMILY = Family(
    name="gpt_oss",
    hf_class="GptOssForCausalLM",
    model_types=("gpt_oss",),
    config_class="GptOssConfig",
    config_names=HF_SHAPE_GQA,
    config_fixed=dict(rms_norm_eps=1e-5, hidden_act="silu", sliding_window=6, attention_dropout=0.0,
                      tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2,
                      router_aux_loss_coef=0.0, output_router_logits=False),
    config_extra=config_extra,
    kv_heads="half",
    gqa_allowed=True,
    layout=Layout(gqa=True, moe=True, local_attn=True),
    legacy_refusal=("architecture 'GptOssForCausalLM' (gpt_oss) is not supported on the legacy lane: "
                    "TransformerLens 2.18's HookedTransformer has no attention sinks (GPT-OSS's "
                    "self_attn.sinks; convert_gpt_oss_weights drops them), no sliding window for "
                    "it and no clamped-SwiGLU experts, so its logits would not be the model's. Use "
                    "TransformerLens >= 4 (the bridge lane)."),
)
