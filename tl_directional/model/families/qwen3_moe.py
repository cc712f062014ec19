"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3 attention (q/k norm, GQA) with a sparse
mixture-of-experts MLP (4 experts, top-2, in the tiny model). Bridge lane only: TransformerLens
2.18 has no Qwen3-MoE config or weight converter.

MoE: the MLP unit's update is the MoE block's output (the router-weighted sum of the chosen
experts), split against the MLP's reference like any MLP; there is no single MLP value space,
so nothing per expert is measured or compressed."""

from ._base import HF_SHAPE_GQA, Family, Layout

FAMILY = Family(
    name="qwen3_moe",
    hf_class="Qwen3MoeForCausalLM",
    model_types=("qwen3_moe",),
    config_class="Qwen3MoeConfig",
    config_names={**HF_SHAPE_GQA, "moe_intermediate_size": "d_mlp"},
    config_fixed=dict(rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", use_sliding_window=False,
                      attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False,
                      num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                      norm_topk_prob=True, output_router_logits=False, router_aux_loss_coef=0.0),
    kv_heads="half",
    gqa_allowed=True,
    prepend_bos=False,  # as the TL 4 bridge adapter sets it
    layout=Layout(gqa=True, qk_norm=True, moe=True),
    legacy_refusal=("architecture 'Qwen3MoeForCausalLM' (qwen3_moe) is not supported on the legacy "
                    "lane: TransformerLens 2.18 has no Qwen3-MoE config or weight converter "
                    "(weight_conversions.convert_qwen3_moe_weights is missing). Use TransformerLens "
                    ">= 4 (the bridge lane)."),
)
