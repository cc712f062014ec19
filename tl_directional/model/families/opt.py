"""OPT (``OPTForCausalLM``): pre-LN, learned positions (offset 2), ReLU MLP, biases everywhere,
tied embeddings."""

from ._base import Family, Layout, refuse_if


def legacy_config(c):
    refuse_if(not c.do_layer_norm_before, "opt", "do_layer_norm_before=False (post-LN OPT-350m)")
    refuse_if(c.word_embed_proj_dim != c.hidden_size, "opt", "word_embed_proj_dim != hidden_size")
    return {
        "d_model": c.hidden_size,
        "d_head": c.hidden_size // c.num_attention_heads,
        "n_heads": c.num_attention_heads,
        "d_mlp": c.ffn_dim,
        "n_layers": c.num_hidden_layers,
        "n_ctx": c.max_position_embeddings,
        "eps": 1e-5,
        "d_vocab": c.vocab_size,
        "act_fn": c.activation_function,
        "use_attn_scale": True,
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
    }


FAMILY = Family(
    name="opt",
    hf_class="OPTForCausalLM",
    model_types=("opt",),
    config_class="OPTConfig",
    config_names={"vocab_size": "vocab_size", "max_position_embeddings": "n_ctx", "hidden_size": "d_model",
                  "word_embed_proj_dim": "d_model", "num_hidden_layers": "n_layers",
                  "num_attention_heads": "n_heads", "ffn_dim": "d_mlp"},
    config_fixed=dict(activation_function="relu", do_layer_norm_before=True, dropout=0.0, attention_dropout=0.0,
                      layerdrop=0.0, enable_bias=True, layer_norm_elementwise_affine=True,
                      tie_word_embeddings=True),
    bridge_pattern_after_z=True,  # pattern edits refused on the bridge (see Family)
    layout=Layout(norm_gain="LN", positions="learned"),
    legacy_config=legacy_config,
    legacy_converter="convert_opt_weights",
)
