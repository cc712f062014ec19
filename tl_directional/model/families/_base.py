"""The :class:`Family` record every ``architectures/<family>.py`` file fills in, and the helpers
the legacy-lane configs share (HF config -> ``HookedTransformerConfig`` fields)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The usual HF names of the tiny-config shape arguments (Llama, GPT-NeoX, Qwen, ... configs):
#: {HF argument: shape key}. Shape keys: n_layers, d_model, n_heads, n_kv_heads, d_head, d_mlp,
#: n_ctx, vocab_size.
HF_SHAPE: dict[str, str] = {
    "vocab_size": "vocab_size", "hidden_size": "d_model", "intermediate_size": "d_mlp",
    "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
    "max_position_embeddings": "n_ctx",
}
#: ``HF_SHAPE`` plus grouped-query attention and an explicit head width.
HF_SHAPE_GQA: dict[str, str] = {**HF_SHAPE, "num_key_value_heads": "n_kv_heads", "head_dim": "d_head"}


@dataclass(frozen=True)
class Layout:
    """What the block looks like, as far as the parallel/perpendicular split cares.

    Attributes:
        norm: ``"pre-LN"`` (norm before attention and MLP), ``"post-LN"`` (norm after each
            residual add, BERT), ``"sandwich"`` (a norm also after W_O / the MLP, before the add:
            Gemma-2/3) or ``"post-sublayer"`` (only after, OLMo-2).
        parallel: attention and MLP read the same residual (GPT-J, GPT-NeoX, Phi).
        soft_cap: attention-score and/or final-logit tanh soft-capping (Gemma-2).
        moe: the MLP is a mixture of experts (its residual-space update is the MoE block output).
        gqa: fewer key/value heads than query heads in the tiny config.
        norm_gain: ``"LN"`` (LayerNorm, weight and bias), ``"RMS"`` (RMSNorm, gain ``w``) or
            ``"RMS 1+w"`` (Gemma's RMSNorm, gain ``1 + w``).
        positions: ``"learned"``, ``"rotary"``, ``"rotary (partial)"``, ``"rotary (adjacent pairs)"``
            or ``"alibi"``.
        qk_norm: a norm on queries and keys.
        local_attn: sliding-window / local attention in some layers.
        value_bias: the attention has a value bias ``b_V``. ``False`` where it has none but may
            still have an output bias ``b_O`` (GPT-Neo), so that an all-zero ``b_V`` with a
            non-zero ``b_O`` is not read as "value biases were folded into ``b_O``"
            (:func:`tl_directional.model.structure.detect_weight_processing`).
    """

    norm: str = "pre-LN"
    parallel: bool = False
    soft_cap: bool = False
    moe: bool = False
    gqa: bool = False
    norm_gain: str = "RMS"
    positions: str = "rotary"
    qk_norm: bool = False
    local_attn: bool = False
    value_bias: bool = True

    def facts(self) -> list[str]:
        """The layout as short phrases, for docs and error messages."""
        out = [self.norm, self.norm_gain, self.positions]
        out += [name for name, on in [("parallel block", self.parallel), ("soft-capping", self.soft_cap),
                                       ("MoE", self.moe), ("GQA", self.gqa), ("q/k norm", self.qk_norm),
                                       ("local attention", self.local_attn)] if on]
        return out


@dataclass(frozen=True)
class HFModules:
    """Where the split's tensors live in one decoder layer of the family's plain ``transformers``
    model: the third lane's edit sites (:mod:`tl_directional.edit.hf`, METHOD.md sec. 2-4). Module
    names are dotted paths relative to the decoder layer (``attn``, the norms, ``attn_out``,
    ``mlp_out``) or to its attention module (``o_proj``, ``v_source``).

    Attributes:
        label: How the supported-families message names the family (``"GPT-2"``).
        layers: Dotted paths from the causal-LM model to the ``ModuleList`` of decoder layers
            (the first that exists is used).
        attn: The attention module.
        o_proj: The attention output projection; its input is ``z`` (``attn.hook_z``).
        v_source: The module whose output holds the values.
        v_kind: How the values sit in ``v_source``'s output: ``"separate"`` (a value projection),
            ``"gpt2_fused"`` (the last third of GPT-2's ``c_attn``) or ``"neox_fused"`` (the last
            third of each head's slice of GPT-NeoX's ``query_key_value``).
        attn_norm: The pre-attention norm (its input is ``resid_pre``).
        mlp_norm: The pre-MLP norm (its input is ``resid_mid``); None for a parallel block.
        attn_out: The module whose output is the attention update added to the stream.
        mlp_out: The module whose output is the MLP update added to the stream.
        after_o: Modules the attention applies after ``o_proj`` (GPT-2's ``resid_dropout``).
        sandwich: The updates are normalised before the residual add (Gemma-3).
        sequential_mlp_norm: The pre-MLP norm when the config turns a parallel block off
            (GPT-NeoX with ``use_parallel_residual=False``).
    """

    label: str
    layers: tuple[str, ...]
    attn: str
    o_proj: str
    v_source: str
    v_kind: str
    attn_norm: str
    mlp_norm: str | None
    attn_out: str
    mlp_out: str
    after_o: tuple[str, ...] = ()
    sandwich: bool = False
    sequential_mlp_norm: str | None = None


def llama_style_modules(label: str) -> HFModules:
    """The :class:`HFModules` of a Llama-style decoder (``model.layers``, ``self_attn`` with
    ``v_proj`` / ``o_proj``, ``input_layernorm`` / ``post_attention_layernorm``, ``mlp``), which
    Llama, Mistral, Qwen2 and Qwen3 share."""
    return HFModules(label, ("model.layers",), "self_attn", "o_proj", "v_proj", "separate", "input_layernorm",
                     "post_attention_layernorm", "self_attn", "mlp")


@dataclass(frozen=True)
class Family:
    """One model family: everything the package needs to build, load and split it.

    Attributes:
        name: Our family name (``build_tiny_hf_model(name, ...)``).
        hf_class: The ``transformers`` model class (``config.architectures[0]``).
        model_types: ``config.model_type`` values that mean this family when ``architectures`` is
            missing.
        config_class: The ``transformers`` config class of the tiny model.
        config_names: {HF config argument: shape key} for the tiny config.
        config_fixed: Fixed tiny-config settings (dropout 0 everywhere).
        config_extra: ``shape -> extra kwargs`` for settings that depend on the shape or the
            ``transformers`` version (``shape`` also holds ``"transformers_major"``).
        kv_heads: Default key/value heads of the tiny model: ``"all"`` (= n_heads), ``"half"``
            (GQA, two query heads per KV head) or ``"one"`` (multi-query).
        gqa_allowed: Whether ``n_kv_heads`` may differ from ``n_heads``.
        fixed_d_mlp: ``d_model -> d_mlp`` where the architecture fixes the MLP width (BLOOM).
        prepend_bos: TransformerLens' BOS default (what the bridge adapter sets; the legacy lane
            copies it so ``to_tokens`` agrees across lanes).
        tokenizer_specials: Extra special tokens of the tiny tokenizer (BERT's mask token).
        layout: The block's layout facts (:class:`Layout`).
        legacy_config: ``hf_config -> HookedTransformerConfig fields`` (legacy lane), read from the
            local config; ``None`` when the legacy lane refuses the family.
        legacy_converter: Name of TransformerLens' ``weight_conversions`` function, or a callable
            ``(hf_model, cfg) -> state_dict``.
        legacy_refusal: Why the legacy lane refuses the family (with the fix), when
            ``legacy_config`` is ``None``.
        legacy_encoder: The legacy model is a ``HookedEncoder`` (BERT), not a ``HookedTransformer``.
        bridge_refusal: Why the bridge lane refuses it ("" if it loads).
        hf_modules: Where the edit sites live on the plain ``transformers`` model (the third
            lane, :class:`HFModules`); ``None`` when that lane does not edit the family.
        bridge_pattern_after_z: On the TL 4 bridge, ``hook_pattern`` fires after ``hook_z`` (the
            HF attention module computes the output before the bridge sees the pattern), so
            pattern edits (``EffectiveDiagonal``, ``DiagonalRemoval``, ``ValueScale`` with
            ``mode="exclusive"`` or positions) are refused there with a ``RuntimeError`` naming
            the fix; ``ValueScale(mode="full")`` and the residual edits work.
        causal: A decoder (``False`` for BERT's masked LM).
        notes: Anything a user should know (shown in docs/models.md).
        tested: Test-suite notes: which checks the family passes (docs).
    """

    name: str
    hf_class: str
    config_class: str
    config_names: dict[str, str]
    config_fixed: dict[str, Any]
    layout: Layout
    model_types: tuple[str, ...] = ()
    config_extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    kv_heads: str = "all"
    gqa_allowed: bool = False
    fixed_d_mlp: Callable[[int], int] | None = None
    prepend_bos: bool = True
    tokenizer_specials: tuple[str, ...] = ()
    legacy_config: Callable[[Any], dict[str, Any]] | None = None
    legacy_converter: str | Callable[[Any, Any], dict[str, Any]] | None = None
    legacy_refusal: str = ""
    legacy_encoder: bool = False
    bridge_refusal: str = ""
    hf_modules: HFModules | None = None
    causal: bool = True
    bridge_pattern_after_z: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def encoder(self) -> bool:
        """A post-LN bidirectional encoder (BERT): each update is added before a LayerNorm."""
        return self.layout.norm == "post-LN"

    @property
    def sandwich(self) -> bool:
        """Each sub-layer output is normalised before the residual add (Gemma-2/3's sandwich,
        OLMo-2's post-sublayer norm): the update is not linear in ``hook_z``."""
        return self.layout.norm in ("sandwich", "post-sublayer")

    def default_kv_heads(self, n_heads: int) -> int:
        if self.kv_heads == "one":
            return 1
        if self.kv_heads == "half" and n_heads % 2 == 0:
            return n_heads // 2
        return n_heads


# ---------------------------------------------------------------------------------------------
# helpers for legacy_config functions
# ---------------------------------------------------------------------------------------------

#: Rotary tables are ``n_ctx x d_head`` per layer on the legacy lane; real configs declare up to
#: 128k positions. TransformerLens' own configs cap n_ctx the same way (2048 / 8192).
LEGACY_MAX_CTX = 8192


def rope_value(hf_config: Any, key: str, attrs: tuple[str, ...], default: float) -> float:
    """A rotary setting under either transformers spelling: ``rope_parameters[key]`` (5.x),
    else the first of the 4.x attributes ``attrs`` that is set, else ``default``."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params.get(key) is not None:
        return float(params[key])
    for attr in attrs:
        value = getattr(hf_config, attr, None)
        if value is not None:
            return float(value)
    return default


def rope_theta(hf_config: Any, default: float = 10000.0) -> float:
    """Rotary base under either transformers spelling (4.x attribute or 5.x rope_parameters)."""
    return rope_value(hf_config, "rope_theta", ("rope_theta", "rotary_emb_base"), default)


def partial_rotary(hf_config: Any) -> float:
    """Share of each head's dimensions that rotate (1.0 unless the config says otherwise)."""
    return rope_value(hf_config, "partial_rotary_factor", ("rotary_pct", "partial_rotary_factor"), 1.0)


def head_dim(c: Any) -> int:
    d = getattr(c, "head_dim", None)
    return int(d) if d else c.hidden_size // c.num_attention_heads


def shape_fields(c: Any, *, d_head: int, eps: float, act_fn: str, n_ctx: int | None = None,
                 d_mlp: int | None = None) -> dict:
    """The shape fields of a config with the usual HF names (``hidden_size``,
    ``num_attention_heads``, ``intermediate_size``, ``num_hidden_layers``, ...)."""
    return {
        "d_model": c.hidden_size,
        "d_head": d_head,
        "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size if d_mlp is None else d_mlp,
        "n_layers": c.num_hidden_layers,
        "n_ctx": min(int(c.max_position_embeddings if n_ctx is None else n_ctx), LEGACY_MAX_CTX),
        "eps": eps,
        "d_vocab": c.vocab_size,
        "act_fn": act_fn,
    }


def rotary_fields(rotary_dim: int, base: float, *, adjacent: bool = False) -> dict:
    """Rotary positions; HF's Llama-style models rotate halves (``adjacent=False``), GPT-J
    rotates adjacent pairs."""
    return {
        "positional_embedding_type": "rotary",
        "rotary_adjacent_pairs": adjacent,
        "rotary_dim": rotary_dim,
        "rotary_base": base,
    }


def kv_heads_field(c: Any) -> dict:
    """``n_key_value_heads``: TL switches to grouped-query attention iff it is not None."""
    n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return {"n_key_value_heads": n_kv if n_kv != c.num_attention_heads else None}


def rope_type(hf_config: Any) -> str:
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    if not params:
        return "default"
    kind = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    return kind or "default"


def require_default_rope(hf_config: Any, family: str) -> None:
    """Refuse rope scaling on the legacy lane (TL 2.18 builds plain rotary tables only)."""
    kind = rope_type(hf_config)
    if kind != "default":
        raise NotImplementedError(
            f"{family}: rope scaling type {kind!r} is not supported on the legacy lane; "
            "use TransformerLens >= 4 (bridge lane)."
        )


def refuse_if(condition: bool, family: str, what: str) -> None:
    if condition:
        raise NotImplementedError(f"{family}: {what} is not supported on the legacy lane; use "
                                  "TransformerLens >= 4 (bridge lane).")
