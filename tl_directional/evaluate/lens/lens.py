"""A split logit lens: per layer and position, the lens logit of a target token and how much of
each layer's change in it comes from the parallel and from the perpendicular part of the layer's
updates (METHOD.md sec. 2 for the split, docs/method.md "Split logit lens" for the maths).

The lens reads the residual stream entering each block (and leaving the last one) through the
final norm with its statistics recomputed on that stream, then the unembedding, exactly as
TransformerLens 4.3's ``transformer_lens.tools.analysis.logit_lens.logit_lens`` does. A layer's
change in the lens logit is then split along a path: each sub-layer's update ``u`` is split against
the stream ``x`` it is added to, ``u = u_par + u_perp`` with ``u_par = a x``, and

    parallel first:       [f(x + u_par)  - f(x)] + [f(x + u) - f(x + u_par)]
    perpendicular first:  [f(x + u_perp) - f(x)] + [f(x + u) - f(x + u_perp)]

each of which adds up to ``f(x + u) - f(x)`` by construction; the reported ``parallel`` /
``perpendicular`` columns are their average (the two-player Shapley value), and both orderings are
kept. Everything runs without gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ...core.errors import renamed_argument
from ...core.geometry import DEFAULT_EPS, check_eps, dtype_tolerance
from ...figures.lens import split_lens_figure
from ...model.handle import capture, device_of
from ...model.reference import resolve_reference
from ...model.sites import POST_LN, SEQUENTIAL, analysis_sites, check_hook_api
from .lens_inputs import (
    LensInputError,
    _check_ordering,
    _check_positions,
    _check_targets,
    _lens_inputs,
)


@dataclass(frozen=True)
class _Step:
    """One sub-layer step of the path: ``start + update`` should equal ``end`` (all cached)."""

    component: str  # "attn", "mlp", or "attn+mlp" for a parallel block
    start: str  # hook of the stream the update is added to (also its reference)
    updates: tuple[str, ...]  # hooks whose sum is the update


@dataclass
class SplitLensResult:
    """Result of :func:`split_logit_lens`. Logit values are float64; shapes below use ``L`` =
    ``n_layers``, ``C`` = sub-layer steps per layer (2 for sequential blocks: ``attn``, ``mlp``;
    1 for parallel attention+MLP blocks: ``attn+mlp``).

    Attributes:
        lens_logits: ``[L + 1, batch, pos]`` lens logit of the target token read from the stream
            entering block 0 (the embedding), entering block 1, ..., and leaving block ``L-1``
            (TransformerLens's ``accumulated_resid`` entries ``0_pre ... final_post``).
        full: ``[L, batch, pos]`` change of the lens logit across block ``l``
            (``lens_logits[l + 1] - lens_logits[l]``).
        parallel_if_first / parallel_if_last: ``[L, C, batch, pos]`` the parallel part's
            contribution per step when it is added before / after the perpendicular part.
        step_full: ``[L, C, batch, pos]`` change of the lens logit across each step.
        components: the ``C`` step names.
        targets: ``[batch, pos]`` target token id at each position.
        additive_error: ``[L, C]`` largest ``|start + update - end|`` of each step's cached
            tensors (the stream identity the split relies on; absorbed by the path's last leg).
        ordering: which ordering :meth:`to_frame` reports as ``parallel`` / ``perpendicular``.
        reference: what each update was split against (``"stream"``, the default, or the
            resolved reference's description, e.g. ``"subspace(k=3)"``).
        random_energy_share: ``k / d_model`` of that reference (``1 / d_model`` for the stream
            and a direction): a random update's expected parallel energy share.
        positions: ``[pos]`` the token position of each entry of the ``pos`` axis (absolute,
            ``0 .. n_tokens - 1``): every position by default, the selected ones with
            ``split_logit_lens(positions=...)``; ``to_frame``'s ``position`` column. None reads
            as ``arange(pos)``.
    """

    lens_logits: Float[Tensor, "entries batch pos"]
    full: Float[Tensor, "layers batch pos"]
    parallel_if_first: Float[Tensor, "layers steps batch pos"]
    parallel_if_last: Float[Tensor, "layers steps batch pos"]
    step_full: Float[Tensor, "layers steps batch pos"]
    components: tuple[str, ...]
    targets: Int[Tensor, "batch pos"]
    additive_error: Float[Tensor, "layers steps"]
    ordering: str = "shapley"
    notes: list[str] = field(default_factory=list)
    reference: str = "stream"
    random_energy_share: float | None = None
    positions: Int[Tensor, " pos"] | None = None

    def _position_grid(self) -> Tensor:
        """``[pos]`` the token positions of the ``pos`` axis."""
        n_pos = self.full.shape[-1]
        return torch.arange(n_pos) if self.positions is None else self.positions.cpu()

    def parallel_steps(
        self, ordering: str | None = None
    ) -> Float[Tensor, "layers steps batch pos"]:
        """Per-step parallel contribution under ``ordering`` (default: the result's own)."""
        ordering = _check_ordering(ordering or self.ordering)
        if ordering == "parallel_first":
            return self.parallel_if_first
        if ordering == "perpendicular_first":
            return self.parallel_if_last
        return 0.5 * (self.parallel_if_first + self.parallel_if_last)

    def parallel(self, ordering: str | None = None) -> Float[Tensor, "layers batch pos"]:
        """``[L, batch, pos]`` the parallel parts' share of each layer's change (sum over steps)."""
        return self.parallel_steps(ordering).sum(1)

    def perpendicular(self, ordering: str | None = None) -> Float[Tensor, "layers batch pos"]:
        """``[L, batch, pos]`` the perpendicular parts' share: ``full - parallel`` per step, summed."""
        return (self.step_full - self.parallel_steps(ordering)).sum(1)

    def to_frame(self, ordering: str | None = None, *, by_component: bool = False) -> pd.DataFrame:
        """One row per (layer, batch, position) (and component with ``by_component=True``).

        Columns: ``layer``, ``batch``, ``position``, (``component``), ``target``,
        ``logit_before`` / ``logit_after`` (the lens logit entering / leaving the layer; per
        component: the path's points), ``full``, ``parallel``, ``perpendicular`` (under
        ``ordering``, default the result's own), and ``parallel_if_first`` /
        ``parallel_if_last`` (both orderings, so the order dependence is visible).
        ``parallel + perpendicular == full`` on every row.
        """
        ordering = _check_ordering(ordering or self.ordering)
        par_steps = self.parallel_steps(ordering)
        n_layers, n_steps, batch, pos = self.step_full.shape
        layer, b, p = torch.meshgrid(
            torch.arange(n_layers), torch.arange(batch), self._position_grid(), indexing="ij"
        )
        if not by_component:
            before, after = self.lens_logits[:-1], self.lens_logits[1:]
            cols = {
                "layer": layer,
                "batch": b,
                "position": p,
                "target": self.targets.expand(n_layers, batch, pos),
                "logit_before": before,
                "logit_after": after,
                "full": self.full,
                "parallel": par_steps.sum(1),
                "perpendicular": (self.step_full - par_steps).sum(1),
                "parallel_if_first": self.parallel_if_first.sum(1),
                "parallel_if_last": self.parallel_if_last.sum(1),
            }
            return pd.DataFrame({k: v.reshape(-1).cpu().numpy() for k, v in cols.items()})
        frames = []
        before = self.lens_logits[:-1]
        for c, name in enumerate(self.components):
            cols = {
                "layer": layer,
                "batch": b,
                "position": p,
                "target": self.targets.expand(n_layers, batch, pos),
                "logit_before": before,
                "logit_after": before + self.step_full[:, c],
                "full": self.step_full[:, c],
                "parallel": par_steps[:, c],
                "perpendicular": self.step_full[:, c] - par_steps[:, c],
                "parallel_if_first": self.parallel_if_first[:, c],
                "parallel_if_last": self.parallel_if_last[:, c],
            }
            frame = pd.DataFrame({k: v.reshape(-1).cpu().numpy() for k, v in cols.items()})
            frame.insert(3, "component", name)
            frames.append(frame)
            before = before + self.step_full[:, c]
        return (
            pd.concat(frames, ignore_index=True)
            .sort_values(["layer", "batch", "position"], kind="stable")
            .reset_index(drop=True)
        )

    def shares(
        self, position: int = -1, batch: int = 0, ordering: str | None = None
    ) -> dict[str, float]:
        """How the final lens logit at one position was built: the embedding's lens logit, the sum
        over layers of the parallel and of the perpendicular parts (under ``ordering``), and each
        part's share of the total change ``final - embedding``. ``position`` indexes the result's
        ``pos`` axis (the selected positions when the lens was called with ``positions=``)."""
        n_batch, n_pos = self.full.shape[-2:]
        for name, value, n in (("batch", batch, n_batch), ("position", position, n_pos)):
            if isinstance(value, bool) or not isinstance(value, int) or not -n <= value < n:
                raise LensInputError(f"shares({name}={value!r}): the result has {n} "
                                     f"{'sequences' if name == 'batch' else 'positions'}; pass an int "
                                     f"in [{-n}, {n - 1}]")
        par = float(self.parallel(ordering)[:, batch, position].sum())
        perp = float(self.perpendicular(ordering)[:, batch, position].sum())
        total = float(self.full[:, batch, position].sum())
        return {
            "embedding_logit": float(self.lens_logits[0, batch, position]),
            "final_logit": float(self.lens_logits[-1, batch, position]),
            "parallel": par,
            "perpendicular": perp,
            "change": total,
            "parallel_share": par / total if total else float("nan"),
            "perpendicular_share": perp / total if total else float("nan"),
        }

    def figure(self, batch: int = 0, ordering: str | None = None):
        """Heat maps layer x position of ``full``, ``parallel``, ``perpendicular`` (plotly, see
        :func:`tl_directional.figures.lens.split_lens_figure`)."""
        return split_lens_figure(self.to_frame(ordering), batch=batch)


def _soft_cap(model):
    """The elementwise map the model applies to its logits after the unembedding (Gemma-2
    softcap, logit scales), as TransformerLens's lens applies it; identity when there is none."""
    adapter = getattr(model, "adapter", None)
    transform = getattr(adapter, "apply_output_logits_transform", None)
    if callable(transform):
        return transform
    cap = float(getattr(model.cfg, "output_logits_soft_cap", 0.0) or 0.0)
    if cap > 0:
        return lambda x: cap * torch.tanh(x / cap)
    return lambda x: x


class _Reader:
    """The lens map ``f``: stream ``[batch, pos, d_model]`` -> target logit ``[batch, pos]``, through
    the model's own final norm module (statistics recomputed on the given stream) and unembedding."""

    def __init__(self, model, targets: Tensor):
        self.ln_final = (
            getattr(model, "ln_final", None) if model.cfg.normalization_type is not None else None
        )
        self.w_u = model.W_U
        # Only the distinct target columns are unembedded; a row-times-columns matmul (as
        # TransformerLens's readout does over the full vocabulary) keeps parity to float rounding.
        ids, self.index = torch.unique(targets.to(self.w_u.device), return_inverse=True)
        self.columns = self.w_u[:, ids]
        b_u = getattr(model, "b_U", None)
        self.bias = b_u[ids] if b_u is not None else torch.zeros_like(self.columns[0])
        self.transform = _soft_cap(model)

    def __call__(self, x: Tensor) -> Tensor:
        x = x.to(self.w_u.dtype)
        if self.ln_final is not None:
            x = self.ln_final(x)
        logits = self.transform(x @ self.columns + self.bias)  # [batch, pos, n_distinct]
        return logits.gather(-1, self.index.unsqueeze(-1)).squeeze(-1).double()


def _steps(sites, layer: int) -> list[_Step]:
    b = f"blocks.{layer}"
    if sites.arch == SEQUENTIAL:
        attn, mlp = sites.units["attn"][layer], sites.units["mlp"][layer]
        return [
            _Step("attn", attn.reference_hook, (attn.update_hook,)),
            _Step("mlp", mlp.reference_hook, (mlp.update_hook,)),
        ]
    # Parallel attention + MLP: both are split against resid_pre, and the split is linear in the
    # update, so the block's parallel part is the sum of the two (a pure rescale of resid_pre).
    return [
        _Step(
            "attn+mlp",
            f"{b}.hook_resid_pre",
            (sites.units["attn"][layer].update_hook, sites.units["mlp"][layer].update_hook),
        )
    ]


def _walk(steps: list[list[_Step]], stream: list[str], acts: dict[str, Tensor], f: _Reader, split_ref,
          eps: float, check_additivity: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Each block's path of steps over the cached ``acts``: ``(lens [L + 1, batch, pos],
    parallel_if_first, parallel_if_last, step_full [L, C, batch, pos], additive_error [L, C])``."""
    n_layers = len(steps)
    lens = torch.stack([f(acts[name]) for name in stream])  # [L + 1, batch, pos]
    batch, pos = lens.shape[1:]
    n_steps = len(steps[0])
    par_first = torch.zeros(n_layers, n_steps, batch, pos, dtype=torch.float64, device=lens.device)
    par_last = torch.zeros_like(par_first)
    step_full = torch.zeros_like(par_first)
    err = torch.zeros(n_layers, n_steps, dtype=torch.float64)
    tol = dtype_tolerance(acts[stream[0]].dtype)
    for L, row in enumerate(steps):
        f_start = lens[L]
        for c, step in enumerate(row):
            x = acts[step.start]
            u = sum(acts[h] for h in step.updates)
            last = c == len(row) - 1
            end = acts[stream[L + 1]] if last else acts[row[c + 1].start]
            f_end = lens[L + 1] if last else f(end)
            err[L, c] = float((x + u - end).abs().max())
            scale = float(end.abs().max()) + 1.0
            if check_additivity and float(err[L, c]) > tol * scale:
                raise LensInputError(
                    f"layer {L} {step.component}: {step.start} + {' + '.join(step.updates)} differs from the next "
                    f"stream by {float(err[L, c]):.3g} (tolerance {tol * scale:.3g}), so these hooks are not the "
                    "stream's additive updates on this model; pass check_additivity=False only if you know why"
                )
            # The parallel part along the stream the update is added to (METHOD sec. 1-2), in the
            # stream's dtype so that x + u_par is a real stream point of this model.
            u_par = split_ref.parallel(u, x, L, eps).to(x.dtype)
            u_perp = u - u_par
            par_first[L, c] = f(x + u_par) - f_start
            par_last[L, c] = f_end - f(x + u_perp)
            step_full[L, c] = f_end - f_start
            f_start = f_end
    return lens, par_first, par_last, step_full, err


@torch.no_grad()
def split_logit_lens(
    model,
    tokens=None,
    *,
    targets=None,
    cache=None,
    positions=None,
    ordering: str = "shapley",
    eps: float = DEFAULT_EPS,
    check_additivity: bool = True,
    attention_mask: Tensor | None = None,
    target_tokens=None,
    reference=None,
    per_layer: bool | None = None,
) -> SplitLensResult:
    """Split logit lens of ``targets`` over every layer and position (or the selected
    ``positions``) of ``tokens``.

    The lens logit of the stream ``x`` (``[d_model]`` at one position) is
    ``f(x) = ln_final(x) . W_U[:, target] + b_U[target]`` with the final norm's statistics
    recomputed on ``x`` (and the model's elementwise logit transform, e.g. a softcap). The stream
    entries are those of TransformerLens's lens: ``blocks.l.hook_resid_pre`` for every ``l`` and
    the last ``hook_resid_post``, so ``result.lens_logits`` equals
    ``logit_lens(model, tokens, positions=None, targets=...)``'s values. Each block is a path of
    sub-layer steps (sequential blocks: attention split against ``hook_resid_pre``, then the MLP
    against ``hook_resid_mid``; parallel blocks: their summed update against ``hook_resid_pre``;
    sandwich-norm blocks: the post-norm output that is added to the stream). For a step from
    ``x`` with update ``u = u_par + u_perp``:

    * parallel first: ``parallel = f(x + u_par) - f(x)``, ``perpendicular = f(end) - f(x + u_par)``;
    * perpendicular first: ``perpendicular = f(x + u_perp) - f(x)``, ``parallel = f(end) - f(x + u_perp)``;
    * ``shapley`` (default): the average of the two.

    ``end`` is the cached next stream, so the parts add up to the lens's own change exactly (up to
    float64 rounding of the differences). With a final RMSNorm or LayerNorm ``f((1+a) x) = f(x)``
    for ``1 + a > 0`` up to the norm's ``eps``, so the parallel-first parallel part is ~0: see
    docs/method.md ("Split logit lens") for what the orderings mean.

    Args:
        model: a TransformerLens model (bridge or legacy) in eval mode, pre-LN (sequential,
            parallel or sandwich-norm blocks; GQA included).
        tokens: what TransformerLens 4.3's ``logit_lens`` takes as ``input``, in the same place:
            ``[batch, pos]`` integer token ids (a 1-D tensor is one sequence), a text, or a list
            of texts. Texts are tokenised one by one with the model's own ``to_tokens`` (BOS
            prepended as the model does by default), so one text or texts of one length give
            exactly ``model.to_tokens(texts)``; texts of unequal lengths are right-padded here
            with an ``attention_mask`` built from their lengths (never guessed from pad ids),
            whatever the tokenizer's padding side: every real token keeps its position and, in a
            causal model, never attends to the padding, so a text's values equal its own run's
            up to batched round-off, and padded positions are NaN. A text longer than ``n_ctx``
            is refused. None with ``cache=`` (the cache's own batch and positions). Checked here
            rather than by annotation so that a bad value gets this function's error.
        targets: the token whose lens logit is read (TransformerLens 4.3's ``logit_lens`` name;
            the old keyword ``target_tokens`` raises a renamed-argument error): one id or single-token string for
            every position, one per sequence (``[batch]``), or one per position (``[batch, pos]``,
            e.g. next-token ids; with ``positions=``, ``[batch, n_selected]``, aligned with the
            selected positions as TransformerLens's are).
        cache: an ``ActivationCache`` (or a mapping of hook names to tensors) from
            ``model.run_with_cache(tokens)``: the lens reads the stream (``hook_resid_pre``,
            ``hook_resid_mid``, the last ``hook_resid_post``) and the update hooks
            (``hook_attn_out``, ``hook_mlp_out``, or a sandwich norm's output) from it, without
            running the model; the result equals the uncached call's. A hook missing from it (a
            ``names_filter`` that dropped it) is an error naming the hooks and the
            ``names_filter`` that keeps them. ``tokens`` must then be None or the token tensor
            the cache was run on (texts are refused: tokenised here they might be padded
            unlike the cached run); ``attention_mask`` marks a padded cached batch.
        positions: which token positions the lens reads (TransformerLens 4.3's ``logit_lens``
            name, its ``Slice`` inputs): None (default, unlike TL's ``-1``: every position), an
            int, a ``slice``, a ``(start, stop[, step])`` tuple, or a list / 1-D integer tensor
            of positions; negative indices count from the end of the (padded) sequence; a
            position outside it is an error. The forward still runs on every token; the
            result's ``pos`` axis is the selected positions (kept for an int too, unlike TL),
            and ``result.positions`` holds their indices.
        ordering: which ordering ``to_frame`` reports (``"shapley"``, ``"parallel_first"``,
            ``"perpendicular_first"``); all are kept in the result.
        eps: degenerate threshold of the split (METHOD sec. 1): a stream with ``||x||^2 <= eps``
            gets no parallel part.
        check_additivity: raise unless every step's cached ``start + update`` equals the next
            cached stream to the dtype's tolerance (the identity the split rests on).
        attention_mask: ``[batch, pos]`` of 0 (padding) / 1 (token), bool or integer, for a
            padded batch: the forward masks the padding, and every value at a padded position
            is NaN in the result (a padded position has no lens). Without it every position is a
            token: a padded batch then gives wrong values at the rows' real tokens too.
        reference: what each step's update is split against
            (:func:`~tl_directional.model.reference.resolve_reference`, residual space): None /
            ``"input"`` (default: the stream ``x`` it is added to, exactly as without the
            argument), a ``[d_model]`` direction (``u_par = a r``), a ``[n_layers, d_model]``
            per-layer set (``per_layer=True``; row ``L`` for block ``L``'s steps), a ``[k, d_model]``
            subspace (``u_par`` its orthogonal projection, orthonormalised in float64), or a
            ``Direction(space="resid")``. The orderings and the exact additivity are unchanged.
        per_layer: read a 2-D ``reference`` as one row per layer (True) or a subspace (False).

    Returns:
        A :class:`SplitLensResult` (float64 values; ``.to_frame()``, ``.figure()``, ``.shares()``).

    Raises:
        LensInputError: bad ``tokens`` (ids or texts), ``cache`` (missing hooks, wrong
            shapes, texts beside it), ``positions``, ``targets`` or ``ordering``, a model in
            training mode, a post-LN (encoder) model, or a broken stream identity.
        SubspaceError: (a ``ValueError``) an unusable ``reference`` (see
            :func:`~tl_directional.model.reference.resolve_reference`).
    """
    check_hook_api(model)
    ordering = _check_ordering(ordering)
    eps = check_eps(eps)
    if target_tokens is not None:
        raise renamed_argument("split_logit_lens", "target_tokens", "targets")
    split_ref = resolve_reference(model, reference, per_layer=per_layer)
    sites = analysis_sites(model, "split_logit_lens", LensInputError, "dropout would make the lens random")
    if sites.arch == POST_LN:
        raise LensInputError(
            f"model {sites.model_name} is a post-LN encoder; the logit lens needs a pre-LN decoder "
            "whose stream is read by a final norm and an unembedding"
        )
    n_layers = sites.n_layers
    steps = [_steps(sites, L) for L in range(n_layers)]
    stream = [f"blocks.{L}.hook_resid_pre" for L in range(n_layers)] + [
        f"blocks.{n_layers - 1}.hook_resid_post"
    ]
    names = sorted(
        set(stream)
        | {s.start for row in steps for s in row}
        | {u for row in steps for s in row for u in s.updates}
    )
    (batch, n_tokens), mask, tokens, acts = _lens_inputs(model, tokens, attention_mask, cache, names)
    index = _check_positions(positions, n_tokens)
    pos = n_tokens if index is None else int(index.numel())
    targets = _check_targets(model, targets, batch, pos, selected=index is not None)
    if acts is None:
        device = device_of(model)
        am = None if mask is None else mask.long().to(device)
        _, acts = capture(model, tokens.to(device), names, attention_mask=am)
    if index is not None:  # the forward saw every token; the lens reads the selected positions
        acts = {h: t[:, index.to(t.device)] for h, t in acts.items()}
        mask = None if mask is None else mask[:, index]

    f = _Reader(model, targets)
    lens, par_first, par_last, step_full, err = _walk(steps, stream, acts, f, split_ref, eps, check_additivity)
    notes = list(sites.notes)
    if mask is not None:  # a padded position has no lens: NaN, not a number that looks like one
        pad = ~mask.to(lens.device)
        for t in (lens, par_first, par_last, step_full):
            t[..., pad] = float("nan")
    return SplitLensResult(
        lens_logits=lens.cpu(),
        full=(lens[1:] - lens[:-1]).cpu(),
        parallel_if_first=par_first.cpu(),
        parallel_if_last=par_last.cpu(),
        step_full=step_full.cpu(),
        components=tuple(s.component for s in steps[0]),
        targets=targets,
        additive_error=err,
        ordering=ordering,
        notes=notes,
        reference=split_ref.describe(),
        random_energy_share=split_ref.random_energy_share,
        positions=torch.arange(n_tokens) if index is None else index,
    )


__all__ = ["SplitLensResult", "split_logit_lens"]
