"""Cache-level splits in TransformerLens's shapes: the parallel and perpendicular parts of the
stacks ``ActivationCache.decompose_resid()`` and ``ActivationCache.stack_head_results()`` return.

What: each component of TL's stack (``embed``, ``pos_embed``, ``{L}_attn_out``, ``{L}_mlp_out``;
or the heads ``L{L}H{h}``) is an update ``u`` written into the residual stream (``d_model``
space). It is split against a reference (METHOD.md sec. 1, generalised to a subspace in
:mod:`tl_directional.core.subspace`) into ``u_par`` (inside the reference's span) and
``u_perp = u - u_par``. The result (:class:`StackSplit`) holds two stacks of TL's own shape
``[component, *batch_and_pos, d_model]`` (``[component, batch, pos, d_model]`` for a batched
cache without ``pos_slice``; an integer ``pos_slice`` drops ``pos``, as in TL) with TL's labels,
so each part feeds ``cache.apply_ln_to_stack(part, layer)`` and
``cache.logit_attrs(part, tokens, incorrect_tokens=...)`` unchanged. ``logit_attrs`` is linear
in the stack once the final LayerNorm's scale is taken from the cache (TL does that), so the two
parts' attributions add up to TL's attribution of the whole stack.

Against which reference (``reference=``):

* ``"input"`` (default): each component against the residual stream it is added to (METHOD sec.
  2, read from :func:`tl_directional.model.sites.resolve_sites`, never from the architecture
  name): ``{L}_attn_out`` and the heads ``L{L}H{h}`` against ``blocks.L.hook_resid_pre``;
  ``{L}_mlp_out`` against ``blocks.L.hook_resid_mid`` (sequential blocks) or
  ``blocks.L.hook_resid_pre`` (parallel attn+MLP blocks). The embedding rows (``embed``,
  ``pos_embed``) have no earlier stream: they are split against the stream they form,
  ``blocks.0.hook_resid_pre`` (with only ``embed`` that is the row itself, all parallel).
  Per token; a token whose stream or update has squared norm ``<= eps`` is degenerate
  (``u_par = 0``), as METHOD sec. 1 defines.
* a ``[d_model]`` tensor: one direction for every component (an SAE decoder row, a steering
  vector, a logit-difference direction).
* a ``[n_layers, d_model]`` tensor with ``per_layer=True``: row ``L`` for the components of
  layer ``L``; the embedding rows use row 0 (they are the input of layer 0).
* a ``[k, d_model]`` tensor (``per_layer`` False or not given): the subspace its rows span,
  orthonormalised in float64; the random baseline of the energy share is ``k / d_model``
  (:attr:`StackSplit.random_energy_share`). A 2-D reference with exactly ``n_layers`` rows is
  ambiguous and needs ``per_layer=True`` or ``per_layer=False``.
* a ``[*batch_and_pos, d_model]`` tensor (the stack's shape without its component axis, i.e.
  already ``pos_slice``-d): one stream per token, the same for every component.
* a :class:`~tl_directional.core.direction.Direction` (``space="resid"``): its vectors read as
  above, its own ``per_layer`` deciding; one for another space or from a model whose weights
  were processed differently is refused (:func:`~tl_directional.model.reference.resolve_reference`).

Dtype: the parts are in the compute dtype of the stack (float64 stays float64, anything else
float32); ``parallel + perpendicular`` is TL's stack up to one rounding of the larger part.
On a half-precision model pass ``part.to(stack_dtype)`` to ``logit_attrs`` (TL multiplies by
``W_U`` in the model's dtype).
Post-LN encoders (BERT) are refused: their ``hook_attn_out`` is not the attention update.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from ..core.direction import Direction
from ..core.errors import TLDirectionalError
from ..core.geometry import DEFAULT_EPS, check_eps, compute_dtype, parallel_part
from ..core.subspace import SubspaceError, check_directions, orthonormal_basis, random_energy_share
from ..model.reference import resolve_reference
from ..model.sites import POST_LN, resolve_sites

INPUT = "input"


class StackSplitError(TLDirectionalError, ValueError):
    """An argument of a cache-level split that cannot be used (the message names it and the fix)."""


@dataclass(frozen=True)
class StackSplit:
    """The split of one TransformerLens stack (see the module docstring).

    Attributes:
        parallel: ``[component, *batch_and_pos, d_model]``, each component's part inside its
            reference's span, in ``dtype``.
        perpendicular: same shape, ``component - parallel``.
        labels: TL's labels of the stack (``return_labels=True``), one per component.
        references: per component, what it was split against: a hook name
            (``"blocks.0.hook_resid_pre"``), ``"reference"`` (one direction or subspace),
            ``"reference[L]"`` (a row of a per-layer set) or ``"reference (streams)"``.
        dtype: the float dtype of the split (the stack's compute dtype).
        k: the dimension of the reference's span (1 for streams and directions).
        d_model: the width of the space.
    """

    parallel: Float[Tensor, "component *batch_and_pos d_model"]
    perpendicular: Float[Tensor, "component *batch_and_pos d_model"]
    labels: tuple[str, ...]
    references: tuple[str, ...]
    dtype: torch.dtype
    k: int
    d_model: int

    @property
    def random_energy_share(self) -> float:
        """``k / d_model``: a random update's expected parallel energy share (the baseline)."""
        return random_energy_share(self.k, self.d_model)

    def energy_share(self) -> Float[Tensor, " component"]:
        """Per component, ``sum ||u_par||^2 / sum ||u||^2`` over all its tokens (``0`` where the
        component is zero everywhere), in ``dtype``; compare with :attr:`random_energy_share`."""
        dims = tuple(range(1, self.parallel.ndim))
        par = (self.parallel * self.parallel).sum(dims)
        full = self.parallel + self.perpendicular
        total = (full * full).sum(dims)
        return torch.where(total > 0, par / torch.where(total > 0, total, torch.ones_like(total)),
                           torch.zeros_like(total))


def _model_of(cache) -> object:
    model = getattr(cache, "model", None)
    if model is None or not hasattr(cache, "decompose_resid"):
        raise StackSplitError(
            f"cache must be a TransformerLens ActivationCache from model.run_with_cache(tokens) "
            f"(it carries .model), got {type(cache).__name__}; run the model with run_with_cache")
    return model


def _check_layer(layer, n_layers: int, *, allow_top: bool = True) -> int:
    top = n_layers if allow_top else n_layers - 1
    if layer is None or (isinstance(layer, int) and not isinstance(layer, bool) and layer == -1):
        return n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= top:
        raise StackSplitError(
            f"layer must be None, -1 or an integer in [0, {top}] (components before that layer's "
            f"input, as in TransformerLens), got {layer!r}")
    return layer


def _component_layer(label: str) -> tuple[str, int]:
    """``(kind, layer)`` of one TL label: ``embed`` / ``pos_embed`` -> layer 0."""
    if label in ("embed", "pos_embed"):
        return "embed", 0
    m = re.fullmatch(r"(\d+)_(attn|mlp)_out", label) or re.fullmatch(r"L(\d+)H\d+", label)
    if m is None:
        raise StackSplitError(f"unknown stack label {label!r} from TransformerLens; expected "
                              "embed, pos_embed, {L}_attn_out, {L}_mlp_out or L{L}H{h}")
    kind = m.group(2) if m.re.groups == 2 else "attn"
    return kind, int(m.group(1))


def _decoder_sites(model):
    """The model's resolved sites; post-LN encoders are refused (module docstring)."""
    sites = resolve_sites(model)
    if sites.arch == POST_LN:
        raise StackSplitError(
            f"{sites.model_name} is a post-LN encoder: its updates are added before a LayerNorm "
            "and TL's hook_attn_out is the normalised stream, so TL's stacks are not its updates "
            "(METHOD.md sec. 2); use a decoder model, or tld.profile for post-LN geometry")
    return sites


def _input_hooks(model, labels: list[str]) -> list[str]:
    """Per label, the hook of the stream the component is added to (module docstring)."""
    sites = _decoder_sites(model)
    hooks = []
    for label in labels:
        kind, layer = _component_layer(label)
        hooks.append("blocks.0.hook_resid_pre" if kind == "embed"
                     else sites.units[kind][layer].reference_hook)
    return hooks


def _stream_stack(cache, hooks: list[str], n_layers: int, pos_slice) -> Float[Tensor, "component *batch_and_pos d_model"]:
    """The streams named by ``hooks``, sliced by TL itself (``accumulated_resid``) exactly as
    the components are, stacked ``[component, *batch_and_pos, d_model]``."""
    incl_mid = any(h.endswith("hook_resid_mid") for h in hooks)
    streams, names = cache.accumulated_resid(layer=n_layers, incl_mid=incl_mid, apply_ln=False,
                                             pos_slice=pos_slice, return_labels=True)
    index = {n: i for i, n in enumerate(names)}
    rows = []
    for h in hooks:
        m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_(pre|mid)", h)
        if m is None or f"{m.group(1)}_{m.group(2)}" not in index:  # pragma: no cover - sites
            raise StackSplitError(f"no cached stream for reference hook {h!r}")
        rows.append(index[f"{m.group(1)}_{m.group(2)}"])
    return streams[torch.as_tensor(rows, device=streams.device)]


def _split(stack: Tensor, labels: list[str], cache, model, reference, *, per_layer, eps,
           pos_slice) -> StackSplit:
    try:
        eps = check_eps(eps)
    except ValueError as err:
        raise StackSplitError(str(err)) from None
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    if isinstance(reference, Direction):  # space and weight processing checked, then its rows
        try:
            resolve_reference(model, reference, per_layer=per_layer)
        except SubspaceError as err:
            raise StackSplitError(str(err)) from None
        reference, per_layer = reference.vectors, reference.per_layer
    dtype = compute_dtype(stack.dtype)
    u = stack.to(dtype)
    k = 1
    if isinstance(reference, str):
        if reference != INPUT:
            raise StackSplitError(f"reference must be {INPUT!r} (each component against the stream "
                                  f"it is added to) or a tensor ([d_model], [n_layers, d_model], "
                                  f"[k, d_model] or [*batch_and_pos, d_model]), got {reference!r}")
        hooks = _input_hooks(model, labels)
        refs = _stream_stack(cache, hooks, n_layers, pos_slice).to(dtype) if labels else u
        par = parallel_part(u, refs, eps)
        return _result(u, par, labels, hooks, dtype, k, d_model)
    if not isinstance(reference, Tensor) or not reference.is_floating_point():
        raise StackSplitError(f"reference must be 'input' or a floating torch tensor, got "
                              f"{type(reference).__name__}; pass e.g. torch.as_tensor(v, dtype=torch.float32)")
    ref = reference.detach().to(device=u.device)
    try:
        if ref.ndim == 2 and per_layer is None and ref.shape[0] == n_layers and n_layers > 1:
            raise StackSplitError(
                f"reference has shape {tuple(ref.shape)}: {n_layers} rows is both a per-layer set "
                f"([n_layers, d_model]) and a {n_layers}-dimensional subspace; pass per_layer=True "
                "(row L for layer L's components) or per_layer=False (their span)")
        if ref.ndim == 2 and per_layer:
            if ref.shape[0] != n_layers:
                raise StackSplitError(f"reference with per_layer=True must be [n_layers={n_layers}, "
                                      f"d_model={d_model}], got {tuple(ref.shape)}; one row per layer")
            rows = check_directions(ref, argument="reference", width=d_model).to(dtype)
            layers = [_component_layer(label)[1] for label in labels]
            refs = rows[torch.as_tensor(layers, dtype=torch.long, device=u.device)]
            refs = refs.reshape(len(labels), *([1] * (u.ndim - 2)), d_model)
            par = parallel_part(u, refs, eps)
            return _result(u, par, labels, [f"reference[{L}]" for L in layers], dtype, 1, d_model)
        if ref.ndim == 1 or (ref.ndim == 2 and ref.shape[0] == 1):
            r = check_directions(ref, argument="reference", width=d_model)[0].to(dtype)
            par = parallel_part(u, r, eps)
            return _result(u, par, labels, ["reference"] * len(labels), dtype, 1, d_model)
        if ref.ndim == 2:
            q = orthonormal_basis(ref, argument="reference", width=d_model).to(device=u.device, dtype=dtype)
            k = q.shape[0]
            par = (u @ q.T) @ q
            return _result(u, par, labels, ["reference"] * len(labels), dtype, k, d_model)
    except SubspaceError as err:
        raise StackSplitError(str(err)) from None
    if tuple(ref.shape) != tuple(u.shape[1:]):
        raise StackSplitError(
            f"reference of shape {tuple(ref.shape)} is neither [d_model={d_model}], "
            f"[n_layers={n_layers}, d_model], [k, d_model] nor the stack's streams "
            f"{list(u.shape[1:])} ([*batch_and_pos, d_model], already pos_slice-d); pass one of these")
    if not bool(torch.isfinite(ref).all()):
        raise StackSplitError("reference streams have NaN or inf entries; check where they were computed")
    if not bool((ref != 0).any()):
        raise StackSplitError("reference streams are zero everywhere: they span no direction; "
                              "pass the streams (e.g. cache['blocks.L.hook_resid_pre']) you meant")
    par = parallel_part(u, ref.to(dtype), eps)
    return _result(u, par, labels, ["reference (streams)"] * len(labels), dtype, 1, d_model)


def _result(u, par, labels, refs, dtype, k, d_model) -> StackSplit:
    return StackSplit(parallel=par, perpendicular=u - par, labels=tuple(labels),
                      references=tuple(refs), dtype=dtype, k=k, d_model=d_model)


def split_decompose_resid(
    cache,
    layer: int | None = None,
    *,
    reference: str | Tensor | Direction = INPUT,
    mlp_input: bool = False,
    mode: str = "all",
    incl_embeds: bool = True,
    pos_slice=None,
    per_layer: bool | None = None,
    eps: float = DEFAULT_EPS,
) -> StackSplit:
    """Split ``cache.decompose_resid(layer, mlp_input=..., mode=..., incl_embeds=...,
    pos_slice=..., apply_ln=False, return_labels=True)`` against ``reference``.

    Args:
        cache: an ``ActivationCache`` from ``model.run_with_cache(tokens)`` (TL 4 bridge or
            legacy ``HookedTransformer``).
        layer, mlp_input, mode, incl_embeds, pos_slice: as in TL's ``decompose_resid``
            (``layer`` None or -1: every layer; an integer in ``[0, n_layers]``: the components
            before layer ``layer``'s input). ``apply_ln`` is not taken: split first, then call
            ``cache.apply_ln_to_stack(part, layer, mlp_input=...)`` on each part.
        reference: ``"input"`` or a tensor (module docstring).
        per_layer: read a 2-D ``reference`` as ``[n_layers, d_model]`` (True) or a subspace (False).
        eps: degeneracy threshold on squared norms (METHOD.md sec. 1).

    Returns:
        A :class:`StackSplit` whose ``parallel`` / ``perpendicular`` have TL's stack shape
        ``[component, *batch_and_pos, d_model]`` and TL's labels.

    Raises:
        StackSplitError: (a ``ValueError``) a bad ``cache``, ``layer``, ``mode`` or
            ``reference`` (wrong width, zero, NaN / inf, a degenerate span), or a post-LN model.
    """
    model = _model_of(cache)
    _decoder_sites(model)
    n_layers = int(model.cfg.n_layers)
    layer = _check_layer(layer, n_layers, allow_top=not mlp_input)
    if mode not in ("all", "mlp", "attn"):
        raise StackSplitError(f"mode must be 'all', 'mlp' or 'attn' (as in TL's decompose_resid), got {mode!r}")
    stack, labels = cache.decompose_resid(layer=layer, mlp_input=mlp_input, mode=mode, apply_ln=False,
                                          pos_slice=pos_slice, incl_embeds=incl_embeds,
                                          return_labels=True)
    return _split(stack, list(labels), cache, model, reference, per_layer=per_layer, eps=eps,
                  pos_slice=pos_slice)


def split_stack_head_results(
    cache,
    layer: int | None = None,
    *,
    reference: str | Tensor | Direction = INPUT,
    pos_slice=None,
    per_layer: bool | None = None,
    eps: float = DEFAULT_EPS,
) -> StackSplit:
    """Split ``cache.stack_head_results(layer, pos_slice=..., apply_ln=False,
    return_labels=True)`` (one row ``L{L}H{h}`` per head of the layers before ``layer``)
    against ``reference``; with ``"input"`` every head of layer ``L`` against
    ``blocks.L.hook_resid_pre``.

    Args:
        cache: an ``ActivationCache`` from ``model.run_with_cache(tokens)``. TL computes the
            per-head results from ``hook_z`` and ``W_O`` into the cache on first use, as its own
            ``stack_head_results`` does.
        layer: None or -1 (every layer) or an integer in ``[0, n_layers]`` (heads of the layers
            before it), as in TL. ``incl_remainder`` is not offered: its remainder mixes every
            other component, so no single stream is its input.
        pos_slice: as in TL.
        reference, per_layer, eps: as in :func:`split_decompose_resid`.

    Returns:
        A :class:`StackSplit` of shape ``[n_heads * layers, *batch_and_pos, d_model]``.

    Raises:
        StackSplitError: (a ``ValueError``) see :func:`split_decompose_resid`.
    """
    model = _model_of(cache)
    _decoder_sites(model)
    layer = _check_layer(layer, int(model.cfg.n_layers))
    stack, labels = cache.stack_head_results(layer=layer, pos_slice=pos_slice, apply_ln=False,
                                             return_labels=True)
    return _split(stack, list(labels), cache, model, reference, per_layer=per_layer, eps=eps,
                  pos_slice=pos_slice)


__all__ = ["StackSplit", "StackSplitError", "split_decompose_resid", "split_stack_head_results"]
