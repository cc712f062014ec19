"""Evaluate: what an edit does to behaviour (component-scaling sweeps, safe-scale search).

:func:`sweep` runs a grid of edit settings over a token set and reports, per
setting, the token-weighted next-token loss and perplexity against the
unedited baseline, the mean ``KL(base || edited)`` of next-token
distributions, and top-1 agreement. The corpus is processed batch by batch
(memory bounded by one batch), the baseline forward of each batch is computed
once and shared by every setting, settings that differ only in their scales
can be stacked along the batch (per-row scales), and progress is checkpointed
so an interrupted sweep resumes where it stopped. Under ``torchrun`` each rank
evaluates a shard of the batches and the sums are all-reduced.

The metrics are registries in :mod:`tl_directional.evaluate.sweeps.metrics` (adding one is one
entry); :func:`find_safe_scale` (in :mod:`tl_directional.evaluate.sweeps.safe_scale`) searches the widest
scale interval around 1 whose damage stays within a budget. Both are re-exported here.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ...edit import EDIT_SPACES, NonFiniteEditError, apply_edits, scales
from ...io.distributed import rank_and_world, release_captured_groups
from ...io.locks import exclusive_lock
from ...model.finite import nonfinite_message
from ...model.handle import (
    StopForward,
    capture_hooks,
    device_of,
    forward_recording_block_input,
    from_block,
    unembedding,
    unembedding_matches,
)
from ...model.indices import normalize_layers, scale_list
from ...model.inputs import TokenBatch, iter_batches, prepare_inputs
from ...model.lanes import BlockInput, Unembedding
from ...model.sites import analysis_sites
from . import metrics as _metrics
from .metrics import METRICS, BaselineStats, MetricSums
from .setting import Setting
from .sweep_store import (
    CheckpointMismatch,
    SweepProgress,
    model_fingerprint,
    save_progress,
    tokens_sha256,
)


def grid(
    spaces: str | Sequence[str],
    s_par: Sequence[float] | float | str = (1.0,),
    s_perp: Sequence[float] | float | str = (1.0,),
    layers: Any = None,
) -> list[Setting]:
    """The product grid of spaces x s_par x s_perp x layer sets (duplicates dropped).

    ``hard-diag`` ignores scales (one setting per layer set); ``eff-diag`` only
    takes ``s_perp = 1``: an ``s_perp`` other than 1 with ``eff-diag`` among ``spaces`` is a
    ValueError naming the space (never a silently dropped setting). ``s_par`` / ``s_perp``: a number, a list of numbers or a comma
    string (``"-1,0,0.5"``). ``layers``: a list of layer sets, e.g. ``[None, [0, 1], range(2, 4)]``.
    """
    if isinstance(spaces, str):
        spaces = [s.strip() for s in spaces.split(",") if s.strip()]
    if not spaces:
        raise ValueError("spaces is empty; choose from " + ", ".join(sorted(EDIT_SPACES)))
    s_par, s_perp = scale_list(s_par, "s_par"), scale_list(s_perp, "s_perp")  # 0.5, "-1,0" or lists
    if layers is not None and any(isinstance(ls, int) for ls in layers):
        raise TypeError(f"layers={layers!r} must be a list of layer sets, e.g. [[0, 1]] for one setting on "
                        "layers 0 and 1, [[0], [1]] for two, or None for all layers")
    for ls in layers or ():
        bad = [x for x in (ls or ()) if isinstance(x, bool) or not isinstance(x, numbers.Integral)]
        if bad:  # int(0.5) would silently edit layer 0
            raise TypeError(f"layers has {bad[0]!r} ({type(bad[0]).__name__}) in the layer set {list(ls)!r}; "
                            "layer sets hold ints, e.g. [[0, 1]]")
    layer_sets = [None] if layers is None else [None if ls is None else tuple(int(x) for x in ls) for ls in layers]
    out: list[Setting] = []
    for space in spaces:
        if space not in EDIT_SPACES:
            raise ValueError(f"spaces has unknown space {space!r}; choose from {', '.join(sorted(EDIT_SPACES))}")
        other = [float(sq) for sq in s_perp if float(sq) != 1.0]
        if EDIT_SPACES[space].scaled and not EDIT_SPACES[space].perp and other:
            # a dropped setting would leave a requested space out of the table without a word
            raise ValueError(
                f"spaces has {space!r}, which scales only the parallel part (s_perp must be 1), but s_perp "
                f"(--s-perp) has {', '.join(f'{v:g}' for v in other)}; sweep {space!r} in a grid of its own "
                f"with s_perp=1 (on the command line: a separate run with --s-perp 1), or leave it out of spaces")
        for ls in layer_sets:
            if not EDIT_SPACES[space].scaled:
                out.append(Setting(space, 1.0, 1.0, ls))
                continue
            for sp in s_par:
                for sq in s_perp:
                    out.append(Setting(space, float(sp), float(sq), ls))
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


# ---------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------


def _forward(model, batch: TokenBatch):
    return model(batch.tokens, attention_mask=batch.attention_mask)


def _stack_groups(settings: Sequence[Setting], width: int) -> list[list[Setting]]:
    """Group settings that differ only in scales (same space and layers), in chunks of ``width``."""
    groups: dict[tuple, list[Setting]] = {}
    for s in settings:
        key = (s.space, s.layers, s.layer_s_par is not None)
        groups.setdefault(key, []).append(s)
    out = []
    for members in groups.values():
        # nothing to stack (hard-diag); per-layer scales have no batch axis to stack along
        if not EDIT_SPACES[members[0].space].scaled or members[0].layer_s_par is not None:
            out += [[m] for m in members]
            continue
        for i in range(0, len(members), width):
            out.append(members[i:i + width])
    return out


def _eval_group(model, batch: TokenBatch, base: BaselineStats, group: list[Setting],
                prefix: BlockInput | None = None, unembed: Unembedding | None = None) -> list[MetricSums]:
    k, b = len(group), len(batch)
    if k == 1:
        edits = group[0].edits()
    else:
        batch = TokenBatch(batch.tokens.repeat(k, 1), batch.attention_mask.repeat(k, 1))
        s_par = scales(torch.tensor([s.s_par for s in group], dtype=torch.float64).repeat_interleave(b), "batch")
        s_perp = scales(torch.tensor([s.s_perp for s in group], dtype=torch.float64).repeat_interleave(b), "batch")
        edits = group[0].edits(s_par=s_par, s_perp=(s_perp if EDIT_SPACES[group[0].space].perp else None))
    with ExitStack() as stack:
        # the prefix's hooks first, so that the edits see the recorded residual
        run = _plain_run(model) if prefix is None else stack.enter_context(from_block(model, prefix, k))
        stack.enter_context(apply_edits(model, *edits))
        out, hidden = _edited_forward(model, run, batch, unembed)
    parts = [out[i * b:(i + 1) * b] for i in range(k)] if k > 1 else [out]
    results = []
    for s, x in zip(group, parts, strict=True):
        m = base.compare_hidden(x, unembed) if hidden else base.compare(x)
        # one check per setting: an edit whose own output stayed finite can still overflow later
        if not (bool(torch.isfinite(x).all()) and all(math.isfinite(v) for v in m.values())):
            raise NonFiniteEditError(f"setting {s.label}: the edited forward's "
                                     f"{'logits' if not hidden else 'final residual'} or their metrics "
                                     "are not finite; use smaller scales")
        results.append(m)
    return results


def _eval_checked(model, batch: TokenBatch, base: BaselineStats, group: list[Setting], failed: dict[str, str],
                  prefix: BlockInput | None = None, unembed: Unembedding | None = None) -> list[tuple[Setting, MetricSums]]:
    """:func:`_eval_group` for the settings of ``group`` that have not failed; a setting whose
    edits raise :class:`NonFiniteEditError` (or whose forward is not finite) is recorded in
    ``failed`` (label -> reason) and left out. A stacked group that fails runs again one
    setting at a time, to find which of its settings failed."""
    group = [s for s in group if s.label not in failed]
    if not group:
        return []
    try:
        return list(zip(group, _eval_group(model, batch, base, group, prefix, unembed), strict=True))
    except NonFiniteEditError as err:
        if len(group) == 1:
            failed[group[0].label] = " ".join(str(err).split())
            return []
    out: list[tuple[Setting, MetricSums]] = []
    for s in group:
        out += _eval_checked(model, batch, base, [s], failed, prefix, unembed)
    return out


def _plain_run(model):
    return lambda tokens, attention_mask: model(tokens, attention_mask=attention_mask)


def _edited_forward(model, run, batch: TokenBatch, unembed: Unembedding | None) -> tuple[Tensor, bool]:
    """``(logits, False)`` of ``run(tokens, mask)``, or with ``unembed`` ``(input of the
    unembedding, True)``: the forward then stops there and the metrics form the logits chunk
    by chunk (:meth:`BaselineStats.compare_hidden`). Called inside the edits' context, so the
    stopping hook is registered after theirs and sees the edited stream."""
    if unembed is None:
        return run(batch.tokens, batch.attention_mask), False
    got: dict = {}

    def grab(t, hook):  # noqa: ARG001 - TL hook signature
        got["hidden"] = t
        raise StopForward

    try:
        with model.hooks(fwd_hooks=[(unembed.hook, grab)]):
            logits = run(batch.tokens, batch.attention_mask)
    except StopForward:
        return got["hidden"], True
    return logits, False  # the hook did not fire: the model's own logits


# -- shared unedited prefix ----------------------------------------------------------------
# When a setting edits only layers >= L, blocks 0..L-1 compute the same thing as in the
# unedited forward. The baseline forward records blocks.L.hook_resid_pre once per batch (for
# every such L among the stacked groups); each group's forward then starts at its block L from
# the recorded residual (tl_directional.model.handle.from_block:
# TransformerLens's own start_at_layer on the legacy lane; on the bridge, whose start_at_layer
# still runs the earlier blocks, they are passed through).


def _prefix_start(settings: Sequence[Setting]) -> int | None:
    """The first edited layer when every setting names its layers and none edits layer 0."""
    if any(s.layers is None for s in settings):
        return None
    start = min(min(s.layers) for s in settings)
    return start if start >= 1 else None


def _baseline_forward(model, batch: TokenBatch, starts: Sequence[int] = (),
                      keep: str | None = None) -> tuple[Tensor, dict[int, BlockInput], Tensor | None]:
    """The unedited logits, with the residual entering each block in ``starts`` (by block), and
    with ``keep`` the tensor at that hook point (to check an :class:`Unembedding` once)."""
    got: dict = {}
    prefixes: dict[int, BlockInput] = {}
    with ExitStack() as stack:
        if keep is not None:
            stack.enter_context(model.hooks(fwd_hooks=[(keep, lambda t, hook: got.setdefault("kept", t))]))
        if not starts:
            logits = _forward(model, batch)
        else:
            first, store = min(starts), {}
            others = {L: f"blocks.{L}.hook_resid_pre" for L in starts if L != first}
            stack.enter_context(model.hooks(fwd_hooks=capture_hooks(others.values(), store, clone=True)))
            logits, prefixes[first] = forward_recording_block_input(model, batch.tokens, batch.attention_mask,
                                                                    first)
            for L, name in others.items():
                prefixes[L] = BlockInput(L, store[name], prefixes[first].output_form)
    return logits, prefixes, got.get("kept")


def sweep(
    model,
    inputs,
    edits_grid: Iterable[Setting],
    *,
    metrics: Sequence[str] = METRICS,
    batch_size: int = 8,
    attention_mask: Tensor | None = None,
    stack: int = 1,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    progress: bool = True,
    shared_prefix: bool = False,
) -> pd.DataFrame:
    """Evaluate every setting of ``edits_grid`` on ``inputs`` against the unedited model.

    Args:
        model: a TransformerBridge or HookedTransformer (eval mode; any device layout,
            including TransformerLens's multi-device loading: inputs go to the
            embedding's device).
        inputs: strings, token lists or a ``[batch, pos]`` tensor (>= 2 tokens a row).
        edits_grid: :class:`Setting` objects, e.g. from :func:`grid`.
        metrics: which of ``loss``, ``ppl``, ``kl``, ``top1_agree`` to report
            (the sums are exact token-weighted sums over predicted tokens).
        batch_size: sequences per forward pass.
        stack: evaluate up to this many settings of one space in a single forward by
            stacking them along the batch with per-row scales (``stack=1``: one forward
            per setting; results agree to float tolerance, not bit-exactly).
        checkpoint: JSON file for resumable progress; if it exists and matches this
            sweep, evaluation resumes after the batches already done.
        checkpoint_every: write the checkpoint every this many batches.
        progress: tqdm bar over batches.
        shared_prefix: a setting (a stacked group of settings) that edits only layers
            ``>= L`` (``L >= 1``) starts its forward at block ``L`` from the residual
            recorded in the batch's baseline forward, so blocks ``0..L-1`` run once per
            batch (a per-layer sweep runs only the blocks from each layer on); results
            agree with full forwards to float tolerance. Settings that edit all layers or
            layer 0 run full forwards. Keeps one ``[batch, pos, d_model]`` residual per
            distinct starting layer.

    Returns:
        One row per setting (the first row is the baseline, delta exactly 0) with
        ``space, s_par, s_perp, layers, label, status, reason, tokens, loss, base_loss,
        delta_loss, ppl, base_ppl, delta_ppl, kl, top1_agree``. ``status`` is ``"ok"``, or
        ``"failed"`` for a setting whose edits raised :class:`~tl_directional.edit.NonFiniteEditError`
        or whose forward (logits, metrics) was not finite on some batch: ``reason`` says why
        (naming the edit, the layer and the scales) and its metric columns are NaN; the
        setting is not evaluated on later batches and the other settings are unaffected.
    """
    settings = list(edits_grid)
    if not settings:
        raise ValueError("edits_grid is empty; build one with tl_directional.evaluate.sweeps.runner.grid(...)")
    for i, s in enumerate(settings):
        if not isinstance(s, Setting):
            raise TypeError(f"edits_grid[{i}] is a {type(s).__name__}, not a Setting; use grid(...)")
    bad = [m for m in metrics if m not in _metrics.METRIC_REGISTRY]
    if bad:
        raise ValueError(f"metrics has unknown {bad}; choose from {tuple(_metrics.METRIC_REGISTRY)}")
    if not isinstance(stack, int) or stack < 1:
        raise ValueError(f"stack must be a positive int, got {stack!r}")
    sites = analysis_sites(model, "sweep", ValueError, "dropout would make every setting's loss random")
    if not sites.causal:
        raise ValueError("sweep measures next-token loss, which does not apply to encoders (post-LN BERT)")
    for s in settings:
        if s.layers is not None:
            normalize_layers(list(s.layers), sites.n_layers, "layers")
    batch = prepare_inputs(model, inputs, attention_mask, min_tokens=2)
    batches = list(iter_batches(batch, batch_size))
    rank, world = rank_and_world()

    ckpt_path = None
    if checkpoint is not None:
        ckpt_path = Path(checkpoint)
        if world > 1:
            ckpt_path = ckpt_path.with_name(f"{ckpt_path.stem}.rank{rank}{ckpt_path.suffix}")
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        if ckpt_path is not None:  # one writer per checkpoint: a second sweep is refused, not mixed in
            held.enter_context(exclusive_lock(ckpt_path, "tl-directional sweep"))
        return _sweep_locked(model, settings, batch, batches, metrics, batch_size, stack, ckpt_path,
                             checkpoint_every, progress, rank, world, shared_prefix)


def _sweep_locked(model, settings, batch, batches, metrics, batch_size, stack, ckpt_path,
                  checkpoint_every, progress, rank, world, shared_prefix=False) -> pd.DataFrame:
    state = _resume_state(model, settings, batch, batch_size, stack, ckpt_path, rank, world, shared_prefix)
    sums = {s.label: state.sums.get(s.label, MetricSums()) for s in settings}
    failed = state.failed  # label -> reason, carried by the checkpoint
    base_sums = state.sums.get("__baseline__", MetricSums())

    device = device_of(model)
    groups = _stack_groups(settings, stack)
    # with shared_prefix, each stacked group starts at the first layer its settings edit
    starts = [_prefix_start(g) if shared_prefix else None for g in groups]
    needed = sorted({L for L in starts if L is not None})
    mine = [i for i in range(len(batches)) if i % world == rank]
    todo = [i for i in mine if i >= state.batches_done]
    iterator = todo
    if progress:
        from tqdm.auto import tqdm

        resumed = len(mine) - len(todo)
        if resumed and rank == 0:
            tqdm.write(f"sweep: resuming from {ckpt_path}: {state.batches_done} of {len(batches)} batches "
                       "were done", file=sys.stderr)
        iterator = tqdm(todo, desc="sweep (resumed)" if resumed else "sweep", unit="batch",
                        disable=rank != 0, total=len(mine), initial=resumed)
    done_since_save = 0
    # the edited forwards stop at the unembedding's input and the metrics form the logits a
    # chunk at a time, once that reproduces the model's own logits (checked on the first batch)
    unembed, unembed_checked = unembedding(model), False
    with torch.no_grad():
        for i in iterator:
            part = batches[i].to(device)
            keep = unembed.hook if unembed is not None and not unembed_checked else None
            base_logits, prefixes, kept = _baseline_forward(model, part, needed, keep)
            if not bool(torch.isfinite(base_logits).all()):  # every row would be NaN, the baseline "ok"
                raise NonFiniteEditError(nonfinite_message(model) or (
                    f"the unedited model's logits are NaN or inf on batch {i} while every weight is "
                    "finite; check the inputs"))
            if keep is not None:
                unembed_checked = True
                if kept is None or not unembedding_matches(unembed, kept, base_logits):
                    unembed = None
            base = BaselineStats(base_logits, part.tokens, part.attention_mask)
            base_sums.add_(MetricSums.of_baseline(base))
            for group, start in zip(groups, starts, strict=True):
                prefix = None if start is None else prefixes[start]
                for s, m in _eval_checked(model, part, base, group, failed, prefix, unembed):
                    sums[s.label].add_(m)
            state.batches_done = i + 1
            done_since_save += 1
            if ckpt_path is not None and done_since_save >= checkpoint_every:
                save_progress(state, sums, base_sums, ckpt_path)
                done_since_save = 0
    if ckpt_path is not None:
        state.batches_done = len(batches)
        save_progress(state, sums, base_sums, ckpt_path)
    if world > 1:
        base_sums, sums, failed = _reduce_ranks(base_sums, sums, failed, settings, world)
    return _results_frame(settings, metrics, base_sums, sums, failed)


def _resume_state(model, settings, batch, batch_size, stack, ckpt_path, rank, world, shared_prefix) -> SweepProgress:
    """A fresh :class:`SweepProgress`, or the one saved at ``ckpt_path`` when it is of this very
    sweep (raise :class:`CheckpointMismatch` naming what differs when it is not)."""
    fingerprint = {
        "settings": [s.label for s in settings],
        "settings_exact": [[s.space, repr(float(s.s_par)), repr(float(s.s_perp)),
                            None if s.layers is None else list(s.layers)]
                           + ([] if s.layer_s_par is None else [[repr(v) for v in s.layer_s_par]])
                           for s in settings],
        "n_sequences": len(batch),
        "n_tokens": batch.n_tokens,
        "batch_size": batch_size,
        "stack": stack,
        "shared_prefix": bool(shared_prefix),  # equal to the full forward to float tolerance, not bit-exact
        "tokens_sha256": tokens_sha256(batch),
        "model": model_fingerprint(model) if ckpt_path is not None else None,
        "world_size": world,
        "rank": rank,
    }
    state = SweepProgress(fingerprint)
    if ckpt_path is not None and ckpt_path.exists():
        state = SweepProgress.load(ckpt_path)
        if state.fingerprint != fingerprint:
            diff = sorted(k for k in fingerprint if state.fingerprint.get(k) != fingerprint[k])
            old_batches = -(-int(state.fingerprint.get("n_sequences", 0)) // max(1, int(state.fingerprint.get("batch_size", 1))))
            raise CheckpointMismatch(ckpt_path, diff, state.batches_done, old_batches,
                                     len(state.fingerprint.get("settings", [])))
    return state


def _reduce_ranks(base_sums, sums, failed, settings, world):
    """Every rank's sums added up and their failed settings joined (all ranks get the result)."""
    stacked = torch.stack([base_sums.as_tensor()] + [sums[s.label].as_tensor() for s in settings])
    torch.distributed.all_reduce(stacked)
    base_sums = MetricSums.from_tensor(stacked[0])
    sums = {s.label: MetricSums.from_tensor(stacked[j + 1]) for j, s in enumerate(settings)}
    gathered: list = [None] * world  # a setting failed on any rank failed
    torch.distributed.all_gather_object(gathered, failed)
    failed = {k: v for part in gathered for k, v in part.items()}
    # loading the model after init_process_group() made torch.distributed.nn.functional hold
    # the group; let the caller's destroy_process_group() free it (see tl_directional.io.distributed)
    release_captured_groups()
    return base_sums, sums, failed


def _results_frame(settings, metrics, base_sums, sums, failed) -> pd.DataFrame:
    """The sweep's table: the baseline row, then one row per setting (NaN metrics if it failed)."""
    registry = _metrics.METRIC_REGISTRY  # looked up here: one entry there is all a new metric needs
    cols = ["tokens"] + [c for m in metrics for c in registry[m].columns]
    rows = []
    base_row = {"space": "baseline", "s_par": 1.0, "s_perp": 1.0, "layers": "all", "label": "baseline",
                "status": "ok", "reason": ""}
    full = base_sums.row()
    for m in registry.values():
        full.update(m.baseline)
    rows.append({**base_row, **{c: full[c] for c in cols}})
    for s in settings:
        r = sums[s.label].row()
        reason = failed.get(s.label, "")
        rows.append({"space": s.space, "s_par": s.s_par, "s_perp": s.s_perp,
                     "layers": "all" if s.layers is None else ",".join(map(str, s.layers)),
                     "label": s.label, "status": "failed" if reason else "ok", "reason": reason,
                     **{c: (math.nan if reason else r[c]) for c in cols}})
    return pd.DataFrame(rows)


__all__ = ["grid", "sweep"]
