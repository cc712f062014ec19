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

:func:`find_safe_scale` searches the widest scale interval around 1 whose
damage stays within a budget.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .adapter import (
    BlockInput,
    StopForward,
    Unembedding,
    capture_hooks,
    device_of,
    forward_recording_block_input,
    from_block,
    unembedding,
    unembedding_matches,
)
from .distributed import rank_and_world, release_captured_groups
from .edit import EDIT_SPACES, Edit, apply_edits, edit_space, edits_for_space, scales
from .fileio import (
    SEAL_KEY,
    ArtefactError,
    atomic_write_bytes,
    exclusive_lock,
    fault_point,
    sealed_json_dumps,
    sealed_json_loads,
)
from .inputs import TokenBatch, iter_batches, prepare_inputs, scale_list
from .sites import normalize_layers, resolve_sites

#: The sweep's space names with their descriptions: a read-only view of
#: :data:`tl_directional.edit.EDIT_SPACES` (the one registry), kept for ``from sweep import SPACES``.
SPACES: Mapping[str, str] = MappingProxyType({name: space.description for name, space in EDIT_SPACES.items()})
METRICS = ("loss", "ppl", "kl", "top1_agree")


@dataclass(frozen=True)
class Setting:
    """One point of a sweep grid: an edit space, its scales, and its layers (None = all)."""

    space: str
    s_par: float = 1.0
    s_perp: float = 1.0
    layers: tuple[int, ...] | None = None

    def __post_init__(self):
        edit_space(self.space, "space")  # a ValueError naming the valid spaces
        for name in ("s_par", "s_perp"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        EDIT_SPACES[self.space].check_scales(self.s_perp)

    @property
    def label(self) -> str:
        layers = "all" if self.layers is None else ",".join(map(str, self.layers))
        if not EDIT_SPACES[self.space].scaled:
            return f"{self.space}[L={layers}]"
        return f"{self.space}[s_par={self.s_par:g},s_perp={self.s_perp:g},L={layers}]"

    @property
    def is_identity(self) -> bool:
        return EDIT_SPACES[self.space].scaled and self.s_par == 1.0 and self.s_perp == 1.0

    def edits(self, s_par=None, s_perp=None) -> list[Edit]:
        """The edits of this setting; ``s_par`` / ``s_perp`` override the scales (e.g. per-row)."""
        sp = self.s_par if s_par is None else s_par
        sq = self.s_perp if s_perp is None else s_perp
        return edits_for_space(self.space, sp, sq, self.layers)


def grid(
    spaces: str | Sequence[str],
    s_par: Sequence[float] | float | str = (1.0,),
    s_perp: Sequence[float] | float | str = (1.0,),
    layers: Any = None,
) -> list[Setting]:
    """The product grid of spaces x s_par x s_perp x layer sets (duplicates dropped).

    ``hard-diag`` ignores scales (one setting per layer set); ``eff-diag`` only
    takes ``s_perp = 1``. ``s_par`` / ``s_perp``: a number, a list of numbers or a comma
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
    layer_sets = [None] if layers is None else [None if ls is None else tuple(int(x) for x in ls) for ls in layers]
    out: list[Setting] = []
    for space in spaces:
        if space not in EDIT_SPACES:
            raise ValueError(f"spaces has unknown space {space!r}; choose from {', '.join(sorted(EDIT_SPACES))}")
        for ls in layer_sets:
            if not EDIT_SPACES[space].scaled:
                out.append(Setting(space, 1.0, 1.0, ls))
                continue
            for sp in s_par:
                for sq in s_perp:
                    if not EDIT_SPACES[space].perp and float(sq) != 1.0:
                        continue
                    out.append(Setting(space, float(sp), float(sq), ls))
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


# ---------------------------------------------------------------------------
# per-batch metric sums
# ---------------------------------------------------------------------------


def prediction_mask(attention_mask: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos-1"]:
    """Positions ``t`` whose next token ``t + 1`` is a real token of the same sequence."""
    m = attention_mask.bool()
    return m[:, :-1] & m[:, 1:]


@dataclass
class MetricSums:
    """Exact sums over predicted tokens, to be added across batches and ranks."""

    tokens: float = 0.0
    nll: float = 0.0
    base_nll: float = 0.0
    kl: float = 0.0
    top1_agree: float = 0.0

    def add_(self, other: MetricSums) -> MetricSums:
        for k in ("tokens", "nll", "base_nll", "kl", "top1_agree"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        return self

    def as_tensor(self) -> Tensor:
        return torch.tensor([self.tokens, self.nll, self.base_nll, self.kl, self.top1_agree], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: Tensor) -> MetricSums:
        return cls(*[float(x) for x in t.tolist()])

    def to_disk(self) -> list:
        """Exact form for a checkpoint: token and agreement counts as ints, sums as float64."""
        return [int(self.tokens), self.nll, self.base_nll, self.kl, int(self.top1_agree)]

    @classmethod
    def from_disk(cls, values) -> MetricSums:
        if not isinstance(values, list) or len(values) != 5 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"sums must be a list of 5 numbers, got {values!r}")
        return cls(*[float(v) for v in values])

    def row(self) -> dict:
        n = max(self.tokens, 1.0)
        loss, base = self.nll / n, self.base_nll / n
        return {
            "tokens": int(self.tokens),
            "loss": loss,
            "base_loss": base,
            "delta_loss": loss - base,
            "ppl": math.exp(loss),
            "base_ppl": math.exp(base),
            "delta_ppl": math.exp(loss) - math.exp(base),
            "kl": self.kl / n,
            "top1_agree": self.top1_agree / n,
        }


class BaselineStats:
    """What every setting is compared with on one batch, computed once: the unedited
    next-token probabilities at every position, ``sum_v p log p`` per position (for the
    KL), the baseline NLL sum and the baseline's top-1 (argmax of its logits).

    :meth:`compare` then needs, per setting, three vocabulary-sized passes: one fused
    ``log_softmax`` of each position's logits ``z`` (then the target's log-prob, a gather),
    the dot product of its result with the baseline probabilities (``KL(base || edited) =
    sum p log p - p . log q``) and the largest logit (``amax``: top-1 agreement is
    ``z[top1_base] == max z``, so an exact tie for the largest counts as agreement).
    Vocabulary-sized work runs over chunks of positions of at most :data:`CHUNK_ELEMENTS`
    logits, small enough that a chunk stays in the CPU's cache between those passes and that
    a 262k-vocabulary model never holds a second ``[batch, pos, vocab]`` tensor beside the
    logits; :meth:`compare_hidden` forms the logits themselves a chunk at a time. The baseline probabilities are kept
    when they have at most :data:`KEEP_PROBS_ELEMENTS` elements, else recomputed per chunk.
    Per-position values are formed in the logits' precision (float32, or float64 for a
    float64 model); the sums over positions are float64.
    """

    #: logits per chunk of vocabulary-sized work (4 MiB in float32: 128 positions of an
    #: 8192-token vocabulary, 4 of Gemma-3's 262k), so that the chunk's log-probs are still
    #: in cache when they are read again
    CHUNK_ELEMENTS = 1 << 20
    #: keep the baseline probabilities when they have at most this many elements
    KEEP_PROBS_ELEMENTS = 1 << 25

    @torch.no_grad()
    def __init__(self, base_logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"],
                 attention_mask: Int[Tensor, "batch pos"]):
        self.mask = prediction_mask(attention_mask)
        batch, pos, vocab = base_logits.shape
        dev = base_logits.device
        self.target = tokens[:, 1:][self.mask][:, None]
        self.dtype = torch.float64 if base_logits.dtype == torch.float64 else torch.float32
        # Row b * pos + t of the flat [batch * pos, vocab] logits predicts token t + 1. Rows are
        # processed in contiguous slices (views, no gather); rows that predict nothing (the
        # last position, padding) are computed and weighted out, 1 / pos extra work.
        weight = torch.zeros(batch, pos, dtype=torch.bool, device=dev)
        weight[:, :-1] = self.mask.to(dev)
        self._weight = weight.reshape(-1)
        tgt = torch.zeros(batch, pos, dtype=torch.long, device=dev)
        tgt[:, :-1] = tokens[:, 1:].to(dev)
        self._tgt = tgt.reshape(-1, 1)
        self._base = base_logits.reshape(-1, vocab)
        step = max(1, self.CHUNK_ELEMENTS // vocab)
        n_rows = batch * pos
        self.ranges = [(a, min(a + step, n_rows)) for a in range(0, n_rows, step)]
        keep = n_rows * vocab <= self.KEEP_PROBS_ELEMENTS
        self._p: list[Tensor] = []
        plp = torch.empty(n_rows, dtype=self.dtype, device=dev)
        tgt_lp = torch.empty(n_rows, dtype=self.dtype, device=dev)
        self._top1 = torch.empty(n_rows, dtype=torch.long, device=dev)
        for a, e in self.ranges:
            z = self._base[a:e]
            base_lp = F.log_softmax(z.to(self.dtype), dim=-1)
            p = base_lp.exp()
            plp[a:e] = _row_dot(p, base_lp)
            tgt_lp[a:e] = base_lp.gather(-1, self._tgt[a:e]).squeeze(-1)
            self._top1[a:e] = z.argmax(-1)
            if keep:
                self._p.append(p)
        self._plp_rows = plp
        self.p_log_p = _weighted_sum(plp, self._weight)
        self.base_nll = -_weighted_sum(tgt_lp, self._weight)
        self.tokens = float(self.mask.sum())

    def _probs(self, c: int) -> Tensor:
        """The baseline probabilities of chunk ``c`` (kept, or recomputed from the logits)."""
        if self._p:
            return self._p[c]
        a, e = self.ranges[c]
        return F.log_softmax(self._base[a:e].to(self.dtype), dim=-1).exp()

    @torch.no_grad()
    def compare(self, logits: Float[Tensor, "batch pos vocab"]) -> MetricSums:
        """Sums of next-token NLL (edited and base), ``KL(base || edited)`` and top-1
        agreement (the baseline's top-1 token has the largest edited logit) over the
        predicted tokens."""
        flat = logits.reshape(-1, logits.shape[-1])
        return self._compare(lambda a, e: flat[a:e], flat.shape[0], flat.device)

    @torch.no_grad()
    def compare_hidden(self, hidden: Float[Tensor, "batch pos d_model"], unembed: Unembedding) -> MetricSums:
        """:meth:`compare` from the unembedding's input (``hidden`` at ``unembed.hook``): each
        chunk's logits are computed, reduced and dropped, so no ``[batch, pos, vocab]`` tensor
        is ever formed."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return self._compare(lambda a, e: unembed.logits(flat[a:e]), flat.shape[0], flat.device)

    def _compare(self, chunk_logits: Callable[[int, int], Tensor], n_rows: int, device) -> MetricSums:
        p_lq = torch.empty(n_rows, dtype=self.dtype, device=device)
        tgt_lq = torch.empty(n_rows, dtype=self.dtype, device=device)
        agree = torch.empty(n_rows, dtype=torch.bool, device=device)
        for c, (a, e) in enumerate(self.ranges):
            z = chunk_logits(a, e)
            lq = F.log_softmax(z.to(self.dtype), dim=-1)  # the one vocabulary-sized temporary
            p_lq[a:e] = _row_dot(self._probs(c), lq)
            tgt_lq[a:e] = lq.gather(-1, self._tgt[a:e]).squeeze(-1)
            # top-1 agreement: the baseline's argmax holds the largest logit (an exact tie for
            # the largest counts as agreement); amax is one vectorised pass, argmax is not
            agree[a:e] = z.gather(-1, self._top1[a:e, None]).squeeze(-1) == z.amax(-1)
        w = self._weight
        sums = torch.stack([-_weighted_sum(tgt_lq, w), _weighted_sum(self._plp_rows - p_lq, w),
                            (w & agree).sum().to(torch.float64)]).tolist()
        return MetricSums(self.tokens, sums[0], float(self.base_nll), sums[1], sums[2])


def _row_dot(x: Float[Tensor, "rows vocab"], y: Float[Tensor, "rows vocab"]) -> Float[Tensor, " rows"]:
    """``(x * y).sum(-1)`` per row without a ``[rows, vocab]`` product tensor."""
    return torch.linalg.vecdot(x, y)


def _weighted_sum(values: Float[Tensor, " rows"], weight) -> Tensor:
    """Sum of ``values`` over the rows where ``weight`` is True, in float64."""
    return torch.where(weight, values.to(torch.float64), 0.0).sum()


def batch_metric_sums(
    base_logits: Float[Tensor, "batch pos vocab"],
    logits: Float[Tensor, "batch pos vocab"],
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
) -> MetricSums:
    """One-off comparison of ``logits`` with ``base_logits`` (see :class:`BaselineStats`)."""
    return BaselineStats(base_logits, tokens, attention_mask).compare(logits)


# ---------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------


def _forward(model, batch: TokenBatch):
    return model(batch.tokens, attention_mask=batch.attention_mask)


def _stack_groups(settings: Sequence[Setting], width: int) -> list[list[Setting]]:
    """Group settings that differ only in scales (same space and layers), in chunks of ``width``."""
    groups: dict[tuple, list[Setting]] = {}
    for s in settings:
        key = (s.space, s.layers)
        groups.setdefault(key, []).append(s)
    out = []
    for members in groups.values():
        if not EDIT_SPACES[members[0].space].scaled:  # nothing to stack (hard-diag)
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
    return [base.compare_hidden(x, unembed) if hidden else base.compare(x) for x in parts]


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
# the recorded residual (tl_directional.adapter.from_block:
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


@dataclass
class _Progress:
    """Resumable state of a sweep: sums per setting after ``batches_done`` batches."""

    fingerprint: dict
    batches_done: int = 0
    sums: dict[str, list[float]] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        # Sums are float64 on disk (JSON floats round-trip exactly) and counts exact ints,
        # so a resumed sweep continues from bit-identical sums; the record is sealed.
        atomic_write_bytes(path, sealed_json_dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> _Progress:
        raw = path.read_bytes()
        if not _looks_like_progress(raw):  # never suggest deleting a file the library did not write
            raise ArtefactError(f"checkpoint {path} exists and is not a sweep checkpoint written by "
                                "tl-directional; it was left untouched: pass a new checkpoint path")
        fix = "delete it to start the sweep afresh"
        data = sealed_json_loads(raw, path, fix=fix)
        data.pop(SEAL_KEY, None)
        try:
            state = cls(**data)
            sums = {k: MetricSums.from_disk(v) for k, v in state.sums.items()}
            if not isinstance(state.batches_done, int) or isinstance(state.batches_done, bool):
                raise TypeError(f"batches_done is {state.batches_done!r}")
        except (TypeError, ValueError) as e:
            raise ArtefactError(f"{path} is not a readable sweep checkpoint ({e}); {fix}") from None
        state.sums = sums
        return state


def _looks_like_progress(raw: bytes) -> bool:
    """Whether ``raw`` starts like a :class:`_Progress` record (sorted keys: ``batches_done``
    first), so that a damaged checkpoint of ours is told apart from someone else's file."""
    head = raw[:200].lstrip()
    return head.startswith(b"{") and b'"batches_done"' in head


class CheckpointMismatch(ArtefactError):
    """A sweep checkpoint that belongs to another sweep; says what it holds."""

    def __init__(self, path, diff: list[str], done: int, total: int, n_settings: int):
        self.path, self.diff, self.done, self.total, self.n_settings = path, diff, done, total, n_settings
        self.finished = done >= total
        held = ("a finished sweep" if self.finished else f"an unfinished sweep ({done} of {total} batches done)")
        plural = "s" if n_settings != 1 else ""
        super().__init__(f"checkpoint {path} holds {held} of {n_settings} setting{plural} that differs from this "
                         f"one in {diff}; pass another checkpoint path (or delete it: tl-directional wrote it)")


def model_fingerprint(model) -> dict:
    """Identity of a model for checkpoints: its class, its config and a sha256 of every
    parameter and buffer (names, shapes, dtypes and bytes), so that another model, or the
    same model with other weights, never resumes this one's sums."""
    h = hashlib.sha256()
    with torch.no_grad():
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        for name, t in sorted(tensors, key=lambda kv: kv[0]):
            t = t.detach().cpu().contiguous()
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    cfg = getattr(model, "cfg", None)
    cfg_items = cfg.to_dict() if hasattr(cfg, "to_dict") else vars(cfg) if cfg is not None else {}
    config = {k: str(v) for k, v in sorted(cfg_items.items()) if k not in ("device", "n_devices", "model_name")}
    return {"class": type(model).__name__, "config_sha256": hashlib.sha256(
        json.dumps(config, sort_keys=True).encode()).hexdigest(), "weights_sha256": h.hexdigest()}


def _tokens_sha256(batch: TokenBatch) -> str:
    h = hashlib.sha256()
    for t in (batch.tokens, batch.attention_mask):
        t = t.detach().cpu().long().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _save_progress(state: _Progress, sums: dict, base_sums: MetricSums, path: Path) -> None:
    on_disk = _Progress(state.fingerprint, state.batches_done,
                        {**{k: v.to_disk() for k, v in sums.items()}, "__baseline__": base_sums.to_disk()})
    on_disk.save(path)
    fault_point("sweep.after_checkpoint")


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
        ``space, s_par, s_perp, layers, label, tokens, loss, base_loss, delta_loss,
        ppl, base_ppl, delta_ppl, kl, top1_agree``.
    """
    settings = list(edits_grid)
    if not settings:
        raise ValueError("edits_grid is empty; build one with tl_directional.sweep.grid(...)")
    for i, s in enumerate(settings):
        if not isinstance(s, Setting):
            raise TypeError(f"edits_grid[{i}] is a {type(s).__name__}, not a Setting; use grid(...)")
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        raise ValueError(f"metrics has unknown {bad}; choose from {METRICS}")
    if not isinstance(stack, int) or stack < 1:
        raise ValueError(f"stack must be a positive int, got {stack!r}")
    sites = resolve_sites(model, warn=False)
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
    fingerprint = {
        "settings": [s.label for s in settings],
        "settings_exact": [[s.space, repr(float(s.s_par)), repr(float(s.s_perp)),
                            None if s.layers is None else list(s.layers)] for s in settings],
        "n_sequences": len(batch),
        "n_tokens": batch.n_tokens,
        "batch_size": batch_size,
        "stack": stack,
        "shared_prefix": bool(shared_prefix),  # equal to the full forward to float tolerance, not bit-exact
        "tokens_sha256": _tokens_sha256(batch),
        "model": model_fingerprint(model) if ckpt_path is not None else None,
        "world_size": world,
        "rank": rank,
    }
    state = _Progress(fingerprint)
    if ckpt_path is not None and ckpt_path.exists():
        state = _Progress.load(ckpt_path)
        if state.fingerprint != fingerprint:
            diff = sorted(k for k in fingerprint if state.fingerprint.get(k) != fingerprint[k])
            old_batches = -(-int(state.fingerprint.get("n_sequences", 0)) // max(1, int(state.fingerprint.get("batch_size", 1))))
            raise CheckpointMismatch(ckpt_path, diff, state.batches_done, old_batches,
                                     len(state.fingerprint.get("settings", [])))
    sums = {s.label: state.sums.get(s.label, MetricSums()) for s in settings}
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
            if keep is not None:
                unembed_checked = True
                if kept is None or not unembedding_matches(unembed, kept, base_logits):
                    unembed = None
            base = BaselineStats(base_logits, part.tokens, part.attention_mask)
            base_sums.add_(MetricSums(base.tokens, float(base.base_nll), float(base.base_nll), 0.0, base.tokens))
            for group, start in zip(groups, starts, strict=True):
                prefix = None if start is None else prefixes[start]
                for s, m in zip(group, _eval_group(model, part, base, group, prefix, unembed), strict=True):
                    sums[s.label].add_(m)
            state.batches_done = i + 1
            done_since_save += 1
            if ckpt_path is not None and done_since_save >= checkpoint_every:
                _save_progress(state, sums, base_sums, ckpt_path)
                done_since_save = 0
    if ckpt_path is not None:
        state.batches_done = len(batches)
        _save_progress(state, sums, base_sums, ckpt_path)
    if world > 1:
        stacked = torch.stack([base_sums.as_tensor()] + [sums[s.label].as_tensor() for s in settings])
        torch.distributed.all_reduce(stacked)
        base_sums = MetricSums.from_tensor(stacked[0])
        sums = {s.label: MetricSums.from_tensor(stacked[j + 1]) for j, s in enumerate(settings)}
        # loading the model after init_process_group() made torch.distributed.nn.functional hold
        # the group; let the caller's destroy_process_group() free it (see tl_directional.distributed)
        release_captured_groups()

    keep = {"loss": ["loss", "base_loss", "delta_loss"], "ppl": ["ppl", "base_ppl", "delta_ppl"],
            "kl": ["kl"], "top1_agree": ["top1_agree"]}
    cols = ["tokens"] + [c for m in metrics for c in keep[m]]
    rows = []
    base_row = {"space": "baseline", "s_par": 1.0, "s_perp": 1.0, "layers": "all", "label": "baseline"}
    full = base_sums.row()
    full.update(delta_loss=0.0, delta_ppl=0.0, kl=0.0, top1_agree=1.0)
    rows.append({**base_row, **{c: full[c] for c in cols}})
    for s in settings:
        r = sums[s.label].row()
        rows.append({"space": s.space, "s_par": s.s_par, "s_perp": s.s_perp,
                     "layers": "all" if s.layers is None else ",".join(map(str, s.layers)),
                     "label": s.label, **{c: r[c] for c in cols}})
    return pd.DataFrame(rows)


def sweep_figure(results: pd.DataFrame, *, x: str = "s_par", y: str = "delta_ppl"):
    """Plotly figure: ``y`` against ``x`` per space (the component-scaling figure)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    df = results[results["space"] != "baseline"]
    for (space, layers), part in df.groupby(["space", "layers"], sort=False):
        part = part.sort_values(x)
        name = space if layers == "all" else f"{space} L={layers}"
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="lines+markers", name=name))
    fig.add_hline(y=0.0, line_dash="dot", line_color="gray")
    fig.update_layout(xaxis_title=x, yaxis_title=y, title=f"{y} vs {x} per edit space",
                      template="plotly_white", legend_title="space")
    return fig


