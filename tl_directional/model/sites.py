"""Which update, against which reference: hook-site resolution (METHOD.md sec. 2-3).

This is the one module that knows TransformerLens hook names. Everything else
asks :func:`resolve_sites` for a :class:`ModelSites` and uses its names.

Sites are resolved once per model: :func:`resolve_sites` keeps its result per model instance
and returns the same :class:`ModelSites` until something that matters changes (the model's
hook point names, its weights, the config fields it reads; see :func:`resolution_key`), so a
workflow's edits, views and measurements share one resolution.

Works by duck typing on the hook API (``run_with_hooks``, ``hooks``,
``hook_dict``, ``cfg``) for both the TL 4 ``TransformerBridge`` and the legacy
``HookedTransformer`` (TL 2.x / 3.x); ``HookedTransformer`` is never imported.
Names in outputs are the familiar TL names (``blocks.3.hook_resid_pre``),
never the bridge's internal aliases (``blocks.3.hook_in``).
"""

from __future__ import annotations

import numbers
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..core.components import RESIDUAL_COMPONENTS
from ..core.errors import TLDirectionalError
from ..core.geometry import dtype_tolerance

# Lane internals live in the lanes (lane_of / architecture_name are re-exported here).
from .adapter import architecture_name, capture, hook_state, is_encoder, is_parallel, lane_of
from .families import BY_ARCH

COMPONENTS = RESIDUAL_COMPONENTS  # the residual components, in their order (one home: components.py)

SEQUENTIAL = "sequential"  # pre-LN, attn then MLP (GPT-2, Llama, Qwen, Mistral)
PARALLEL = "parallel"  # pre-LN, attn and MLP read the same stream (GPT-J, Pythia/NeoX)
POST_LN = "post_ln"  # BERT: each update is added before a LayerNorm

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


class WeightProcessingWarning(UserWarning):
    """The model's weights were processed (centred / folded): geometry differs from raw weights."""


class SiteResolutionError(TLDirectionalError, ValueError):
    """The model's hook layout or additive identity is not understood; no numbers are produced."""


@dataclass(frozen=True)
class UnitSite:
    """One residual-space unit (attn, mlp or block) of one layer.

    ``update_hook`` is where the update is read and edited (for ``block`` it is
    ``hook_resid_post`` and the update is ``resid_post - resid_pre``);
    ``reference_hook`` is the stream the update is added to; ``sum_hook`` is
    where ``reference + update`` (+ the parallel sibling for parallel blocks)
    must appear, checked by :func:`verify_sites`.
    """

    layer: int
    component: str
    update_hook: str
    reference_hook: str
    sum_hook: str
    update_is_difference: bool = False  # block: update = update_hook - reference_hook

    @property
    def update_name(self) -> str:
        """Familiar name of the update for tables (block updates are differences)."""
        if self.update_is_difference:
            return f"{self.update_hook} - {self.reference_hook}"
        return self.update_hook


@dataclass(frozen=True)
class ValueSite:
    """Value-space hooks of one attention layer (METHOD.md sec. 3)."""

    layer: int
    v_hook: str  # [batch, pos, n_kv_heads, d_head]
    pattern_hook: str  # [batch, n_heads, query, key]
    z_hook: str  # [batch, pos, n_heads, d_head]
    resid_hook: str  # x_t, the residual reference of the attention update


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
class ModelSites:
    """Resolved hook sites of one model. Get one with :func:`resolve_sites`.

    Frozen: fields cannot be reassigned (the per-layer lists are built once by
    :func:`resolve_sites` and only read by callers).
    """

    model_name: str
    lane: str  # "bridge" | "legacy"
    arch: str  # SEQUENTIAL | PARALLEL | POST_LN
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    causal: bool
    factorization_applicable: bool  # False for sandwich-norm models (norm after W_O)
    weights: WeightProcessing
    units: dict[str, list[UnitSite]] = field(default_factory=dict)
    value: list[ValueSite] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(c for c in COMPONENTS if c in self.units)

    def unit(self, component: str, layer: int) -> UnitSite:
        """The :class:`UnitSite` of ``component`` at ``layer`` (clear errors otherwise)."""
        check_component(component, self)
        return self.units[component][check_layer(layer, self.n_layers, "layer")]

    def kv_head(self, head: int) -> int:
        """GQA mapping ``kv(h) = h // (n_heads // n_kv_heads)`` (see :func:`kv_head_index`)."""
        return kv_head_index(head, self.n_heads, self.n_kv_heads)

    def expand_kv(self, v: Float[Tensor, "batch pos n_kv_heads d_head"]) -> Float[Tensor, "batch pos n_heads d_head"]:
        """One value per query head (see :func:`expand_kv_heads`)."""
        return expand_kv_heads(v, self.n_heads)

    def resid_post_hook(self, layer: int) -> str:
        """The hook point of the residual stream leaving block ``layer`` (``blocks.L.hook_resid_post``;
        on post-LN models it exists but is not an update's sum)."""
        return f"blocks.{check_layer(layer, self.n_layers, 'layer')}.hook_resid_post"

    def value_alias_hook(self, layer: int, child: str) -> str:
        """The name ``transformer_lens.patching`` builds with ``get_act_name`` for a value-space
        child hook point ``child`` of ``hook_z`` (``"z.hook_par"`` -> ``blocks.L.hook_z.hook_par``,
        not ``blocks.L.attn.hook_z.hook_par``)."""
        return f"blocks.{check_layer(layer, self.n_layers, 'layer')}.hook_z.{child}"


