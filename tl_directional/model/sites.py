"""Which update, against which reference: hook-site resolution (METHOD.md sec. 2-3).

The site records (:class:`ModelSites`, :class:`UnitSite`, :class:`ValueSite`) and their
resolution: everything else asks :func:`resolve_sites` for a :class:`ModelSites` and uses its
names. The other sites modules of ``model/`` take what they need from here:
:mod:`~tl_directional.model.indices` (layer / head arguments),
:mod:`~tl_directional.model.structure` (sandwich norms, weight processing),
:mod:`~tl_directional.model.weights` (weights and linear inputs of a block) and
:mod:`~tl_directional.model.verify` (the additive identities checked on real activations).

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

import os
import sys
import warnings
import weakref
from dataclasses import dataclass, field

from jaxtyping import Float
from torch import Tensor

from ..core.components import RESIDUAL_COMPONENTS
from ..core.errors import TLDirectionalError
from .finite import nonfinite_message
from .indices import check_hook_api, check_layer
from .lanes import lane_of
from .randomness import random_in_training
from .structure import (
    SANDWICH_NOTE,
    WeightProcessing,
    config_value,
    detect_weight_processing,
    model_facts,
)

COMPONENTS = RESIDUAL_COMPONENTS  # the residual components, in their order (one home: components.py)

SEQUENTIAL = "sequential"  # pre-LN, attn then MLP (GPT-2, Llama, Qwen, Mistral)
PARALLEL = "parallel"  # pre-LN, attn and MLP read the same stream (GPT-J, Pythia/NeoX)
POST_LN = "post_ln"  # BERT: each update is added before a LayerNorm


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
    sandwich: bool = False  # a norm after each sub-layer, before the residual add (Gemma-2/3, OLMo-2)

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
    if warn:
        _warn_if_processed(sites)
    return sites


def _user_stacklevel(warning_frame) -> int:
    """``warnings.warn``'s ``stacklevel``, for a warning issued in ``warning_frame`` (level 1), of
    the first frame that is neither this package nor a wrapper around its functions
    (``contextlib``: ``apply_edits`` is a context manager, torch's ``no_grad`` a decorator;
    jaxtyping's runtime type checks): the user's line, however deep the verb calls the check
    (``warnings.warn``'s ``skip_file_prefixes`` needs Python 3.12)."""
    frame, level = warning_frame.f_back, 2
    while frame is not None and _is_wrapper_frame(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_WRAPPER_FILES = ("contextlib.py",)  # the standard library's and torch's (torch/utils/_contextlib.py)
_WRAPPER_PACKAGES = tuple(os.sep + name + os.sep for name in ("jaxtyping", "typeguard", "beartype"))


def _is_wrapper_frame(filename: str) -> bool:
    return (filename.startswith(_PACKAGE_DIR) or filename.endswith(_WRAPPER_FILES)
            or any(part in filename for part in _WRAPPER_PACKAGES))


def _warn_if_processed(sites: ModelSites, *, verb: str = "") -> None:
    """The :class:`WeightProcessingWarning` of processed weights, pointed at the user's line."""
    if not sites.weights.any:
        return
    who = f"{verb} splits against" if verb else "every split is taken against"
    warnings.warn(
        f"{sites.model_name}: weights look processed ({sites.weights.as_dict()}); {who} the stream "
        "these weights produce, and centring writing weights or folding value biases changes every "
        "projection. The canonical form is unprocessed (TransformerBridge.boot_transformers "
        "without enable_compatibility_mode, or HookedTransformer.from_pretrained_no_processing).",
        WeightProcessingWarning,
        stacklevel=_user_stacklevel(sys._getframe()),
    )


def analysis_sites(model, verb: str, error: type[Exception], why: str, *, scan_weights: bool = True) -> ModelSites:
    """The one check every analysis verb makes of its model before it runs anything: refuse a
    model in training mode whose dropout is live (two identical runs would differ; training mode
    without a random module changes nothing and passes: :mod:`.randomness`) and one whose weights
    hold NaN or inf (every number downstream would be NaN), then the resolved sites, with a
    :class:`WeightProcessingWarning` when the weights look processed.

    Args:
        model: a ``TransformerBridge`` or ``HookedTransformer``.
        verb: the public function's name, for the message (``"path_patch"``).
        error: the verb's own error class (a ``ValueError`` / ``RuntimeError`` subclass).
        why: what dropout would spoil, in the verb's terms ("the patched and corrupted runs
            would differ by chance").
        scan_weights: scan every weight for NaN / inf here (the default). False only for a verb
            that checks its own results instead and scans when they are not finite (``profile``:
            its statistics are sums over the counted tokens, so a non-finite weight that reaches
            them leaves a NaN there; :func:`tl_directional.measure.profile` says why that suffices).

    Raises:
        error: a module of ``model`` draws random numbers in training mode (the message names
            the first one, its rate and the fix, ``model.eval()``), or a weight is NaN / inf (the
            message names the weights).
    """
    live = random_in_training(model)
    if live:
        (first, rate), more = live[0], len(live) - 1
        raise error(
            f"{verb}: model is in training mode with live dropout ({first}, rate {rate:g}"
            f"{f', and {more} more modules' if more else ''}): {why}; call model.eval() first"
        )
    broken = nonfinite_message(model) if scan_weights and hasattr(model, "named_parameters") else None
    if broken:
        raise error(f"{verb}: {broken}")
    sites = resolve_sites(model, warn=False)
    _warn_if_processed(sites, verb=verb)
    return sites


def _resolve(model) -> ModelSites:
    """One real resolution (see :func:`resolve_sites`, which caches it)."""
    cfg = model.cfg
    lane = lane_of(model)
    n_layers = int(cfg.n_layers)
    n_heads = int(cfg.n_heads)
    n_kv = int(config_value(model, "n_key_value_heads", default=n_heads) or n_heads)
    if n_heads % n_kv:
        raise SiteResolutionError(f"n_heads={n_heads} is not a multiple of n_key_value_heads={n_kv}")
    facts = model_facts(model)  # the architecture name and family record, read once
    is_post_ln = facts.encoder
    if is_post_ln and not lane.resolves_encoders:
        raise SiteResolutionError(
            "post-LN encoders are supported on the TL 4 TransformerBridge only "
            "(boot_transformers); the legacy HookedEncoder is not a supported lane."
        )
    if is_post_ln:
        arch = POST_LN
    elif facts.parallel:
        arch = PARALLEL
    else:
        arch = SEQUENTIAL
    sandwich = facts.sandwich
    weights = detect_weight_processing(model, facts)
    model_name = str(config_value(model, "model_name", default=type(model).__name__))
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
        sandwich=sandwich,
        units=units,
        value=value,
        notes=notes,
    )
    return sites
