"""The steering edit: :class:`ActivationAddition` adds ``alpha * v`` to the residual stream at
chosen layers and positions, with the added vector split per token against the live stream it is
added to (METHOD.md sec. 1, ``u = v``, ``r = stream``): the parallel part only rescales the stream,
the perpendicular part turns it, and each has its own scale. The math is
:func:`tl_directional.edit.forms.steering_delta`; the plain-``transformers`` lane installs the same
object with module hooks (:mod:`tl_directional.edit.hf.steering`).

Where the vector is added follows TransformerLens's own steering recipes (``hook_resid_pre`` of a
block, TransformerLens issue #362) and the ``steering-vectors`` package (a decoder block's output,
``resid_post``); the positions are absolute, so a position scope stays right during KV-cached
generation, where each step's hook sees one new position (steering-vectors issue #60).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..core.direction import Direction, DirectionError, check_processing_matches
from ..core.geometry import DEFAULT_EPS, compute_dtype
from ..model.generation import FORWARD
from ..model.indices import normalize_layers
from ..model.sites import PARALLEL, POST_LN, ModelSites, resolve_sites
from .base import Edit, HookList, _check_eps, _store_first, track_attention_mask
from .forms import steering_delta, steering_shares
from .tensors import ScaleSpec, cast_back, query_mask

#: Where :class:`ActivationAddition` can add its vector, as TransformerLens names the hook points.
STEERING_SITES = ("resid_pre", "resid_mid", "resid_post")

_SITE_HOOK = re.compile(r"^blocks\.(\d+)\.hook_(resid_pre|resid_mid|resid_post)$")


@dataclass(frozen=True)
class SteeringReport:
    """Per token, how the vector an :class:`ActivationAddition` added lies against the stream it
    was added to, for the last run (a forward pass from position 0 and the KV-cached steps after it).

    Every tensor is ``{layer: [batch, pos]}`` in the compute dtype, read before the edit at that
    layer (the live stream ``h``, earlier edits included), over every position of the run:

    Attributes:
        coef: ``(v . h) / ||h||^2``, the signed scale of the vector along the stream.
        par_share: ``||v_par||^2 / ||v||^2 = cos^2(v, h)``, the share of the vector's energy that
            lies along the stream (only rescales it); ``1 - par_share`` turns it. 0 where the
            stream is degenerate (``||h||^2 <= eps``).
        rescale: ``alpha * s_par * coef`` where the vector was added (0 elsewhere): the edit turns
            ``h`` into ``(1 + rescale) h`` plus the turning part ``alpha * s_perp * v_perp``.
        stream_norm: ``||h||``.
        added: bool, where the vector was added (the ``positions`` scope).
        hook: the site (``"resid_pre"``, ``"resid_mid"`` or ``"resid_post"``).
    """

    coef: dict[int, Float[Tensor, "batch pos"]]
    par_share: dict[int, Float[Tensor, "batch pos"]]
    rescale: dict[int, Float[Tensor, "batch pos"]]
    stream_norm: dict[int, Float[Tensor, "batch pos"]]
    added: dict[int, Bool[Tensor, "batch pos"]]
    hook: str

    @property
    def layers(self) -> list[int]:
        return sorted(self.coef)

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, sequence, position): ``layer``, ``sequence``, ``position``,
        ``added``, ``coef``, ``par_share``, ``rescale``, ``stream_norm``."""
        parts = []
        for L in self.layers:
            b, p = self.coef[L].shape
            seq, pos = torch.meshgrid(torch.arange(b), torch.arange(p), indexing="ij")
            parts.append(pd.DataFrame({
                "layer": L, "sequence": seq.flatten().numpy(), "position": pos.flatten().numpy(),
                "added": self.added[L].flatten().cpu().numpy(),
                **{k: getattr(self, k)[L].flatten().double().cpu().numpy()
                   for k in ("coef", "par_share", "rescale", "stream_norm")}}))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _as_vectors(vector) -> tuple[Tensor, Direction | None]:
    """``(vectors, direction)`` of the ``vector`` argument after the checks that need no model."""
    direction = vector if isinstance(vector, Direction) else None
    if direction is not None:
        if direction.space != "resid":
            raise DirectionError(
                f"vector is a {direction.space}-space Direction ({direction!r}); a steering vector is "
                "added to the residual stream, so it must be a resid-space direction of width d_model")
        if direction.vectors.ndim == 2 and not direction.per_layer:
            raise DirectionError(
                f"vector is a [k, d] = {list(direction.vectors.shape)} subspace; a steering vector is one "
                "direction: pass one row (direction.vectors[i]) or a per-layer set "
                "(Direction(rows, per_layer=True), row L added at layer L)")
        t = direction.vectors
    elif isinstance(vector, Tensor):
        if not vector.is_floating_point() or vector.ndim != 1:
            raise DirectionError(
                f"vector must be a floating [d_model] tensor or a Direction, got a {vector.dtype} tensor of "
                f"shape {tuple(vector.shape)}; for one vector per layer pass Direction(t, per_layer=True)")
        t = vector
    else:
        raise DirectionError(f"vector must be a [d_model] tensor or a tl_directional.Direction, got "
                             f"{type(vector).__name__}")
    if not bool(torch.isfinite(t.detach()).all()):
        raise DirectionError("vector has NaN or inf entries; pass a finite steering vector")
    return t, direction