def kv_head_index(head: int, n_heads: int, n_kv_heads: int) -> int:
    """GQA: the key/value head that query head ``head`` reads, ``h // (n_heads // n_kv_heads)``
    (consecutive query heads share one KV head, as in HF and TransformerLens)."""
    return head // (n_heads // n_kv_heads)


def expand_kv_heads(v: Float[Tensor, "*lead n_kv_heads d_head"], n_heads: int) -> Float[Tensor, "*lead n_heads d_head"]:
    """``[..., n_kv_heads, d_head]`` -> ``[..., n_heads, d_head]`` (``[batch, pos, ...]`` from
    ``hook_v``, or ``[tokens, ...]`` after a token selection): query head ``h`` gets KV head
    :func:`kv_head_index` ``(h)``. Returns ``v`` itself when there is no grouping."""
    group = n_heads // v.shape[-2]
    return v.repeat_interleave(group, dim=-2) if group > 1 else v


def is_sandwich_norm(model) -> bool:
    """Whether ``model`` normalises each sub-layer output before the residual add (Gemma-2/3,
    OLMo-2 style): the legacy ``cfg.use_normalization_before_and_after`` flag, a known
    architecture's family record (``Family.sandwich``),
    a known architecture outside the registry, or a post-norm child module in the first block (the
    bridge has no flag)."""
    if bool(getattr(model.cfg, "use_normalization_before_and_after", False)):
        return True
    name = architecture_name(model)
    family = BY_ARCH.get(name)
    if (family is not None and family.sandwich) or name in SANDWICH_ARCHITECTURES:
        return True
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        return False
    return any(getattr(blocks[0], n, None) is not None for n in _POST_NORM_CHILDREN)


def check_hook_api(model, argument: str = "model") -> None:
    """Raise a TypeError unless ``model`` has TransformerLens's hook API."""
    missing = [a for a in ("run_with_hooks", "hooks", "hook_dict", "cfg") if not hasattr(model, a)]
    if missing:
        raise TypeError(
            f"{argument} must be a TransformerLens model (TransformerBridge or HookedTransformer); "
            f"{type(model).__name__} lacks {', '.join(missing)}. Load one with "
            "tl_directional.load_model(...) or TransformerBridge.boot_transformers(...)."
        )


def check_component(component: str, sites: ModelSites | None = None) -> None:
    if component not in COMPONENTS:
        raise ValueError(
            f"component must be one of {COMPONENTS}, got {component!r}"
        )
    if sites is not None and component not in sites.units:
        raise ValueError(
            f"component={component!r} is not defined for this {sites.arch} model "
            f"({sites.model_name}); available: {sites.components}. "
            + ("Post-LN blocks add each update before a LayerNorm, so there is no single "
               "block update; use 'attn' and 'mlp'." if sites.arch == POST_LN else "")
        )


