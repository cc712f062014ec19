"""The record registry and the context a record function runs in.

A *record* is a small function registered with :func:`register`::

    @register("edit_overhead", target=1.10, op="<=", precision=0.10,
              baseline="plain forward", candidate="forward with ValueScale(s_par=0) on every layer")
    def edit_overhead(bench: Bench) -> PairedTiming:
        ...
        return bench.measure(baseline_fn, candidate_fn)

The runner (:mod:`benchmarks.run`) calls it once per setting (sequence length x batch size
x model) and turns the returned :class:`~benchmarks.timing.PairedTiming` into one JSON record
with the ratio, its ci95, the raw times, the target and whether it was met. A record function
may put extra, record-specific numbers into ``bench.extra`` (they land under ``"extra"``), and
raises :class:`NotAvailable` when the feature it measures does not exist yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .timing import PairedTiming, median_ci, paired_timing

#: Record status values in the JSON.
STATUSES = ("ok", "not_available", "skipped", "error")


class NotAvailable(Exception):  # noqa: N818 - a status, not an error
    """The feature a record measures is not built yet (its module or function is missing)."""


class Skipped(Exception):  # noqa: N818 - a status, not an error
    """The record cannot run here (e.g. an optional peer library is not installed)."""


#: How far above the target the upper end of the ci95 may lie for a "met" verdict.
CI_SLACK = 0.05


@dataclass(frozen=True)
class Setting:
    """One workload: ``batch`` sequences of ``seq`` tokens on the model called ``model``.

    ``model`` is ``"main"`` (the model under test, by default ``load_model("default")``) or
    ``"wide"`` (a seeded model of the same family with a larger ``d_model``, to show how the
    cost ratios change with width). ``primary`` marks the headline setting of a record.
    """

    seq: int
    batch: int
    model: str = "main"
    d_model: int | None = None
    primary: bool = False

    @property
    def label(self) -> str:
        text = f"seq={self.seq},batch={self.batch}"
        if self.model != "main":
            text += f",d_model={self.d_model}"
        return text


@dataclass
class RecordSpec:
    """A registered record: its measuring function, target and descriptions."""

    name: str
    fn: Callable[[Bench], PairedTiming]
    target: float
    op: str
    precision: float
    baseline: str
    candidate: str
    description: str
    models: tuple[str, ...]
    primary_only: bool = False  # run on the primary setting only (a slow record)

    def meets(self, ratio: float) -> bool:
        """Whether ``ratio`` satisfies the target."""
        if not math.isfinite(ratio):
            return False
        return ratio <= self.target if self.op == "<=" else ratio < self.target

    def decisive(self, lo: float, hi: float) -> bool:
        """Whether the interval ``[lo, hi]`` lies entirely on one side of the target."""
        if self.op == "<=":
            return hi <= self.target or lo > self.target
        return hi < self.target or lo >= self.target

    @property
    def target_text(self) -> str:
        return f"ratio {self.op} {self.target:g}"


#: All registered records, in registration order (the order of the table and the JSON).
REGISTRY: dict[str, RecordSpec] = {}


def register(name: str, *, target: float, op: str = "<=", precision: float = 0.10,
             baseline: str, candidate: str, models: tuple[str, ...] = ("main",),
             primary_only: bool = False):
    """Decorator registering a record function under ``name`` (a JSON contract name).

    Args:
        name: the record name outside checks read from the JSON.
        target: the ratio the candidate should stay within.
        op: ``"<="`` or ``"<"``.
        precision: ci95 width that counts as precise enough to stop adding pairs (the
            target's margin); measuring also stops once the ci95 excludes the target.
        baseline, candidate: one-line descriptions of the two timed calls.
        models: which models the record runs on (``"main"``, ``"wide"``).
        primary_only: run on the primary setting only (a record whose one call is minutes).
    """
    if op not in ("<=", "<"):
        raise ValueError(f"op must be '<=' or '<', got {op!r}")

    def deco(fn: Callable[[Bench], PairedTiming]):
        if name in REGISTRY:
            raise ValueError(f"record {name!r} is registered twice")
        doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        REGISTRY[name] = RecordSpec(name, fn, float(target), op, float(precision), baseline,
                                    candidate, doc, tuple(models), bool(primary_only))
        return fn

    return deco


@dataclass
class Bench:
    """What a record function gets: the model, the inputs of one setting, and ``measure``.

    Attributes:
        spec: the record being measured.
        setting: the workload.
        model: the loaded TransformerLens model for ``setting.model`` (eval mode; leave no
            hooks on it and do not change its weights; use ``fresh_model()`` to get a copy).
        model_source: what :func:`tl_directional.models.load_model` loads it from (a
            directory or ``"default"``), for subprocesses.
        inputs: a :class:`tl_directional.inputs.TokenBatch` of ``setting.batch`` sequences of
            ``setting.seq`` tokens, on the model's device.
        harness: the running harness (config, device, dtype, model loader).
        extra: record-specific numbers to store under ``"extra"`` in the JSON.
    """

    spec: RecordSpec
    setting: Setting
    model: Any
    model_source: str
    inputs: Any
    harness: Any
    seed: int
    extra: dict = field(default_factory=dict)

    @property
    def device(self):
        return self.harness.device

    @property
    def sync(self) -> Callable[[], None] | None:
        return self.harness.sync

    def fresh_model(self):
        """A private copy of this setting's model (for records that train or mutate it)."""
        return self.harness.load(self.setting.model)

    def measure(self, baseline: Callable[[], object], candidate: Callable[[], object]) -> PairedTiming:
        """Paired, interleaved timing of ``candidate`` against ``baseline`` (see
        :mod:`benchmarks.timing`), with this record's stopping rule."""
        cfg = self.harness.config
        spec = self.spec

        def done(ratios: list[float]) -> bool:
            _, (lo, hi) = median_ci(ratios, seed=self.seed)
            return spec.decisive(lo, hi) or (hi - lo) <= spec.precision

        return paired_timing(baseline, candidate, warmup=cfg.warmup, min_pairs=cfg.min_pairs,
                             max_pairs=cfg.max_pairs, max_seconds=cfg.max_seconds, done=done,
                             sync=self.sync)


def make_record(spec: RecordSpec, setting: Setting | None, *, status: str,
                timing: PairedTiming | None = None, extra: dict | None = None,
                reason: str | None = None, seed: int = 0) -> dict:
    """The JSON record of one measurement (or of a record that could not be measured)."""
    rec: dict[str, Any] = {
        "name": spec.name,
        "setting": setting.label if setting is not None else "all",
        "primary": bool(setting.primary) if setting is not None else True,
        "status": status,
        "reason": reason,
        "description": spec.description,
        "baseline": spec.baseline,
        "candidate": spec.candidate,
        "target": spec.target,
        "target_op": spec.op,
        "target_text": spec.target_text,
        "precision": spec.precision,
        "met": None,
        "met_ratio": None,
        "decisive": None,
        "ratio": None,
        "ci95": None,
        "ci95_width": None,
        "n_pairs": 0,
        "n_warmup": 0,
        "stop_reason": None,
        "verdict": None,
        "times": None,
        "extra": extra or {},
    }
    if setting is not None:
        rec.update(seq=setting.seq, batch=setting.batch, model=setting.model)
    if status != "ok" or timing is None:
        return rec
    ratio, (lo, hi) = median_ci(timing.ratios, seed=seed)
    met_ratio = spec.meets(ratio)
    met = met_ratio
    mem = (extra or {}).get("memory")
    if isinstance(mem, dict) and mem.get("met") is not None:
        met = met and bool(mem["met"])
    rec.update(
        ratio=ratio,
        ci95=[lo, hi],
        ci95_width=hi - lo,
        met=met,
        met_ratio=met_ratio,
        decisive=spec.decisive(lo, hi),
        verdict=verdict(spec, ratio, lo, hi),
        n_pairs=timing.n_pairs,
        n_warmup=timing.warmup_pairs,
        stop_reason=timing.stop_reason,
        times={
            "baseline_s": timing.baseline_s,
            "candidate_s": timing.candidate_s,
            "ratios": timing.ratios,
            "baseline_median_s": _median(timing.baseline_s),
            "candidate_median_s": _median(timing.candidate_s),
        },
    )
    return rec


def verdict(spec: RecordSpec, ratio: float, lo: float, hi: float) -> str:
    """``"met"`` (median within the target and the ci95's upper end within
    :data:`CI_SLACK` of it), ``"missed"``, or ``"too noisy"`` when the ci95 is wider than the
    record's precision and does not lie on one side of the target."""
    if not spec.decisive(lo, hi) and (hi - lo) > spec.precision:
        return "too noisy"
    return "met" if spec.meets(ratio) and hi <= spec.target + CI_SLACK else "missed"


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


__all__ = ["CI_SLACK", "REGISTRY", "STATUSES", "Bench", "NotAvailable", "RecordSpec", "Setting",
           "Skipped", "make_record", "register", "verdict"]