# ---------------------------------------------------------------------------
# safe-scale search
# ---------------------------------------------------------------------------


class _Evaluator:
    """Damage of an edit on a small token set, with the baseline cached once."""

    def __init__(self, model, inputs, batch_size: int, attention_mask=None):
        self.model = model
        batch = prepare_inputs(model, inputs, attention_mask, min_tokens=2)
        device = device_of(model)
        self.batches = [b.to(device) for b in iter_batches(batch, batch_size)]
        with torch.no_grad():
            self.base = [BaselineStats(_forward(model, b), b.tokens, b.attention_mask) for b in self.batches]
        self.n_evals = 0

    def damage(self, edits: Sequence[Edit]) -> dict:
        total = MetricSums()
        with torch.no_grad(), apply_edits(self.model, *edits):
            for b, base in zip(self.batches, self.base, strict=True):
                total.add_(base.compare(_forward(self.model, b)))
        self.n_evals += 1
        return total.row()


@dataclass
class SafeScaleResult:
    """Outcome of :func:`find_safe_scale` for one layer group and one scale."""

    which: str  # "s_par" or "s_perp"
    layers: tuple[int, ...] | None
    interval: tuple[float, float]
    budget: float
    metric: str
    evaluations: pd.DataFrame
    hit_bounds: tuple[bool, bool]
    note: str = ""

    def figure(self):
        """Plotly figure of the evaluated damage with the budget and the interval."""
        import plotly.graph_objects as go

        ev = self.evaluations.sort_values("scale")
        fig = go.Figure(go.Scatter(x=ev["scale"], y=ev["cost"], mode="markers+lines", name=self.metric))
        fig.add_hline(y=self.budget, line_dash="dash", line_color="red", annotation_text="budget")
        fig.add_vrect(x0=self.interval[0], x1=self.interval[1], fillcolor="green", opacity=0.12, line_width=0)
        layers = "all" if self.layers is None else ",".join(map(str, self.layers))
        fig.update_layout(title=f"safe {self.which} interval, layers {layers}: [{self.interval[0]:.3g}, {self.interval[1]:.3g}]",
                          xaxis_title=self.which, yaxis_title=self.metric, template="plotly_white")
        return fig