def normalize_index(index, size: int, argument: str, what: str = "layer", *, in_list: bool = False) -> int:
    """One layer / head index in ``-size .. size - 1`` -> ``0 .. size - 1`` (negative
    indices count from the end, as in Python and TransformerLens: ``-1`` is the last)."""
    if isinstance(index, Tensor) and index.numel() == 1 and not index.is_floating_point():
        index = int(index)
    if not isinstance(index, numbers.Integral) or isinstance(index, bool):
        raise TypeError(f"{argument} must hold ints, got {index!r} ({type(index).__name__})")
    index = int(index)
    if not -size <= index < size:
        if in_list:  # "layers has layer 7" / "heads has 9"
            shown = f"{argument} has {what} {index}," if what == "layer" else f"{argument} has {index},"
        else:
            shown = f"{argument}={index} is"
        raise ValueError(
            f"{shown} out of range for a model with {size} {what}s "
            f"(valid: 0..{size - 1}, or -{size}..-1 counting from the end)"
        )
    return index % size


def check_layer(layer: int, n_layers: int, argument: str = "layers") -> int:
    """Validate one layer index; returns it in ``0 .. n_layers - 1`` (see :func:`normalize_index`)."""
    return normalize_index(layer, n_layers, argument, "layer", in_list=argument.endswith("s"))


def _index_list(values, size: int, argument: str, what: str) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, int) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, Tensor):
        values = values.reshape(-1).tolist()
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{argument} must be None, an int or a sequence of ints, got the string {values!r}")
    try:
        values = list(values)
    except TypeError:
        raise TypeError(
            f"{argument} must be None, an int or a sequence of ints, got {type(values).__name__}"
        ) from None
    if not values:
        raise ValueError(f"{argument} is empty; pass None for all {what}s")
    return sorted({normalize_index(v, size, argument, what, in_list=True) for v in values})


def normalize_layers(layers, n_layers: int, argument: str = "layers") -> list[int]:
    """``None`` -> all layers; an int, range or sequence of ints (negative ones count from
    the end) -> sorted unique list in ``0 .. n_layers - 1``."""
    out = _index_list(layers, n_layers, argument, "layer")
    return list(range(n_layers)) if out is None else out


def normalize_heads(heads, n_heads: int, argument: str = "heads") -> list[int] | None:
    """``None`` -> None (all heads); an int or sequence of query-head indices (negative ones
    count from the end) -> sorted unique list in ``0 .. n_heads - 1``."""
    return _index_list(heads, n_heads, argument, "head")


def _cfg(model, *names, default=None):
    for n in names:
        v = getattr(model.cfg, n, None)
        if v is not None:
            return v
    return default


def detect_weight_processing(model) -> WeightProcessing:
    """Tell from the weights whether writing weights were centred, value biases
    folded, or LayerNorm folded (METHOD.md sec. 2, "Weight processing")."""
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
    family = BY_ARCH.get(architecture_name(model))
    has_value_bias = family is None or family.layout.value_bias  # GPT-Neo: b_O but no b_V
    norm = str(_cfg(model, "normalization_type", default="") or "")
    folded_ln = norm.endswith("Pre") or bool(getattr(model.cfg, "layer_norm_folding", False))
    return WeightProcessing(
        centered_writing_weights=centered,
        # value biases folded: none left in b_V while b_O carries them
        folded_value_biases=has_value_bias and (not any_b_v_nonzero) and any_b_o_nonzero,
        folded_layer_norm=folded_ln,
        flagged_processed=lane_of(model).weights_processed_flag(model),
    )


def _require_hooks(model, names: list[str]) -> None:
    hook_dict = model.hook_dict
    missing = [n for n in names if n not in hook_dict]
    if missing:
        raise SiteResolutionError(
            f"model {type(model).__name__} has no hook point(s) {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''}. tl_directional needs the standard "
            "TransformerLens block hooks (hook_resid_pre, hook_attn_out, hook_mlp_out, "
            "hook_resid_post, attn.hook_v/hook_pattern/hook_z). On a TransformerBridge, boot "
            "with boot_transformers/boot_native; on TL 2/3 use a HookedTransformer."
        )


#: The config fields :func:`resolve_sites` reads (part of :func:`resolution_key`).
_CFG_FIELDS = ("n_layers", "n_heads", "n_key_value_heads", "d_model", "d_head", "model_name",
               "original_architecture", "architecture", "parallel_attn_mlp", "normalization_type",
               "layer_norm_folding", "use_normalization_before_and_after")


