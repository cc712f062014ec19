"""The edits of :mod:`tl_directional.edit` on plain Hugging Face ``transformers`` models.

The same objects (``ResidualScale``, ``ValueScale`` in mode ``"full"`` and ``"exclusive"``,
``DiagonalRemoval``, ``EffectiveDiagonal``) are installed on an ``AutoModelForCausalLM`` with
torch module hooks instead of TransformerLens hook points; the math is the package's own
(:func:`tl_directional.core.geometry.component_delta`, the edits' scale and scope objects), so an
edited HF model gives the TransformerLens-lane edit's loss and gradients to float32 round-off.

Where each space lives on an HF decoder layer (METHOD.md sec. 2-4):

* **value space** ``[batch, pos, n_heads, d_head]``: the input of the attention output projection
  (``o_proj`` / ``c_proj`` / ``dense``), reshaped to heads, is ``z`` (TL's ``attn.hook_z``); the
  reference is each token's own value ``v_t``, read from the value projection's output (``v_proj``,
  or the value third of GPT-2's ``c_attn`` / GPT-NeoX's per-head ``query_key_value``), query head
  ``h`` reading KV head ``h // (n_heads // n_kv_heads)`` (GQA). Edits that need the attention
  pattern (``mode="exclusive"``: ``A_tt``; ``DiagonalRemoval``: the row) read the weights the
  eager attention returns; other attention implementations return none, and installing such an
  edit is refused with the fix (``attn_implementation="eager"``). Those edits are applied in a
  forward hook of the attention module, which recomputes the output projection from the edited
  ``z``; ``ValueScale(mode="full")`` and ``EffectiveDiagonal`` (the same edit in pattern form,
  applied here as ``z + (s_par - 1) beta_t v_t``) edit ``z`` in the projection's pre-hook.
* **residual space** ``[batch, pos, d_model]``: the update is what the sub-layer adds to the
  stream, the reference the stream it is added to: attention update = the attention module's
  output (sandwich-norm Gemma-3: the output of ``post_attention_layernorm``) against the input of
  the pre-attention norm (``resid_pre``); MLP update = the MLP's output (Gemma-3:
  ``post_feedforward_layernorm``'s) against the input of the pre-MLP norm (``resid_mid``;
  parallel GPT-NeoX: ``resid_pre``); block update = layer output minus ``resid_pre``. This is
  how :func:`tl_directional.model.sites.resolve_sites` pairs ``hook_attn_out`` / ``hook_mlp_out`` /
  ``hook_resid_post`` with their references.

Composition follows the TransformerLens lane: in a layer, the pattern edits apply first, in the
order given (an ``"exclusive"`` value edit reads ``A_tt`` as the pattern stands at its place in
that order, as its ``hook_pattern`` reader does there), then the value edits on the head output
of the edited pattern, in the order given, then the residual edits; residual edits at one site
apply in the order given, each splitting against the live (already edited) stream.

The parts: :mod:`tl_directional.model.hf_layout` (the families' module layouts and the resolved
sites), :mod:`tl_directional.edit.hf.value_chain` (the value-space and pattern edits as functions of
``z``, ``v`` and the weights); this module installs them as hooks and owns the handle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from jaxtyping import Float
from torch import Tensor

from ...core.errors import TLDirectionalError
from ...core.geometry import compute_dtype
from ...model.generation import FORWARD, past_length
from ...model.hf_layout import (
    AttentionPatternUnavailableError,
    HFSites,
    attention_implementation,
    resolve_hf_sites,
)
from ...model.sites import expand_kv_heads
from ..base import Edit
from ..forms import residual_parts, residual_scaled
from ..pattern import DiagonalRemoval, EffectiveDiagonal
from ..residual import ResidualScale
from ..steering import ActivationAddition
from ..tensors import (
    ScaleSpec,
    cast_back,
    query_mask,
)
from ..value import ValueScale
from .steering import install_steering
from .value_chain import _Run, _value_chain_fn, edit_label


def _needs_pattern(e: Edit) -> bool:
    return isinstance(e, DiagonalRemoval) or (isinstance(e, ValueScale) and e.mode == "exclusive")


def _check_pattern_available(model: Any, edit: Edit) -> None:
    impl = attention_implementation(model)
    if impl != "eager":
        raise AttentionPatternUnavailableError(
            f"{edit!r} needs the attention pattern (A_tt), but {type(model).__name__} runs "
            f"attn_implementation={impl!r}, which does not return attention weights. Load it with "
            "from_pretrained(..., attn_implementation='eager') (or call "
            "model.set_attn_implementation('eager')), or use ValueScale(mode='full') / "
            "EffectiveDiagonal, which need no pattern")


class EditsAlreadyInstalledError(TLDirectionalError, RuntimeError):
    """The model already carries tl_directional HF edits."""


def _values(kind: str, out: Tensor, sites: HFSites) -> Float[Tensor, "batch pos n_heads d_head"]:
    """The per-query-head values ``[batch, pos, n_heads, d_head]`` from the value module's output."""
    b, t = out.shape[:2]
    if kind == "separate":
        v = out.view(b, t, -1, sites.d_head)
    elif kind == "gpt2_fused":
        d = sites.n_heads * sites.d_head
        v = out[..., 2 * d:3 * d].reshape(b, t, sites.n_heads, sites.d_head)
    else:  # neox_fused: per head [q | k | v]
        v = out.view(b, t, sites.n_heads, 3 * sites.d_head)[..., 2 * sites.d_head:]
    return expand_kv_heads(v, sites.n_heads)


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output, new):
    return (new, *output[1:]) if isinstance(output, tuple) else new


