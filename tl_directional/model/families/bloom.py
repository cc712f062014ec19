"""BLOOM (``BloomForCausalLM``): pre-LN with a LayerNorm right after the embedding, ALiBi
positions, fused per-head qkv, MLP width fixed at 4 * d_model, tied embeddings."""

from ._base import Family, Layout, refuse_if


def legacy_config(c):
    refuse_if(bool(c.apply_residual_connection_post_layernorm), "bloom",
              "apply_residual_connection_post_layernorm=True")
    return {
        "d_model": c.hidden_size,
        "d_head": c.hidden_size // c.n_head,
        "n_heads": c.n_head,
        "d_mlp": 4 * c.hidden_size,
        "n_layers": c.n_layer,
        "n_ctx": 2048,  # ALiBi has no position table; TL's own cap
        "d_vocab": c.vocab_size,
        "act_fn": "gelu_fast",
        "eps": c.layer_norm_epsilon,
        "normalization_type": "LN",
        "post_embedding_ln": True,
        "positional_embedding_type": "alibi",
    }


FAMILY = Family(
    name="bloom",
    hf_class="BloomForCausalLM",
    model_types=("bloom",),
    config_class="BloomConfig",
    config_names={"vocab_size": "vocab_size", "hidden_size": "d_model", "n_layer": "n_layers",
                  "n_head": "n_heads"},
    config_fixed=dict(hidden_dropout=0.0, attention_dropout=0.0, layer_norm_epsilon=1e-5,
                      apply_residual_connection_post_layernorm=False, slow_but_exact=False,
                      tie_word_embeddings=True),
    fixed_d_mlp=lambda d_model: 4 * d_model,
    prepend_bos=False,  # as the TL 4 bridge adapter sets it
    layout=Layout(norm_gain="LN", positions="alibi"),
    legacy_config=legacy_config,
    legacy_converter="convert_bloom_weights",
)
