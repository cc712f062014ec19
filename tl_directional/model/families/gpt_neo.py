"""GPT-Neo (``GPTNeoForCausalLM``): GPT-2 layout with alternating global and local (windowed;
6 tokens in the tiny model) attention, no attention scaling, learned positions, tied
embeddings."""

from ._base import Family, Layout


def config_extra(shape):
    n = shape["n_layers"]
    return {"attention_types": [[["global", "local"], n // 2]] + ([[["global"], 1]] if n % 2 else [])}


def legacy_config(c):
    return {
        "d_model": c.hidden_size,
        "d_head": c.hidden_size // c.num_heads,
        "n_heads": c.num_heads,
        "d_mlp": c.intermediate_size if c.intermediate_size is not None else 4 * c.hidden_size,
        "n_layers": c.num_layers,
        "n_ctx": c.max_position_embeddings,
        "eps": c.layer_norm_epsilon,
        "d_vocab": c.vocab_size,
        "attn_types": list(c.attention_layers),
        "act_fn": c.activation_function,
        "use_attn_scale": False,
        "use_local_attn": True,
        "window_size": c.window_size,
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
    }


FAMILY = Family(
    name="gpt_neo",
    hf_class="GPTNeoForCausalLM",
    model_types=("gpt_neo",),
    config_class="GPTNeoConfig",
    config_names={"vocab_size": "vocab_size", "max_position_embeddings": "n_ctx", "hidden_size": "d_model",
                  "num_layers": "n_layers", "num_heads": "n_heads", "intermediate_size": "d_mlp"},
    config_fixed=dict(window_size=6, activation_function="gelu_new", resid_dropout=0.0, embed_dropout=0.0,
                      attention_dropout=0.0, classifier_dropout=0.0, layer_norm_epsilon=1e-5,
                      tie_word_embeddings=True),
    config_extra=config_extra,
    bridge_pattern_after_z=True,  # pattern edits refused on the bridge (see Family)
    layout=Layout(norm_gain="LN", positions="learned", local_attn=True, value_bias=False),
    legacy_config=legacy_config,
    legacy_converter="convert_neo_weights",
)
