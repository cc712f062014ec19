"""GPT-J (``GPTJForCausalLM``): one LayerNorm feeding attention and MLP in parallel, rotary on
adjacent pairs over the first ``rotary_dim`` dims of each head, no attention biases, a biased
unembed."""

from ._base import Family, Layout, rotary_fields


def legacy_config(c):
    d_head = c.n_embd // c.n_head
    return {
        "d_model": c.n_embd,
        "d_head": d_head,
        "n_heads": c.n_head,
        "d_mlp": c.n_inner if c.n_inner is not None else 4 * c.n_embd,
        "n_layers": c.n_layer,
        "n_ctx": c.n_positions,
        "eps": c.layer_norm_epsilon,
        "d_vocab": c.vocab_size,
        "act_fn": c.activation_function,
        "use_attn_scale": True,
        "parallel_attn_mlp": True,
        **rotary_fields(c.rotary_dim if c.rotary_dim else d_head, 10000.0, adjacent=True),
        "normalization_type": "LN",
    }


FAMILY = Family(
    name="gptj",
    hf_class="GPTJForCausalLM",
    model_types=("gptj",),
    config_class="GPTJConfig",
    config_names={"vocab_size": "vocab_size", "n_positions": "n_ctx", "n_embd": "d_model",
                  "n_layer": "n_layers", "n_head": "n_heads", "n_inner": "d_mlp"},
    config_fixed=dict(rotary_dim=4, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=False),
    bridge_pattern_after_z=True,  # pattern edits refused on the bridge (see Family)
    layout=Layout(parallel=True, norm_gain="LN", positions="rotary (adjacent pairs)", value_bias=False),
    legacy_config=legacy_config,
    legacy_converter="convert_gptj_weights",
)
