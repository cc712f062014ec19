"""What a model's blocks are built like, told from the model itself (METHOD.md sec. 2).

Sandwich norms (a norm after each sub-layer, before the residual add) and the weight
processing (centred writing weights, folded value biases, folded LayerNorm) that changes the
geometry; :func:`~tl_directional.model.sites.resolve_sites` records both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .families import BY_ARCH, Family
from .handle import architecture_name, encoder_architecture, is_parallel
from .lanes import lane_of

# Sandwich-norm decoders: each sub-layer's output is normalised (a norm after W_O and after the
# MLP) before the residual add, so the update is not linear in hook_z. Residual-space identities
# still hold (the hooked update is what is added); the value-space factorization does not.
# A registered family says so in its record (Family.sandwich); these are the architectures of
# that kind outside the registry.
SANDWICH_ARCHITECTURES = frozenset({
    "Gemma3ForConditionalGeneration",
    "Olmo3ForCausalLM",
})
# Module names of a post-sub-layer norm: TransformerLens (both lanes) calls them ln1_post /
# ln2_post; HF Gemma-2/3 and OLMo-2 layers call the MLP one post_feedforward_layernorm (HF Llama
# has a post_attention_layernorm too, but it is the pre-MLP norm, so it is not a sign).
_POST_NORM_CHILDREN = ("ln1_post", "ln2_post", "post_feedforward_layernorm")

#: Why the sec. 3 factorization columns are NaN on a sandwich-norm model (Profile.metadata).
SANDWICH_NOTE = (
    "sandwich-norm model: a norm follows W_O (and the MLP) before each residual add, so the "
    "attention update is not linear in hook_z; the value-space factorization of METHOD sec. 3 "
    "(phi, alpha_head, self_term, cross_term, factorization_error_max) is not applicable and "
    "reported as NaN. Residual-space splits, beta, A_tt, gamma, the value-space splits and all "
    "edits are unaffected."
)


@dataclass(frozen=True)
class WeightProcessing:
    """What was done to the weights, as far as can be told from the model."""

    centered_writing_weights: bool
    folded_value_biases: bool
    folded_layer_norm: bool
    flagged_processed: bool | None = None  # the bridge's own record, where it has one

    @property
    def any(self) -> bool:
        return self.centered_writing_weights or self.folded_value_biases or self.folded_layer_norm

    def as_dict(self) -> dict:
        return {
            "centered_writing_weights": self.centered_writing_weights,
            "folded_value_biases": self.folded_value_biases,
            "folded_layer_norm": self.folded_layer_norm,
            "flagged_processed": self.flagged_processed,
        }


@dataclass(frozen=True)
class ModelFacts:
    """What a model's config and family record say about how its blocks are built, read once
    (:func:`model_facts`): the HF ``architecture`` name ("" if unknown), its ``family`` record
    (None outside the registry), and whether it is a post-LN ``encoder``, ``parallel``
    (attention and MLP read one stream) or ``sandwich``-normed."""

    architecture: str
    family: Family | None
    encoder: bool
    parallel: bool
    sandwich: bool


def model_facts(model) -> ModelFacts:
    """The :class:`ModelFacts` of ``model`` (the architecture name is read once)."""
    name = architecture_name(model)
    return ModelFacts(
        architecture=name,
        family=BY_ARCH.get(name),
        encoder=encoder_architecture(name),
        parallel=is_parallel(model),
        sandwich=_is_sandwich(model, name),
    )


def is_sandwich_norm(model) -> bool:
    """Whether ``model`` normalises each sub-layer output before the residual add (Gemma-2/3,
    OLMo-2 style): the legacy ``cfg.use_normalization_before_and_after`` flag, a known
    architecture's family record (``Family.sandwich``),
    a known architecture outside the registry, or a post-norm child module in the first block (the
    bridge has no flag)."""
    return _is_sandwich(model, architecture_name(model))


def _is_sandwich(model, name: str) -> bool:
    if bool(getattr(model.cfg, "use_normalization_before_and_after", False)):
        return True
    family = BY_ARCH.get(name)
    if (family is not None and family.sandwich) or name in SANDWICH_ARCHITECTURES:
        return True
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        return False
    return any(getattr(blocks[0], n, None) is not None for n in _POST_NORM_CHILDREN)


def config_value(model, *names, default=None):
    for n in names:
        v = getattr(model.cfg, n, None)
        if v is not None:
            return v
    return default


def detect_weight_processing(model, facts: ModelFacts | None = None) -> WeightProcessing:
    """Tell from the weights whether writing weights were centred, value biases
    folded, or LayerNorm folded (METHOD.md sec. 2, "Weight processing"). ``facts``: the
    model's :class:`ModelFacts` when the caller has them (read from the model otherwise)."""
    centered = True
    any_b_v_nonzero = False
    any_b_o_nonzero = False
    n_layers = model.cfg.n_layers
    with torch.no_grad():
        for layer in range(n_layers):
            attn = model.blocks[layer].attn
            w_o = attn.W_O
            mean = w_o.float().mean(-1).abs().max()
            if mean > 1e-6 * max(float(w_o.float().abs().max()), 1e-30):
                centered = False
            b_v = getattr(attn, "b_V", None)
            b_o = getattr(attn, "b_O", None)
            if b_v is not None and bool((b_v != 0).any()):
                any_b_v_nonzero = True
            if b_o is not None and bool((b_o != 0).any()):
                any_b_o_nonzero = True
    family = (facts or model_facts(model)).family
    has_value_bias = family is None or family.layout.value_bias  # GPT-Neo: b_O but no b_V
    norm = str(config_value(model, "normalization_type", default="") or "")
    folded_ln = norm.endswith("Pre") or bool(getattr(model.cfg, "layer_norm_folding", False))
    return WeightProcessing(
        centered_writing_weights=centered,
        # value biases folded: none left in b_V while b_O carries them
        folded_value_biases=has_value_bias and (not any_b_v_nonzero) and any_b_o_nonzero,
        folded_layer_norm=folded_ln,
        flagged_processed=lane_of(model).weights_processed_flag(model),
    )
