"""The per-token statistics collected while a model runs (one job of :mod:`tl_directional.measure`):
the fixed-size accumulator shared by the streaming hooks and :meth:`~tl_directional.measure.Profile.from_cache`,
and the read-only hook actions that feed it during :func:`~tl_directional.measure.profile`'s forwards."""

from __future__ import annotations

from collections import defaultdict

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..core.geometry import compute_dtype, projection_coefficient
from ..core.kernels import Scratch, split_stats, squared_norm, value_stats
from ..core.stats import EXACT_QUANTILE_LIMIT, StreamingSummary
from ..model.handle import StopForward
from ..model.sites import ModelSites, UnitSite, ValueSite
from ..model.weights import attention_output_weights
from .cosine import drop_cosine, stream_beta

RESIDUAL_METRICS = {
    "par_frac": "unit",
    "par_perp_ratio": "positive",
    "alpha": "signed",
    "rel_update": "positive",
    # the layer-drop cosine link (measure/cosine.py): rho = beta / |1 + alpha| and 1 - cos(x, x + u);
    # collected only with profile(..., drop_cosine=True) (they cost about 6% of a profile)
    "drop_rho": "positive",
    "drop_cos_distance": "positive",
}
DROP_COSINE_METRICS = ("drop_rho", "drop_cos_distance")
"""The residual metrics :func:`~tl_directional.measure.profile` adds with ``drop_cosine=True``."""


def check_drop_cosine(drop_cosine) -> bool:
    """``drop_cosine`` if it is a bool; a TypeError naming it otherwise."""
    if not isinstance(drop_cosine, bool):
        raise TypeError(f"drop_cosine must be True (also report the layer-drop cosine columns drop_rho and "
                        f"drop_cos_distance) or False (the default), got {drop_cosine!r}")
    return drop_cosine


def check_exact_quantiles(exact_quantiles) -> int:
    """``exact_quantiles`` if it is an int >= 0; a ValueError naming it, its range and the fix otherwise."""
    if isinstance(exact_quantiles, bool) or not isinstance(exact_quantiles, int) or exact_quantiles < 0:
        raise ValueError(
            f"exact_quantiles must be an int >= 0: the values kept per metric and group for exact quantiles "
            f"(default {EXACT_QUANTILE_LIMIT}; 0 keeps none, quantiles from the fixed histograms, memory flat "
            f"in the corpus length), got {exact_quantiles!r}")
    return exact_quantiles


# Full-aggregate split o_t vs v_t (its energy ratio is the table's energy_ratio_full),
# plus the attention-side factorization in residual coordinates.
VALUE_METRICS = {
    "beta": "signed",
    "A_tt": "unit",
    "gamma": "signed",
    "par_frac_full": "unit",
    "par_perp_ratio_full": "positive",
    "phi": "signed",
    "alpha_head": "signed",
    "self_term": "signed",
    "cross_term": "signed",
}
EXCLUSIVE_METRICS = {"par_frac_exclusive": "unit", "par_perp_ratio_exclusive": "positive"}
# Each head's output z_h split against a user's value-space (d_head) reference, only with
# profile(..., value_reference=...): its scale along the direction, the parallel norm share.
VALUE_REFERENCE_METRICS = {"beta_ref": "signed", "par_frac_ref": "unit", "par_perp_ratio_ref": "positive"}




