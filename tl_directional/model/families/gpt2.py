"""GPT-2 (``GPT2LMHeadModel``): pre-LN, learned positions, tied embed/unembed, ``gelu_new``."""

from ._base import Family, HFModules, Layout


def legacy_config(c):
    return {
        "d_model": c.n_embd,
        "d_head": c.n_embd // c.n_head,
        "n_heads": c.n_head,
        # TL's own loader assumes 4 * n_embd; the local config says.
        "d_mlp": c.n_inner if c.n_inner is not None else 4 * c.n_embd,
        "n_layers": c.n_layer,
        "n_ctx": c.n_positions,
        "eps": c.layer_norm_epsilon,
        "d_vocab": c.vocab_size,
        "act_fn": c.activation_function,
        "use_attn_scale": bool(getattr(c, "scale_attn_weights", True)),
        "scale_attn_by_inverse_layer_idx": bool(c.scale_attn_by_inverse_layer_idx),
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
    }


FAMILY = Family(
    name="gpt2",
    hf_class="GPT2LMHeadModel",
    model_types=("gpt2",),
    config_class="GPT2Config",
    config_names={"vocab_size": "vocab_size", "n_positions": "n_ctx", "n_embd": "d_model",
                  "n_layer": "n_layers", "n_head": "n_heads", "n_inner": "d_mlp"},
    config_fixed=dict(activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      summary_first_dropout=0.0, layer_norm_epsilon=1e-5,
                      scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
                      tie_word_embeddings=True),
    layout=Layout(norm_gain="LN", positions="learned"),
    legacy_config=legacy_config,
    legacy_converter="convert_gpt2_weights",
    hf_modules=HFModules("GPT-2", ("transformer.h",), "attn", "c_proj", "c_attn", "gpt2_fused", "ln_1", "ln_2", "attn",
                         "mlp", after_o=("resid_dropout",)),
)