def resolution_key(model) -> tuple:
    """What the sites of ``model`` depend on, cheaply: the lane, the config fields read, the
    hook point names (a split hook point added or removed changes them) and each parameter's
    storage and in-place version counter (a weight written, e.g. by weight processing or a
    compressor, changes it, so :class:`WeightProcessing` is detected again).

    :func:`resolve_sites` reuses its previous result for as long as this key is unchanged."""
    lane = lane_of(model)
    cfg = tuple(repr(getattr(model.cfg, n, None)) for n in _CFG_FIELDS)
    params = tuple((p.data_ptr(), p._version) for p in model.parameters())
    return (lane.name, cfg, lane.hook_layout_key(model), params, lane.weights_processed_flag(model))


#: model -> (resolution_key, ModelSites) of its last resolution.
_RESOLVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def resolve_sites(model, *, warn: bool = True) -> ModelSites:
    """Name, per layer, each update hook with its reference hook, and the value-space hooks.

    Resolved once per model: a later call on the same instance returns the same
    :class:`ModelSites` (read it, do not change it) while :func:`resolution_key` is unchanged,
    and resolves again once the hook point names, the weights or the config fields it reads
    have changed.

    Args:
        model: a ``TransformerBridge`` or ``HookedTransformer``.
        warn: emit a :class:`WeightProcessingWarning` when weights look processed (on every
            call, also when the sites come from the cache).

    Raises:
        TypeError: ``model`` has no TransformerLens hook API.
        SiteResolutionError: a needed hook point is missing.
    """
    check_hook_api(model)
    try:
        key = resolution_key(model)
        known = _RESOLVED.get(model)
    except (TypeError, RuntimeError, AttributeError):  # not weak-referenceable, no parameters()
        # (a duck-typed stand-in) or inference tensors: no cache
        key = known = None
    if known is not None and known[0] == key:
        sites = known[1]
    else:
        sites = _resolve(model)
        if key is not None:
            try:
                _RESOLVED[model] = (key, sites)
            except TypeError:  # pragma: no cover - checked above
                pass
    weights = sites.weights
    if warn and weights.any:
        warnings.warn(
            f"{sites.model_name}: weights look processed ({weights.as_dict()}). Centering writing "
            "weights or folding value biases changes every projection; the canonical form is "
            "unprocessed (TransformerBridge.boot_transformers without enable_compatibility_mode, "
            "or HookedTransformer.from_pretrained_no_processing).",
            WeightProcessingWarning,
            stacklevel=2,
        )
    return sites


def _resolve(model) -> ModelSites:
    """One real resolution (see :func:`resolve_sites`, which caches it)."""
    cfg = model.cfg
    lane = lane_of(model)
    n_layers = int(cfg.n_layers)
    n_heads = int(cfg.n_heads)
    n_kv = int(_cfg(model, "n_key_value_heads", default=n_heads) or n_heads)
    if n_heads % n_kv:
        raise SiteResolutionError(f"n_heads={n_heads} is not a multiple of n_key_value_heads={n_kv}")
    is_post_ln = is_encoder(model)
    if is_post_ln and not lane.resolves_encoders:
        raise SiteResolutionError(
            "post-LN encoders are supported on the TL 4 TransformerBridge only "
            "(boot_transformers); the legacy HookedEncoder is not a supported lane."
        )
    if is_post_ln:
        arch = POST_LN
    elif is_parallel(model):
        arch = PARALLEL
    else:
        arch = SEQUENTIAL
    sandwich = is_sandwich_norm(model)
    weights = detect_weight_processing(model)
    model_name = str(_cfg(model, "model_name", default=type(model).__name__))
    units: dict[str, list[UnitSite]] = {"attn": [], "mlp": []}
    if arch != POST_LN:
        units["block"] = []
    value: list[ValueSite] = []
    needed: list[str] = []
    for L in range(n_layers):
        b = f"blocks.{L}"
        pre, mid, post = f"{b}.hook_resid_pre", f"{b}.hook_resid_mid", f"{b}.hook_resid_post"
        if arch == SEQUENTIAL:
            units["attn"].append(UnitSite(L, "attn", f"{b}.hook_attn_out", pre, mid))
            units["mlp"].append(UnitSite(L, "mlp", f"{b}.hook_mlp_out", mid, post))
        elif arch == PARALLEL:
            units["attn"].append(UnitSite(L, "attn", f"{b}.hook_attn_out", pre, post))
            units["mlp"].append(UnitSite(L, "mlp", f"{b}.hook_mlp_out", pre, post))
        else:
            # Bridge BERT: hook_attn_out is ln1.hook_out (normalised stream), so read the
            # attention update at attn.o.hook_out and the MLP's at mlp.hook_out.
            units["attn"].append(UnitSite(L, "attn", f"{b}.attn.o.hook_out", pre, f"{b}.ln1.hook_in"))
            units["mlp"].append(UnitSite(L, "mlp", f"{b}.mlp.hook_out", f"{b}.ln1.hook_out", f"{b}.ln2.hook_in"))
        if arch != POST_LN:
            units["block"].append(UnitSite(L, "block", post, pre, post, update_is_difference=True))
        vs = ValueSite(L, f"{b}.attn.hook_v", f"{b}.attn.hook_pattern", f"{b}.attn.hook_z", pre)
        value.append(vs)
        for comp in units:
            u = units[comp][L]
            needed += [u.update_hook, u.reference_hook, u.sum_hook]
        needed += [vs.v_hook, vs.pattern_hook, vs.z_hook]
    _require_hooks(model, sorted(set(needed)))
    notes: list[str] = []
    if arch == POST_LN:
        notes.append(
            "post-LN model: each update is added before a LayerNorm (attn at ln1.hook_in, "
            "MLP at ln2.hook_in); there is no block update. Attention is bidirectional."
        )
    if sandwich:
        notes.append(SANDWICH_NOTE)
    sites = ModelSites(
        model_name=model_name,
        lane=lane.name,
        arch=arch,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_model=int(cfg.d_model),
        d_head=int(cfg.d_head),
        causal=not is_post_ln,
        factorization_applicable=not sandwich,
        weights=weights,
        units=units,
        value=value,
        notes=notes,
    )
    return sites