def find_safe_scale(
    model,
    inputs,
    edit_factory: Callable[..., Edit | Sequence[Edit]] | str,
    budget: float = 0.05,
    *,
    metric: str = "delta_loss",
    which: str = "s_par",
    bounds: tuple[float, float] = (-1.0, 3.0),
    grid_points: int = 9,
    refine_steps: int = 4,
    layer_groups: Sequence[Sequence[int] | None] | None = None,
    batch_size: int = 8,
) -> list[SafeScaleResult]:
    """Widest interval ``[lo, hi]`` containing 1 for one scale whose damage stays within ``budget``.

    Args:
        edit_factory: a scaled space name from :data:`~tl_directional.edit.EDIT_SPACES` or a callable
            ``f(s_par=..., s_perp=..., layers=...) -> Edit | [Edit]``.
        budget: the largest allowed ``metric`` (``delta_loss`` in nats, or ``kl``).
        which: ``"s_par"`` or ``"s_perp"`` (the other scale stays 1).
        bounds: the search range; the interval never leaves it.
        grid_points: coarse grid over ``bounds`` (1 is always added).
        refine_steps: bisection steps per boundary between the last passing and the
            first failing grid point.
        layer_groups: search separately per group (e.g. ``[[0], [1], [2, 3]]``);
            None searches all layers at once.

    Evaluations: ``grid_points + 1 + 2 * refine_steps`` per group at most.

    What it can miss: the loss need not be monotonic in the scale. The interval is
    bounded by the first failing *evaluated* point on each side of 1; a failure
    narrower than the grid spacing between two passing points is not seen, and a
    second safe region beyond a failing point is not reported.
    """
    if metric not in ("delta_loss", "kl"):
        raise ValueError(f"metric must be 'delta_loss' or 'kl', got {metric!r}")
    if which not in ("s_par", "s_perp"):
        raise ValueError(f"which must be 's_par' or 's_perp', got {which!r}")
    lo_b, hi_b = float(bounds[0]), float(bounds[1])
    if not (math.isfinite(lo_b) and math.isfinite(hi_b) and lo_b < 1.0 < hi_b):
        raise ValueError(f"bounds must be finite with lo < 1 < hi, got {bounds!r}")
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget >= 0):
        raise ValueError(f"budget must be a finite non-negative number, got {budget!r}")
    if grid_points < 2:
        raise ValueError(f"grid_points must be >= 2, got {grid_points}")
    if isinstance(edit_factory, str):
        space = edit_factory
        scaled = sorted(name for name, sp in EDIT_SPACES.items() if sp.scaled)  # hard-diag has no scale to search
        if space not in scaled:
            raise ValueError(f"edit_factory space must be one of {scaled}, got {space!r}")

        def factory(s_par=1.0, s_perp=1.0, layers=None):
            return Setting(space, s_par, s_perp, None if layers is None else tuple(layers)).edits()
    elif callable(edit_factory):
        factory = edit_factory
    else:
        raise TypeError("edit_factory must be a space name or a callable f(s_par=, s_perp=, layers=)")

    evaluator = _Evaluator(model, inputs, batch_size)
    groups = [None] if layer_groups is None else [None if g is None else tuple(g) for g in layer_groups]
    return [
        _search_group(evaluator, factory, group, budget=float(budget), metric=metric, which=which,
                      bounds=(lo_b, hi_b), grid_points=grid_points, refine_steps=refine_steps)
        for group in groups
    ]