class _Accumulator:
    """Per-token math shared by streaming hooks and :meth:`Profile.from_cache`.

    Each ``add_*`` method takes full activations plus a ``[batch, pos]`` bool mask
    of the tokens to count; shapes follow TransformerLens conventions. The statistics
    themselves come from :mod:`tl_directional.core.kernels` (one home for both paths). The
    tokens of a batch are selected once per mask (``_select``): when every token counts,
    activations are only reshaped, never gathered; nothing waits on the device per layer.
    """

    def __init__(self, sites: ModelSites, components, device, eps: float, per_token: bool,
                 drop_cosine: bool = False, reference=None, value_reference=None,
                 exact_quantiles: int = EXACT_QUANTILE_LIMIT):
        self.sites = sites
        # values kept per metric and group for exact quantiles (0: histograms only, memory flat in the corpus)
        self.exact_quantiles = exact_quantiles
        # None: every unit against its stream; else a resolved non-stream Reference (model.reference)
        self.reference = None if reference is None or reference.is_stream else reference
        # None: no value_ref columns; else a resolved value-space (d_head) Reference for z_h
        self.value_reference = None if value_reference is None or value_reference.is_stream else value_reference
        self.drop_cosine = drop_cosine
        self.components = tuple(c for c in components if c != "value")
        self.with_value = "value" in components
        self.eps = eps
        self.per_token = per_token
        n_rows = sites.n_layers * len(self.components)
        self.row_of = {
            (L, c): i * sites.n_layers + L for i, c in enumerate(self.components) for L in range(sites.n_layers)
        }
        metrics = RESIDUAL_METRICS if drop_cosine else {
            k: v for k, v in RESIDUAL_METRICS.items() if k not in DROP_COSINE_METRICS}
        self.residual = StreamingSummary(max(n_rows, 1), metrics, device, exact_limit=exact_quantiles)
        n_heads = sites.n_layers * sites.n_heads
        self.value = StreamingSummary(n_heads, VALUE_METRICS, device, exact_limit=exact_quantiles)
        self.value_excl = StreamingSummary(n_heads, EXCLUSIVE_METRICS, device, exact_limit=exact_quantiles)
        self.value_ref = StreamingSummary(n_heads, VALUE_REFERENCE_METRICS, device,
                                          exact_limit=exact_quantiles)
        self.factorization_error = torch.zeros(sites.n_layers, dtype=torch.float64, device=device)
        self.token_rows: list[dict] = []
        self.value_token_rows: list[dict] = []
        self.tokens_seen = 0
        self.sequences_seen = 0
        self._mask = None
        self._index = None  # flat indices of the counted tokens; None when all count
        self._weights: dict[int, tuple] = {}  # layer -> (W_O, b_O), read once per call
        # Reused [n, d] temporaries of the kernels (same values, no fresh activation-sized
        # tensor per product), and the squared norms of the last two references selected
        # (a layer's resid_pre is the reference of attn, block and the value-space x_t).
        self.scratch = Scratch()
        self._ref_sq: list[tuple[Tensor, Tensor]] = []
        # The compute-dtype copies of the last few half-precision streams (a layer's resid_pre is
        # the reference of attn and block, the minuend of block's difference and the value-space
        # x_t: one float32 copy of it, not four); float32 and float64 tensors are never copied.
        self._upcasts: list[tuple[Tensor, Tensor]] = []

    def _select(self, t: Tensor, mask: Tensor) -> Tensor:
        """``t[mask]`` as ``[n, ...]``: a reshape when every token counts, else one gather
        with indices computed once per mask (one host sync per batch, not per layer)."""
        if mask is not self._mask:
            self._mask = mask
            self._index = None if bool(mask.all()) else mask.reshape(-1).nonzero().squeeze(-1)
            self._ref_sq.clear()
        flat = t.reshape(-1, *t.shape[2:])
        return flat if self._index is None else flat.index_select(0, self._index.to(flat.device))

    def _reference_sq(self, reference: Tensor, selected: Tensor) -> Tensor:
        """:func:`~tl_directional.core.kernels.squared_norm` of ``selected`` (``reference`` after
        :meth:`_select` with the current mask), computed once for a reference tensor that
        several units share; the last two are kept (the entry holds the tensor, so its
        identity cannot be reused)."""
        for t, sq in self._ref_sq:
            if t is reference:
                return sq
        sq = squared_norm(selected, self.scratch)
        self._ref_sq.append((reference, sq))
        if len(self._ref_sq) > 2:
            self._ref_sq.pop(0)
        return sq

    def upcast(self, t: Tensor) -> Tensor:
        """``t`` in its compute dtype (:func:`~tl_directional.core.geometry.compute_dtype`): ``t``
        itself unless it is half precision; a half-precision tensor's float32 copy is made once
        and kept for the next two others (the entry holds the tensor, so its identity is not
        reused; :meth:`flush` drops them)."""
        cd = compute_dtype(t.dtype)
        if cd == t.dtype:
            return t
        for src, up in self._upcasts:
            if src is t:
                return up
        up = t.to(cd)
        self._upcasts.append((t, up))
        if len(self._upcasts) > 3:
            self._upcasts.pop(0)
        return up

    def _token_positions(self, mask: Tensor, seq_offset: int):
        b_idx, p_idx = mask.nonzero(as_tuple=True)
        return (b_idx + seq_offset).cpu().numpy(), p_idx.cpu().numpy()

    def flush(self) -> None:
        self._upcasts.clear()
        for s in (self.residual, self.value, self.value_excl, self.value_ref):
            s.flush()

    # -- residual space -------------------------------------------------
    @torch.no_grad()
    def add_residual(
        self,
        layer: int,
        component: str,
        update: Float[Tensor, "batch pos d_model"],
        reference: Float[Tensor, "batch pos d_model"],
        mask: Bool[Tensor, "batch pos"],
        seq_offset: int = 0,
    ) -> Float[Tensor, " n"]:
        """Split the masked tokens of one unit (:func:`~tl_directional.core.kernels.split_stats`);
        returns their ``alpha`` (for the factorization check)."""
        ref = self._select(self.upcast(reference), mask)
        if self.reference is not None:  # a user's direction / subspace instead of the stream
            return self._add_against_reference(layer, component, self._select(update, mask), ref, mask, seq_offset)
        ref_sq = self._reference_sq(reference, ref)
        d = split_stats(self._select(update, mask), ref, self.eps, reference_sq=ref_sq, scratch=self.scratch)
        values = {"par_frac": d.par_frac, "par_perp_ratio": d.par_perp_ratio, "alpha": d.alpha,
                  "rel_update": d.rel_update}
        if self.drop_cosine:
            values["drop_rho"], values["drop_cos_distance"] = drop_cosine(
                d.alpha, stream_beta(d.perp_sq, ref_sq.to(d.perp_sq.dtype), self.eps))
        self._record(layer, component, d, values, mask, seq_offset)
        return d.alpha

    def _add_against_reference(self, layer, component, update, stream, mask, seq_offset) -> Tensor:
        """:meth:`add_residual` against :attr:`reference` (a resolved
        :class:`~tl_directional.model.reference.Reference` that is not the stream); returns the
        stream's ``alpha`` all the same (the value-space factorization check compares with it)."""
        d = self.reference.stats(update, None, layer, self.eps)
        values = {"par_frac": d.par_frac, "par_perp_ratio": d.par_perp_ratio, "alpha": d.alpha,
                  "rel_update": d.rel_update}
        self._record(layer, component, d, values, mask, seq_offset)
        if not (self.with_value and component == "attn"):
            return d.alpha
        return projection_coefficient(update, stream, self.eps)[0]

    def _record(self, layer, component, d, values, mask, seq_offset) -> None:
        row = self.row_of[(layer, component)]
        group = torch.full(d.alpha.shape, row, dtype=torch.long, device=d.alpha.device)
        self.residual.update(group, values, degenerate=d.degenerate, par_sq=d.par_sq, perp_sq=d.perp_sq)
        if self.per_token:
            seq, position = self._token_positions(mask, seq_offset)
            self.token_rows.append({
                "sequence": seq, "position": position,
                "layer": layer, "component": component,
                "alpha": d.alpha.cpu().numpy(), "par_frac": d.par_frac.cpu().numpy(),
                "par_perp_ratio": d.par_perp_ratio.cpu().numpy(),
                "rel_update": d.rel_update.cpu().numpy(), "degenerate": d.degenerate.cpu().numpy(),
            })

    # -- value space ----------------------------------------------------
    @torch.no_grad()
    def add_value(
        self,
        layer: int,
        v: Float[Tensor, "batch pos n_kv_heads d_head"],
        diag: Float[Tensor, "batch pos n_heads"],
        z: Float[Tensor, "batch pos n_heads d_head"],
        x: Float[Tensor, "batch pos d_model"],
        mask: Bool[Tensor, "batch pos"],
        model,
        seq_offset: int = 0,
    ) -> Float[Tensor, " n"]:
        """Value-space quantities of every head at the masked query positions
        (:func:`~tl_directional.core.kernels.value_stats`); ``diag`` is the attention pattern's
        diagonal ``A[h, t, t]`` (see :func:`_pattern_diagonal`).

        Returns the reconstructed attention alpha ``sum_h alpha_h + b_O . x / ||x||^2``
        per masked token (NaN where the factorization does not apply).
        """
        sites = self.sites
        vt = self._select(v, mask)  # [n, n_kv_heads, d_head]: value_stats reads a GQA group's one head
        if layer not in self._weights:
            self._weights[layer] = attention_output_weights(model, layer)
        W_O, b_O = self._weights[layer]
        xs = self._select(self.upcast(x), mask)
        s = value_stats(self._select(z, mask), vt, self._select(diag, mask),
                        xs, W_O, b_O, self.eps, x_sq=self._reference_sq(x, xs), scratch=self.scratch)
        full, excl = s.full, s.exclusive
        recon = s.recon
        if not sites.factorization_applicable:
            recon = torch.full_like(recon, float("nan"))

        n = recon.shape[0]
        heads = torch.arange(sites.n_heads, device=recon.device)
        group = (layer * sites.n_heads + heads).expand(n, -1).reshape(-1)
        self.value.update(
            group,
            {"beta": full.alpha, "A_tt": s.a_tt, "gamma": excl.alpha, "par_frac_full": full.par_frac,
             "par_perp_ratio_full": full.par_perp_ratio, "phi": s.phi, "alpha_head": s.alpha_head,
             "self_term": s.self_term, "cross_term": s.cross_term},
            degenerate=full.degenerate, par_sq=full.par_sq, perp_sq=full.perp_sq,
        )
        self.value_excl.update(
            group,
            {"par_frac_exclusive": excl.par_frac, "par_perp_ratio_exclusive": excl.par_perp_ratio},
            degenerate=excl.degenerate, par_sq=excl.par_sq, perp_sq=excl.perp_sq,
        )
        ref = None
        if self.value_reference is not None:  # z_h [n, heads, d_head] against the layer's d_head reference
            ref = self.value_reference.stats(self._select(z, mask), None, layer, self.eps)
            self.value_ref.update(
                group, {"beta_ref": ref.alpha.reshape(-1), "par_frac_ref": ref.par_frac.reshape(-1),
                        "par_perp_ratio_ref": ref.par_perp_ratio.reshape(-1)},
                degenerate=ref.degenerate.reshape(-1), par_sq=ref.par_sq.reshape(-1),
                perp_sq=ref.perp_sq.reshape(-1))
        if self.per_token:
            seq, position = self._token_positions(mask, seq_offset)
            for h in range(sites.n_heads):
                self.value_token_rows.append({
                    "sequence": seq, "position": position,
                    "layer": layer, "head": h,
                    "beta": full.alpha[:, h].cpu().numpy(), "A_tt": s.a_tt[:, h].float().cpu().numpy(),
                    "gamma": excl.alpha[:, h].cpu().numpy(), "phi": s.phi[:, h].cpu().numpy(),
                    "alpha_head": s.alpha_head[:, h].cpu().numpy(),
                    **({} if ref is None else {"beta_ref": ref.alpha[:, h].cpu().numpy(),
                                               "par_frac_ref": ref.par_frac[:, h].cpu().numpy()}),
                })
        return recon

    @torch.no_grad()
    def add_factorization_check(self, layer: int, alpha_attn: Tensor, recon: Tensor) -> None:
        if alpha_attn.numel() == 0:
            return
        err = (alpha_attn.double() - recon.double()).abs().max().to(self.factorization_error.device)
        # fmax ignores NaN (models where the factorization does not apply), as max() did
        self.factorization_error[layer] = torch.fmax(self.factorization_error[layer], err)