def final_norm_weight(model) -> Tensor | None:
    """Effective gain of the final norm (``ln_final``), ``[d_model]``, or None without a gain.

    HF's ``Gemma*RMSNorm`` computes ``x * (1 + weight)``: on the bridge (which wraps the HF
    module and exposes its raw ``weight`` as ``w``) the gain is ``1 + weight``; the legacy
    converters fold the 1 into ``ln_final.w`` already.
    """
    return lane_of(model).final_norm_weight(model)


def attention_output_weights(model, layer: int) -> tuple[Float[Tensor, "n_heads d_head d_model"], Float[Tensor, " d_model"] | None]:
    """``(W_O, b_O)`` of one layer; ``b_O`` is None when the model has no output bias."""
    attn = model.blocks[layer].attn
    b_o = getattr(attn, "b_O", None)
    return attn.W_O, b_o


@dataclass(frozen=True)
class LinearInput:
    """Where the input of one attention / MLP linear layer can be read (compression calibration).

    ``key`` names the linear within its block (``"attn.q"``, ``"attn.k"``, ``"attn.v"``,
    ``"attn.o"``, ``"mlp.in"``, ``"mlp.gate"``, ``"mlp.out"``); ``hook`` is the hook point whose
    activation, with heads flattened when it is ``[batch, pos, head, d_head]`` and multiplied by
    ``scale`` along the last axis when ``scale`` is not None, is that linear's input.
    """

    key: str
    hook: str
    scale: Tensor | None = None


def linear_input_hooks(model, layer: int) -> dict[str, LinearInput]:
    """``{key: LinearInput}`` for the attention and MLP linears of one block.

    Bridge (TL 4): each wrapped linear has its own ``blocks.L.<attn|mlp>.<name>.hook_in``; the
    combined ``qkv`` of GPT-2 / NeoX is skipped (its split ``q``, ``k``, ``v`` are what forward
    reads). Legacy (``HookedTransformer``): ``W_Q/W_K/W_V`` read ``ln1.hook_normalized``
    (times ``ln1.w`` for RMSNorm, whose hook fires before the weight), ``W_O`` reads
    ``attn.hook_z``, ``W_in``/``W_gate`` read ``ln2.hook_normalized``, ``W_out`` reads
    ``mlp.hook_post``.
    """
    layer = check_layer(layer, int(model.cfg.n_layers), "layer")
    hook_dict = model.hook_dict
    out = {key: LinearInput(key, hook, scale)
           for key, (hook, scale) in lane_of(model).linear_inputs(model, layer, hook_dict).items()}
    missing = [li.hook for li in out.values() if li.hook not in hook_dict]
    if missing:
        raise SiteResolutionError(f"layer {layer}: no hook point(s) {sorted(set(missing))} for linear inputs")
    return out