class HFEditHandle:
    """Edits installed on a plain ``transformers`` model by :func:`install_edits`.

    ``remove()`` takes every hook off (idempotent); the handle is also a context manager.
    ``edits`` is the tuple installed, ``sites`` the resolved :class:`HFSites`.
    """

    def __init__(self, model, edits: tuple[Edit, ...], sites: HFSites):
        self.model = model
        self.edits = edits
        self.sites = sites
        self._handles: list[Any] = []
        self._run: _Run = _Run()
        self.active = True

    def __repr__(self) -> str:
        state = "installed" if self.active else "removed"
        return f"HFEditHandle({state}, {len(self._handles)} hooks, edits={list(self.edits)})"

    def start_measuring(self) -> None:
        """Measure the parallel share of every edited site from the next forward pass on."""
        self._run.meter.clear()
        self._run.measure = True

    def stop_measuring(self) -> dict[str, float]:
        """Stop measuring; ``{"<edit space>/L<layer>": share}`` with ``share = sum ||y_par||^2 /
        sum ||y||^2`` over the measured tokens (heads included in value space; first position
        excluded), ``y`` the edited site's unedited aggregate / update split against its reference
        (own value ``v_t`` in value space, the stream in residual space). Sites with no measured
        energy are left out."""
        self._run.measure = False
        out = {k: par / tot for k, (par, tot) in sorted(self._run.meter.items(), key=lambda kv: _site_order(kv[0]))
               if tot > 0}
        self._run.meter.clear()
        return out

    def remove(self) -> None:
        """Take every hook of these edits off the model (safe to call twice)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.model.__dict__.get("_tld_hf_edits") is self:
            del self.model.__dict__["_tld_hf_edits"]
        self.active = False

    def __enter__(self) -> HFEditHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _site_order(key: str) -> tuple[str, int]:
    space, layer = key.rsplit("/L", 1)
    return space, int(layer)


def installed_edits(model) -> HFEditHandle | None:
    """The :class:`HFEditHandle` currently installed on ``model``, or None."""
    h = getattr(model, "__dict__", {}).get("_tld_hf_edits")
    return h if h is not None and h.active else None


def _check_edits(edits: Sequence[Any]) -> tuple[Edit, ...]:
    if not edits:
        raise ValueError("install_edits needs at least one edit (ResidualScale, ValueScale, DiagonalRemoval, "
                         "EffectiveDiagonal, ActivationAddition)")
    for i, e in enumerate(edits):
        if not isinstance(e, (ResidualScale, ValueScale, DiagonalRemoval, EffectiveDiagonal, ActivationAddition)):
            raise TypeError(
                f"edits[{i}] is a {type(e).__name__}, not an edit; pass ResidualScale, ValueScale, "
                "DiagonalRemoval, EffectiveDiagonal or ActivationAddition objects from tl_directional.edit")
    return tuple(edits)


def install_edits(model, *edits: Any, when: Callable[[], bool] | None = None) -> HFEditHandle:
    """Install ``edits`` on a plain ``transformers`` causal LM until ``handle.remove()``.

    Args:
        model: e.g. ``AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")``
            of a supported family (GPT-2, Llama / Mistral / Qwen2 / Qwen3, Gemma-3 text,
            GPT-NeoX).
        edits: :class:`~tl_directional.edit.ResidualScale`, :class:`~tl_directional.edit.ValueScale`
            (``mode="full"`` or ``"exclusive"``), :class:`~tl_directional.edit.DiagonalRemoval`,
            :class:`~tl_directional.edit.EffectiveDiagonal`, :class:`~tl_directional.edit.ActivationAddition`
            (:mod:`tl_directional.edit.hf.steering`), with their usual scales and scopes.
        when: optional predicate read at the start of every forward pass of ``model``; the edits
            act only where it returns True (e.g. ``lambda: model.training``: on for training,
            off for evaluation). Default: always on.

    Returns:
        An :class:`HFEditHandle`; ``handle.remove()`` restores the unedited model.

    Raises:
        UnsupportedModelError: unknown architecture (names the class and the supported families).
        EditsAlreadyInstalledError: the model already has edits installed (remove them first).
        AttentionPatternUnavailableError: an edit needs the pattern and attention is not eager.
    """
    edits = _check_edits(edits)
    sites = resolve_hf_sites(model)
    current = installed_edits(model)
    if current is not None:
        raise EditsAlreadyInstalledError(
            f"{type(model).__name__} already has tl_directional edits installed ({list(current.edits)}); "
            "call handle.remove() (or tl_directional.edit.hf.remove_edits(model)) first, or install all "
            "edits in one call: install_edits(model, edit_a, edit_b)")
    for e in edits:
        if _needs_pattern(e):
            _check_pattern_available(model, e)
    handle = HFEditHandle(model, edits, sites)
    try:
        _install(handle, model, edits, sites, _Run(when))
    except BaseException:
        handle.remove()
        raise
    model.__dict__["_tld_hf_edits"] = handle
    return handle


@contextmanager
def stacked_edits(model, *edits: Any) -> Iterator[HFEditHandle]:
    """``edits`` on top of whatever edits ``model`` already carries, for the ``with`` block: the
    plain-``transformers`` form of nesting ``apply_edits`` blocks, as the TransformerLens lanes
    nest them (the inner block's edits compose after the outer ones, in order).

    Module hooks cannot be stacked edit by edit (an exclusive edit and a pattern edit of one layer
    share one chain), so the outer handle's hooks come off, the outer edits and ``edits`` go on
    together as one chain (with the outer ``when``), and on exit the outer edits go back on under
    the outer handle, which stays valid (its measuring state starts afresh).
    """
    outer = installed_edits(model)
    if outer is None:
        handle = install_edits(model, *edits)
        try:
            yield handle
        finally:
            handle.remove()
        return
    edits = _check_edits(edits)
    when = outer._run.when
    outer.remove()
    try:
        inner = install_edits(model, *outer.edits, *edits, when=when)
        try:
            yield inner
        finally:
            inner.remove()
    finally:
        outer._handles.clear()
        _install(outer, model, outer.edits, outer.sites, _Run(when))
        outer.active = True
        model.__dict__["_tld_hf_edits"] = outer


def remove_edits(model) -> bool:
    """Remove whatever tl_directional HF edits ``model`` carries; True if there were any."""
    h = installed_edits(model)
    if h is None:
        return False
    h.remove()
    return True


def _install(handle: HFEditHandle, model, edits: tuple[Edit, ...], sites: HFSites, run: _Run) -> None:
    handle._run = run
    add = handle._handles.append
    ns = sites.model_sites()

    def top_pre(module, args, kwargs):  # noqa: ARG001
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1 and isinstance(args[1], Tensor):
            mask = args[1]
        # a cache object (even an empty one, at generate's prefill) means later positions come later
        generating = any(kwargs.get(k) is not None for k in ("past_key_values", "cache"))
        run.saved.append((FORWARD.attention_mask, generating))
        FORWARD.attention_mask = mask if isinstance(mask, Tensor) and mask.ndim == 2 else None
        FORWARD.generating += int(generating)
        run.offset = past_length(kwargs)
        run.on = True if run.when is None else bool(run.when())

    def top_post(module, args, output):  # noqa: ARG001
        if run.saved:
            mask, generating = run.saved.pop()
            FORWARD.attention_mask = mask
            FORWARD.generating -= int(generating)

    add(model.register_forward_pre_hook(top_pre, with_kwargs=True))
    add(model.register_forward_hook(top_post, always_call=True))

    value_edits = [e for e in edits if not isinstance(e, (ResidualScale, ActivationAddition))]
    per_layer: dict[int, list[tuple[Edit, Callable]]] = {}
    for e in value_edits:
        for L in e._layers(ns):
            per_layer.setdefault(L, []).append((e, _value_chain_fn(e, L, sites, run)))
    for L, chain in sorted(per_layer.items()):
        _install_value_layer(handle, sites, L, chain)
    for e in edits:  # residual edits and steering in the order given
        if isinstance(e, ResidualScale):
            _install_residual(handle, sites, e, run)
        elif isinstance(e, ActivationAddition):
            install_steering(add, sites, e, run)


def _install_value_layer(handle: HFEditHandle, sites: HFSites, layer: int, chain) -> None:
    add = handle._handles.append
    run = handle._run
    lay = sites.layout
    attn = sites.module(layer, lay.attn)
    o_proj = sites.module(layer, lay.o_proj, under_attn=True)
    v_mod = sites.module(layer, lay.v_source, under_attn=True)
    post = any(_needs_pattern(e) for e, _ in chain)
    # whether an edit after position i reads the pattern's values (not only its key offset)
    read_later = [any(_needs_pattern(e) for e, _ in chain[i + 1:]) for i in range(len(chain))]
    state: dict = {}

    def v_hook(module, args, output):  # noqa: ARG001
        state.clear()
        if not run.on:
            return
        state["v"] = _values(lay.v_kind, output, sites)

    def apply_chain(z_flat: Tensor, weights: Tensor | None) -> Tensor:
        v = state.get("v")
        b, t = z_flat.shape[:2]
        if v is None or v.shape[1] != t:
            raise RuntimeError(
                f"tl_directional HF edits at layer {layer}: the value projection "
                f"({lay.v_source}) did not run with the same positions as the output projection "
                f"({lay.o_proj}) in this forward pass; this attention module is not supported")
        z = z_flat.view(b, t, sites.n_heads, sites.d_head)
        # the TransformerLens order: pattern edits at hook_pattern in the order given (each value
        # edit reads the pattern as it stands at its place in that order), then the value edits
        # at hook_z, in the order given, on the head output of the edited pattern
        value_stage = []
        for i, (e, fn) in enumerate(chain):
            if isinstance(e, (DiagonalRemoval, EffectiveDiagonal)):
                z, weights = fn(z, v, weights, carry=read_later[i])
            else:
                value_stage.append((fn, weights))
        for fn, w in value_stage:
            z = fn(z, v, w)
        return z.reshape(b, t, -1)

    def o_pre(module, args):  # noqa: ARG001
        if state.get("reentrant") or not run.on:
            return None
        if post:
            state["z"] = args[0]
            return None
        return (apply_chain(args[0], None), *args[1:])

    add(v_mod.register_forward_hook(v_hook))
    add(o_proj.register_forward_pre_hook(o_pre))
    if not post:
        return

    def attn_post(module, args, output):  # noqa: ARG001
        if not run.on:
            return None
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if not isinstance(weights, Tensor):
            edit = next(e for e, _ in chain if _needs_pattern(e))
            raise AttentionPatternUnavailableError(
                f"{edit!r} at layer {layer}: {type(module).__name__} returned no attention weights "
                f"(attn_implementation={getattr(module.config, '_attn_implementation', None)!r}); "
                "load the model with attn_implementation='eager'")
        z = state.pop("z")
        z_new = apply_chain(z, weights)
        state["reentrant"] = True
        try:
            out = o_proj(z_new)
        finally:
            state["reentrant"] = False
        for name in lay.after_o:
            out = getattr(module, name)(out)
        return _replace_first(output, out)

    add(attn.register_forward_hook(attn_post))


def _install_residual(handle: HFEditHandle, sites: HFSites, e: ResidualScale, run: _Run) -> None:
    add = handle._handles.append
    ns = sites.model_sites()
    if not (e.reference is None or isinstance(e.reference, Tensor) and e.reference.ndim != 2):
        raise ValueError(
            f"ResidualScale(reference=...) with a {'Direction' if not isinstance(e.reference, Tensor) else '2-D tensor'} "
            "(a subspace or per-layer set) is resolved against a TransformerLens model; on the plain-transformers "
            "lane pass a [d_model] tensor (e.g. direction.vectors), or load the model with tld.load_model")
    if e.reference is not None and e.reference.shape[-1] != sites.d_model:
        raise ValueError(f"reference has size {e.reference.shape[-1]} but d_model is {sites.d_model}")
    kw = dict(n_layers=sites.n_layers, n_heads=sites.n_heads, allow_heads=False)
    s_par = ScaleSpec(e.s_par, argument="s_par", **kw)
    s_perp = ScaleSpec(e.s_perp, argument="s_perp", **kw)

    label = edit_label(e)

    def edited(tensor: Tensor, stream: Tensor, layer: int, is_difference: bool) -> Tensor:
        update, ref = residual_parts(tensor, stream, e.reference, is_difference)
        run.record(f"{label}/L{layer}", update, ref, e.eps)
        batch, n_q = tensor.shape[:2]
        dtype = compute_dtype(tensor.dtype)
        sp = s_par.at(layer, batch, tensor.device, dtype)[:, :1]
        sq = s_perp.at(layer, batch, tensor.device, dtype)[:, :1]
        pm = query_mask(e, batch, n_q, run.offset, tensor.device)
        return cast_back(residual_scaled(tensor, update, ref, sp, sq, e.eps, pm), tensor, e, layer)

    for L in e._layers(ns):
        _install_residual_layer(add, sites, e, L, edited, run)


def _install_residual_layer(add, sites: HFSites, e: ResidualScale, layer: int, edited: Callable,
                            run: _Run) -> None:
    lay = sites.layout
    state: dict = {}

    def keep(key):
        def hook(module, args):  # noqa: ARG001
            if run.on:
                state[key] = args[0]
        return hook

    add(sites.module(layer, lay.attn_norm).register_forward_pre_hook(keep("pre")))
    if e.component == "block":
        def block_hook(module, args, output):  # noqa: ARG001
            if not run.on:
                return None
            return _replace_first(output, edited(_first(output), state["pre"], layer, True))
        add(sites.layers[layer].register_forward_hook(block_hook))
        return
    ref_key = "pre"
    if e.component == "mlp" and lay.mlp_norm is not None:
        add(sites.module(layer, lay.mlp_norm).register_forward_pre_hook(keep("mid")))
        ref_key = "mid"
    target = sites.module(layer, lay.attn_out if e.component == "attn" else lay.mlp_out)

    def unit_hook(module, args, output):  # noqa: ARG001
        if not run.on:
            return None
        return _replace_first(output, edited(_first(output), state[ref_key], layer, False))

    add(target.register_forward_hook(unit_hook))


__all__ = [
    "EditsAlreadyInstalledError",
    "HFEditHandle",
    "install_edits",
    "installed_edits",
    "remove_edits",
    "stacked_edits",
]