def _pattern_diagonal(pattern: Float[Tensor, "batch n_heads query key"]) -> Float[Tensor, "batch pos n_heads"]:
    """``A[h, t, t]`` as a compact copy: a view would keep the whole ``[B, H, T, T]``
    pattern alive until the layer's ``z`` arrives."""
    return pattern.diagonal(dim1=-2, dim2=-1).transpose(1, 2).contiguous()


def _with_stop(hooks: list, stop_at: str, state: dict, n_actions: int) -> list:
    """``hooks`` with :class:`~tl_directional.model.handle.StopForward` raised on ``stop_at`` after
    that hook's own measuring work, once all ``n_actions`` measuring actions of the forward
    have run."""

    def then_stop(fn):
        def hook(tensor, hook):
            out = None if fn is None else fn(tensor, hook)
            if state["done"] >= n_actions:
                raise StopForward
            return out
        return hook

    out = [(name, then_stop(fn) if name == stop_at else fn) for name, fn in hooks]
    if stop_at not in {name for name, _ in hooks}:
        out.append((stop_at, then_stop(None)))
    return out


def _all_reduce_accumulator(acc: _Accumulator) -> None:
    """Sum every streaming sum and histogram over the ranks (exact: float64 / int64)."""
    import torch.distributed as dist

    for s in (acc.residual, acc.value, acc.value_excl, acc.value_ref):
        s.all_reduce_()
    dist.all_reduce(acc.factorization_error, op=dist.ReduceOp.MAX)
    counts = torch.tensor([acc.tokens_seen, acc.sequences_seen], dtype=torch.long,
                          device=acc.factorization_error.device)
    dist.all_reduce(counts)
    acc.tokens_seen, acc.sequences_seen = int(counts[0]), int(counts[1])


