"""OLMo-2 (``Olmo2ForCausalLM``): norms after attention and after the MLP only (no pre-norm),
q/k RMSNorm over the whole projection, RMSNorm, rotary, gated SiLU MLP. Bridge lane only:
TransformerLens 2.18 has no OLMo-2 config or weight converter. The sec. 3 factorization is NaN
(the sandwich-norm note: a norm follows W_O)."""

from ._base import HF_SHAPE, Family, Layout

FAMILY = Family(
    name="olmo2",
    hf_class="Olmo2ForCausalLM",
    model_types=("olmo2",),
    config_class="Olmo2Config",
    config_names={**HF_SHAPE, "num_key_value_heads": "n_kv_heads"},
    config_fixed=dict(rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", attention_bias=False,
                      attention_dropout=0.0, tie_word_embeddings=False),
    layout=Layout(norm="post-sublayer", qk_norm=True),
    legacy_refusal=("architecture 'Olmo2ForCausalLM' (olmo2) is not supported on the legacy lane: "
                    "TransformerLens 2.18 has no OLMo-2 config or weight converter. Use "
                    "TransformerLens >= 4 (the bridge lane)."),
    notes=("Norm after W_O: the sec. 3 factorization columns are NaN with the sandwich-norm note.",),
)