def _search_group(evaluator: _Evaluator, factory, group, *, budget, metric, which, bounds, grid_points,
                  refine_steps) -> SafeScaleResult:
    """Grid over ``bounds``, walk outward from 1 while the cost stays within budget,
    then bisect each boundary between the last passing and first failing point."""
    evals: dict[float, float] = {}

    def cost(s: float) -> float:
        if s not in evals:
            edits = factory(**{which: s, "layers": None if group is None else list(group)})
            edits = [edits] if isinstance(edits, Edit) else list(edits)
            evals[s] = evaluator.damage(edits)[metric]
        return evals[s]

    points = sorted(set(torch.linspace(bounds[0], bounds[1], grid_points).tolist()) | {1.0})
    for p in points:
        cost(p)
    ones = points.index(1.0)
    edges = []
    for direction in (-1, 1):
        i = ones
        while 0 <= i + direction < len(points) and cost(points[i + direction]) <= budget:
            i += direction
        passing = points[i]
        if not 0 <= i + direction < len(points):
            edges.append((passing, True))
            continue
        failing = points[i + direction]
        for _ in range(refine_steps):
            mid = 0.5 * (passing + failing)
            if cost(mid) <= budget:
                passing = mid
            else:
                failing = mid
        edges.append((passing, False))
    ev = pd.DataFrame({"scale": list(evals), "cost": list(evals.values())}).sort_values("scale")
    note = "the unedited model already exceeds the budget" if cost(1.0) > budget else ""
    return SafeScaleResult(
        which=which, layers=group, interval=(edges[0][0], edges[1][0]), budget=budget, metric=metric,
        evaluations=ev.reset_index(drop=True), hit_bounds=(edges[0][1], edges[1][1]), note=note,
    )


__all__ = ["METRICS", "SPACES", "BaselineStats", "SafeScaleResult", "Setting", "batch_metric_sums", "find_safe_scale", "grid",
           "prediction_mask", "sweep", "sweep_figure"]