def _streaming_hooks(acc: _Accumulator, sites: ModelSites, model, state: dict) -> tuple[list, int]:
    """Read-only hooks, one function per hook name, that feed the accumulator, and the number
    of actions they run per forward (each counts itself in ``state["done"]``).

    Each layer's hooks store the tensors they are needed as (references, v,
    pattern) and compute a unit as soon as everything it needs has been seen,
    whatever order the architecture fires them in.
    """
    actions: dict[str, list] = defaultdict(list)

    def store(key):
        def act(t):
            state[key] = t
        return act

    def counted(f):
        def act(t):
            f(t)
            state["done"] += 1
        return act

    for L in range(sites.n_layers):
        refs = {sites.units[c][L].reference_hook for c in acc.components}
        if acc.with_value:
            refs.add(sites.value[L].resid_hook)
            refs.add(sites.units["attn"][L].reference_hook)
        for r in refs:
            actions[r].append(store(("ref", r)))
        for comp in acc.components:
            u = sites.units[comp][L]
            actions[u.update_hook].append(_residual_action(acc, u, state))
        if acc.with_value:
            vs = sites.value[L]
            if "attn" not in acc.components:
                actions[sites.units["attn"][L].update_hook].append(
                    _alpha_only_action(acc, sites.units["attn"][L], state))
            for key, hook in (("v", vs.v_hook), ("pattern", vs.pattern_hook), ("z", vs.z_hook)):
                actions[hook].append(_value_action(acc, vs, key, state, model))

    def make(funcs):
        def hook(tensor, hook):  # noqa: ARG001 - TL hook signature
            for f in funcs:
                f(tensor)
            # None: the activation is unchanged (and the bridge skips converting it back)
        return hook

    n_actions = sum(len(f) for f in actions.values())
    return [(name, make([counted(f) for f in funcs])) for name, funcs in actions.items()], n_actions