def mlp_branch(model, layer: int):
    """A callable mapping a sequential pre-LN block's MLP reference stream (``resid_mid``)
    to its MLP update (``ln2`` then ``mlp``), or None where that is not the structure
    (parallel / post-LN blocks, sandwich norms). Callers should still check it against the
    block's own ``hook_mlp_out`` once before trusting it."""
    if is_encoder(model) or is_parallel(model):
        return None
    if is_sandwich_norm(model):
        return None
    block = model.blocks[layer]
    ln2, mlp = getattr(block, "ln2", None), getattr(block, "mlp", None)
    if ln2 is None or mlp is None or getattr(block, "ln2_post", None) is not None:
        return None
    return lambda x: mlp(ln2(x))


def verify_sites(
    model,
    sites: ModelSites,
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> dict[str, float]:
    """Check ``next == reference + update`` on real activations, for every layer.

    Runs one forward on ``tokens`` with read-only hooks. Returns the worst relative
    error per unit (``"attn.3"``, ...). Raises :class:`SiteResolutionError`, naming the
    layer, the hooks and the mismatch, when an identity fails.

    The identity is a property of the hook wiring, not of the weights or the inputs, so a
    model that passed keeps its result and later calls skip the forward (a notebook
    profiling one sentence at a time pays it once, not per call), for as long as the model
    instance, its hook layout, its train/eval mode and the hooks attached to those hook
    points stay the same: adding or removing a hook there (which can break the identity)
    makes the next call verify again.
    """
    names = set()
    for comp in sites.components:
        for u in sites.units[comp]:
            names |= {u.update_hook, u.reference_hook, u.sum_hook}
    layout = (sites.lane, sites.arch, bool(getattr(model, "training", False)),
           tuple((u.update_hook, u.reference_hook, u.sum_hook)
                 for comp in sites.components for u in sites.units[comp]),
           hook_state(model, names))
    try:
        known = _VERIFIED.get(model)
    except TypeError:  # not weak-referenceable: verify every time
        known = None
    if known is not None and known[0] == layout:
        return dict(known[1])
    _, store = capture(model, tokens, names, attention_mask=attention_mask)
    errors: dict[str, float] = {}
    for L in range(sites.n_layers):
        checks: list[tuple[str, Tensor, Tensor, str]] = []
        if sites.arch == PARALLEL:
            a, m = sites.units["attn"][L], sites.units["mlp"][L]
            lhs = store[a.sum_hook]
            rhs = store[a.reference_hook] + store[a.update_hook] + store[m.update_hook]
            desc = f"{a.sum_hook} == {a.reference_hook} + {a.update_hook} + {m.update_hook}"
            checks.append((f"attn.{L}", lhs, rhs, desc))
            checks.append((f"mlp.{L}", lhs, rhs, desc))
        else:
            for comp in ("attn", "mlp"):
                u = sites.units[comp][L]
                lhs = store[u.sum_hook]
                rhs = store[u.reference_hook] + store[u.update_hook]
                checks.append((f"{comp}.{L}", lhs, rhs, f"{u.sum_hook} == {u.reference_hook} + {u.update_hook}"))
        for key, lhs, rhs, desc in checks:
            if lhs.shape != rhs.shape:
                raise SiteResolutionError(
                    f"layer {L}: additive identity {desc} has mismatched shapes "
                    f"{tuple(lhs.shape)} vs {tuple(rhs.shape)}; this architecture is not understood."
                )
            scale = float(lhs.abs().max()) + 1.0
            err = float((lhs.double() - rhs.double()).abs().max()) / scale
            errors[key] = err
            tol = dtype_tolerance(lhs.dtype)
            if not err <= tol:
                raise SiteResolutionError(
                    f"layer {L}: additive identity {desc} fails (max relative error {err:.3g} > "
                    f"{tol:g}); the hook layout of {sites.model_name} ({sites.arch}) is not "
                    "understood, so no numbers are produced. Check dropout is off (model.eval()) "
                    "and that the model is a standard residual transformer."
                )
        if "block" in sites.units:
            errors[f"block.{L}"] = 0.0  # a difference of two hooks: exact by construction
    try:
        _VERIFIED[model] = (layout, dict(errors))
    except TypeError:
        pass
    return errors


#: model -> (hook layout key, errors) of its last passed :func:`verify_sites`.
_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
