"""Mixtral (``MixtralForCausalLM``): Mistral attention with a sparse mixture-of-experts MLP
(4 experts, top-2, in the tiny model).

MoE: the MLP unit's update is the MoE block's output (the router-weighted sum of the chosen
experts), split against the MLP's reference like any MLP; there is no single MLP value space,
so nothing per expert is measured or compressed."""

from . import mistral
from ._base import HF_SHAPE_GQA, Family, Layout


def legacy_config(c):
    # Mistral's attention and norms; only the experts are added
    return {**mistral.legacy_config(c, family="mixtral"), "num_experts": c.num_local_experts,
            "experts_per_token": c.num_experts_per_tok}


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