def _residual_action(acc: _Accumulator, u: UnitSite, state: dict):
    def act(t):
        ref = state[("ref", u.reference_hook)]
        if not u.update_is_difference:
            update = t
        elif (t.is_contiguous() and ref.is_contiguous() and t.shape == ref.shape and t.dtype == ref.dtype
              and compute_dtype(t.dtype) == t.dtype):
            update = torch.sub(t, ref, out=acc.scratch.get("diff", tuple(t.shape), t.dtype, t.device))
        else:
            # a half-precision model: difference the two streams in the compute dtype, or the
            # block update would be rounded to 8 (bf16) / 11 (fp16) bits before it is split
            cd = compute_dtype(t.dtype)
            update = t.to(cd) - acc.upcast(ref)
        alpha = acc.add_residual(u.layer, u.component, update, ref, state["mask"], state["seq_offset"])
        if u.component == "attn":
            _factorization_meet(acc, u.layer, state, alpha=alpha)
    return act


def _alpha_only_action(acc: _Accumulator, u: UnitSite, state: dict):
    def act(t):
        ref = state[("ref", u.reference_hook)]
        mask = state["mask"]
        alpha = projection_coefficient(acc._select(t, mask), acc._select(ref, mask), acc.eps)[0]
        _factorization_meet(acc, u.layer, state, alpha=alpha)
    return act


def _factorization_meet(acc: _Accumulator, layer: int, state: dict, *, alpha=None, recon=None) -> None:
    """Compare residual alpha and value-space reconstruction once both exist."""
    if not acc.with_value:
        return
    key = ("fact", layer)
    slot = state.setdefault(key, {})
    if alpha is not None:
        slot["alpha"] = alpha
    if recon is not None:
        slot["recon"] = recon
    if "alpha" in slot and "recon" in slot:
        acc.add_factorization_check(layer, slot["alpha"], slot["recon"])
        state.pop(key)


def _value_action(acc: _Accumulator, vs: ValueSite, key: str, state: dict, model):
    def act(t):
        # keep only the pattern's diagonal, a copy, not the whole [B, H, T, T] pattern
        state[("value", vs.layer, key)] = _pattern_diagonal(t) if key == "pattern" else t
        got = [state.get(("value", vs.layer, k)) for k in ("v", "pattern", "z")]
        if any(g is None for g in got):
            return
        v, diag, z = got
        x = state[("ref", vs.resid_hook)]
        recon = acc.add_value(vs.layer, v, diag, z, x, state["mask"], model, state["seq_offset"])
        for k in ("v", "pattern", "z"):
            state.pop(("value", vs.layer, k))
        _factorization_meet(acc, vs.layer, state, recon=recon)
    return act
