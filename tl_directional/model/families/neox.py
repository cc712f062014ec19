"""GPT-NeoX / Pythia (``GPTNeoXForCausalLM``): parallel attention + MLP, partial rotary (a
quarter of each head's dims rotate), untied unembed; trained without BOS."""

from ._base import (
    HF_SHAPE,
    Family,
    HFModules,
    Layout,
    partial_rotary,
    refuse_if,
    require_default_rope,
    rope_theta,
    rotary_fields,
    shape_fields,
)


def legacy_config(c):
    require_default_rope(c, "neox")
    d_head = c.hidden_size // c.num_attention_heads
    refuse_if(not bool(getattr(c, "use_parallel_residual", True)), "neox",
              "GPTNeoX with use_parallel_residual=False")
    return {
        **shape_fields(c, d_head=d_head, eps=c.layer_norm_eps, act_fn=c.hidden_act),
        "parallel_attn_mlp": True,
        **rotary_fields(round(partial_rotary(c) * d_head), rope_theta(c)),
        "normalization_type": "LN",
    }


FAMILY = Family(
    name="neox",
    hf_class="GPTNeoXForCausalLM",
    model_types=("gpt_neox",),
    config_class="GPTNeoXConfig",
    config_names=HF_SHAPE,
    config_fixed=dict(rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True, hidden_act="gelu",
                      layer_norm_eps=1e-5, hidden_dropout=0.0, attention_dropout=0.0,
                      classifier_dropout=0.0, tie_word_embeddings=False),
    prepend_bos=False,
    layout=Layout(parallel=True, norm_gain="LN", positions="rotary (partial)"),
    legacy_config=legacy_config,
    legacy_converter="convert_neox_weights",
    hf_modules=HFModules("GPT-NeoX / Pythia", ("gpt_neox.layers",), "attention", "dense", "query_key_value",
                         "neox_fused", "input_layernorm", None, "attention", "mlp",
                         sequential_mlp_norm="post_attention_layernorm"),
)