def _site_of(direction: Direction | None) -> tuple[str | None, int | None]:
    """The site and layer a Direction was read at, when its hook point is a residual-stream one."""
    m = _SITE_HOOK.match(direction.hook_name or "") if direction is not None else None
    if m is None:
        return None, direction.layer if direction is not None else None
    return m.group(2), int(m.group(1))


class ActivationAddition(Edit):
    """Add ``alpha * v`` to the residual stream, its parallel and perpendicular parts scaled apart.

    At each chosen layer's ``hook`` the vector ``v`` is split per token against the live stream
    ``h`` it is added to (earlier edits included): ``v_par = ((v . h) / ||h||^2) h`` only rescales
    the stream, ``v_perp = v - v_par`` turns it, and the stream becomes
    ``h + alpha * (s_par v_par + s_perp v_perp)``. At ``s_par = s_perp = 1`` (the default) nothing
    is split and the edit is plain addition, bit for bit ``h + alpha * v``; ``s_perp = 0`` keeps
    only the part that rescales the stream, ``s_par = 0`` only the part that turns it, so one can
    ask whether a steering effect needs the turning part.

    Args:
        vector: a ``[d_model]`` tensor or a resid-space :class:`~tl_directional.Direction` (one
            direction, or ``per_layer=True``: row ``L`` is added at layer ``L``), cast to the
            stream's dtype and device.
        alpha: the multiplier: a float, a ``[n_layers]`` tensor or
            :func:`~tl_directional.scales` (e.g. ``scales(t, "batch")``: one alpha per batch row).
        layers: the layers to steer (int, list, None). None: the Direction's own layer (from its
            ``hook_name`` or ``layer``), or every layer for a per-layer Direction; a plain tensor
            needs ``layers``.
        hook: ``"resid_pre"`` (``blocks.L.hook_resid_pre``, the stream entering block ``L``),
            ``"resid_mid"`` (between attention and MLP; not in parallel attn+MLP blocks) or
            ``"resid_post"`` (the block's output, where ``steering-vectors`` adds); None: the
            Direction's own site when it was read at one of these, else ``"resid_pre"``.
        positions: absolute query positions (int, list, slice, bool mask ``[pos]`` /
            ``[batch, pos]``; negative ints count from each row's last real token), right during
            KV-cached generation; None: every position.
        s_par, s_perp: scales of the parallel / perpendicular parts (float, ``[n_layers]``,
            :func:`~tl_directional.scales` with a batch axis).
        record: keep a :class:`SteeringReport` of every steered token in :attr:`last_report`.
            Off by default: then nothing is measured or stored.
        eps: the degeneracy threshold on squared norms.

    Edits compose in the order given (:func:`~tl_directional.apply_edits`): an edit listed after
    this one reads the steered stream (on the TransformerLens lanes also at the same hook point;
    there an edit listed before it at ``hook_resid_pre`` of the same layer reads the stream before
    the vector is added).

    Raises:
        DirectionError: a value-space Direction, a ``[k, d]`` subspace, a non-finite or zero
            vector, a width that is not ``d_model`` (when installed), or a Direction whose
            ``weights_processed`` disagrees with the model's (refused, not warned: TransformerLens
            issue #642, a direction read from a centred / folded model is a different direction in
            an unprocessed one's stream; load the model the way the direction was taken, or pass
            ``direction.vectors`` as a plain tensor to add it anyway).
        ValueError: an unknown ``hook``, a site the model does not have, no layer to steer.
    """

    def __init__(self, vector, alpha=1.0, *, layers=None, hook: str | None = None, positions=None,
                 s_par=1.0, s_perp=1.0, record: bool = False, eps: float = DEFAULT_EPS):
        self.vectors, self.direction = _as_vectors(vector)
        site, own_layer = _site_of(self.direction)
        hook = hook if hook is not None else (site or "resid_pre")
        if hook not in STEERING_SITES:
            raise ValueError(f"hook must be one of {STEERING_SITES}, got {hook!r}")
        per_layer = self.direction is not None and self.direction.per_layer
        if layers is None and not per_layer and own_layer is None:
            raise ValueError(
                "layers is needed: the vector carries no layer (a plain tensor, or a Direction without "
                "layer / hook_name); pass e.g. layers=[6]")
        self.hook, self.alpha, self.s_par, self.s_perp = hook, alpha, s_par, s_perp
        self.layers = layers if layers is not None or per_layer else [own_layer]
        self.positions, self.record = positions, bool(record)
        self.eps = _check_eps(eps)
        self._runs: dict[int, list[tuple]] = {}

    def __repr__(self) -> str:
        return (f"ActivationAddition(alpha={self.alpha}, hook={self.hook!r}, layers={self.layers}, "
                f"s_par={self.s_par}, s_perp={self.s_perp})")

    # -- what both lanes share ------------------------------------------------------------------

    def layer_vectors(self, sites: ModelSites, weights_processed: bool) -> dict[int, Tensor]:
        """``{layer: [d_model] vector}`` for a model with ``sites`` (checked against it)."""
        d = self.direction
        if d is not None:
            check_processing_matches(d, weights_processed, argument="vector")
        if self.vectors.shape[-1] != sites.d_model:
            raise DirectionError(f"vector has width {self.vectors.shape[-1]} but the model's d_model is "
                                 f"{sites.d_model}; pass a [d_model] = [{sites.d_model}] vector")
        per_layer = d is not None and d.per_layer
        if per_layer and self.vectors.shape[0] != sites.n_layers:
            raise DirectionError(f"vector is a per-layer set of {self.vectors.shape[0]} rows but the model "
                                 f"has {sites.n_layers} layers")
        layers = normalize_layers(self.layers, sites.n_layers, "layers")
        out = {L: self.vectors[L] if per_layer else self.vectors for L in layers}
        zero = [L for L, v in out.items() if float(v.detach().double().square().sum()) <= self.eps]
        if zero:
            raise DirectionError(f"vector is zero (squared norm <= eps={self.eps:g}) at layer(s) {zero}: "
                                 "adding it would do nothing; pass a nonzero steering vector")
        return out

    def scale_specs(self, sites: ModelSites) -> tuple[ScaleSpec, ScaleSpec, ScaleSpec, bool]:
        """``(alpha, s_par, s_perp, plain)``; ``plain``: both scales are exactly 1 (no split)."""
        kw = dict(n_layers=sites.n_layers, n_heads=sites.n_heads, allow_heads=False)
        alpha = ScaleSpec(self.alpha, argument="alpha", **kw)
        s_par = ScaleSpec(self.s_par, argument="s_par", **kw)
        s_perp = ScaleSpec(self.s_perp, argument="s_perp", **kw)
        return alpha, s_par, s_perp, s_par.is_one and s_perp.is_one

    def apply(self, stream: Tensor, vector: Tensor, layer: int, offset: int,
              specs: tuple[ScaleSpec, ScaleSpec, ScaleSpec, bool], target: Tensor | None = None) -> Tensor:
        """``target + alpha v~`` in ``target``'s dtype, ``v`` split against ``stream`` at ``layer``
        (``target``: the stream itself by default; the HF lane's ``resid_mid`` passes the attention
        update the stream is formed from); ``offset``: the positions already cached."""
        alpha, s_par, s_perp, plain = specs
        batch, n_q = stream.shape[:2]
        device = stream.device
        v = vector.to(device=device, dtype=stream.dtype)
        a = alpha.at(layer, batch, device, stream.dtype)[:, :1]  # [B|1, 1]
        pm = query_mask(self, batch, n_q, offset, device)
        sp = sq = None
        if not plain:
            dtype = compute_dtype(stream.dtype)
            sp = s_par.at(layer, batch, device, dtype)[:, :1]
            sq = s_perp.at(layer, batch, device, dtype)[:, :1]
        if self.record:
            self._keep(stream, v, layer, offset, a, sp, pm)
        target = stream if target is None else target
        delta = steering_delta(stream, v, a, sp, sq, self.eps, pm)
        return cast_back(target.to(delta.dtype) + delta, target, self, layer)

    def _keep(self, stream: Tensor, v: Tensor, layer: int, offset: int, a: Tensor,
              sp: Tensor | None, pm: Tensor | None) -> None:
        coef, share, norm = steering_shares(stream, v, self.eps)
        batch, n_q = coef.shape
        added = torch.ones_like(coef, dtype=torch.bool) if pm is None else pm.expand(batch, n_q)
        factor = a.detach().to(coef.dtype) * (1.0 if sp is None else sp.detach())
        rescale = torch.where(added, factor * coef, torch.zeros_like(coef))
        chunk = (coef, share, rescale, norm, added)
        if offset == 0 or layer not in self._runs:
            self._runs[layer] = [chunk]  # a new run
        else:
            self._runs[layer].append(chunk)  # a KV-cached step of the same run

    @property
    def last_report(self) -> SteeringReport | None:
        """The :class:`SteeringReport` of the last run (``record=True``), or None."""
        if not self._runs:
            return None
        cols = [{L: torch.cat([c[i] for c in chunks], dim=1) for L, chunks in self._runs.items()}
                for i in range(5)]
        return SteeringReport(*cols, hook=self.hook)

    # -- the TransformerLens lanes --------------------------------------------------------------

    def hook_name(self, sites: ModelSites, layer: int) -> str:
        """The TransformerLens hook point whose tensor this edit changes at ``layer``: ``resid_pre``
        and ``resid_post`` themselves; for ``resid_mid`` the attention update (``hook_attn_out``),
        since on a TL 4 bridge ``hook_resid_mid`` is the MLP norm's input, an alias that does not
        carry into the residual sum."""
        if sites.arch == POST_LN:
            raise ValueError(f"ActivationAddition needs a pre-LN decoder; {sites.model_name} is post-LN "
                             "(each update is added before a LayerNorm)")
        if self.hook == "resid_pre":
            return sites.unit("attn", layer).reference_hook
        if self.hook == "resid_post":
            return sites.resid_post_hook(layer)
        if sites.arch == PARALLEL:
            raise ValueError(f"hook='resid_mid' does not exist in {sites.model_name}'s parallel attn+MLP "
                             "blocks (both read resid_pre); use hook='resid_pre' or 'resid_post'")
        return sites.unit("attn", layer).update_hook

    def fwd_hooks(self, model) -> HookList:
        sites = resolve_sites(model)
        track_attention_mask(model)
        vectors = self.layer_vectors(sites, weights_processed=sites.weights.any)
        specs = self.scale_specs(sites)
        hooks: HookList = []
        for L, v in vectors.items():
            name = self.hook_name(sites, L)
            if self.hook != "resid_mid":
                hooks.append((name, self._hook(L, v, specs)))
                continue
            # resid_mid = resid_pre + attention update: the vector goes into the update, split
            # against the stream the two form (the same on every lane)
            state: dict = {}
            hooks.append((sites.unit("attn", L).reference_hook, _store_first(state, "pre")))
            hooks.append((name, self._mid_hook(L, v, specs, state)))
        return hooks

    def _hook(self, layer: int, vector: Tensor, specs):
        def hook(tensor: Float[Tensor, "batch pos d_model"], hook):  # noqa: ARG001
            return self.apply(tensor, vector, layer, FORWARD.past_length or 0, specs)

        return hook

    def _mid_hook(self, layer: int, vector: Tensor, specs, state: dict):
        def hook(update: Float[Tensor, "batch pos d_model"], hook):  # noqa: ARG001
            stream = state["pre"] + update
            return self.apply(stream, vector, layer, FORWARD.past_length or 0, specs, target=update)

        return hook


__all__ = ["STEERING_SITES", "ActivationAddition", "SteeringReport"]
