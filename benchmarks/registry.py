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

from .peak_measure import peak_of
from .timing import PairedTiming, median_ci, paired_timing

#: Record status values in the JSON.
STATUSES = ("ok", "not_available", "skipped", "error")


class NotAvailable(Exception):  # noqa: N818 - a status, not an error
    """The feature a record measures is not built yet (its module or function is missing)."""


class Skipped(Exception):  # noqa: N818 - a status, not an error
    """The record cannot run here (e.g. an optional peer library is not installed)."""


class ProbeDone(Exception):  # noqa: N818 - control flow of the peak-memory probe
    """Raised by :meth:`Bench.measure` in a peak-memory probe once the side is measured, so the
    record function stops there (what it does after timing is not part of either side)."""

    def __init__(self, result: dict):
        super().__init__("probe done")
        self.result = result


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
    #: Catalogue model name -> target at the primary setting on that model (issue 22 gives some
    #: records a model-dependent target); every other (model, setting) uses ``target``.
    model_targets: dict[str, float] = field(default_factory=dict)
    #: Fewest recorded pairs before the hard time budget may stop a slow record.
    floor_pairs: int = 5

    def for_target(self, target: float) -> RecordSpec:
        """This spec with another target (the one a (model, setting) uses)."""
        if target == self.target:
            return self
        import dataclasses

        return dataclasses.replace(self, target=float(target))

    def target_for(self, model_name: str | None, setting: Setting | None) -> tuple[float, str]:
        """``(target, where it comes from)`` for ``setting`` on the catalogue model
        ``model_name`` (``None``: not a catalogue model)."""
        if (model_name in self.model_targets and setting is not None and setting.primary
                and setting.model == "main"):
            return self.model_targets[model_name], f"{model_name} at the primary setting"
        return self.target, "default"

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
             primary_only: bool = False, model_targets: dict[str, float] | None = None,
             floor_pairs: int = 5):
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
        model_targets: catalogue model name -> the target at the primary setting on that model
            (e.g. ``{"smollm2-135m": 0.90}``); the JSON's ``target`` is the one used.
        floor_pairs: fewest pairs before the hard time budget stops a record whose pairs are
            minutes long (the ci95 of so few pairs then decides the verdict honestly).
    """
    if op not in ("<=", "<"):
        raise ValueError(f"op must be '<=' or '<', got {op!r}")

    def deco(fn: Callable[[Bench], PairedTiming]):
        if name in REGISTRY:
            raise ValueError(f"record {name!r} is registered twice")
        doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        REGISTRY[name] = RecordSpec(name, fn, float(target), op, float(precision), baseline,
                                    candidate, doc, tuple(models), bool(primary_only),
                                    {k: float(v) for k, v in (model_targets or {}).items()},
                                    int(floor_pairs))
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
        model_source: what :func:`tl_directional.model.load.load_model` loads it from (a
            directory or ``"default"``), for subprocesses.
        inputs: a :class:`tl_directional.model.inputs.TokenBatch` of ``setting.batch`` sequences of
            ``setting.seq`` tokens, on the model's device.
        harness: the running harness (config, device, dtype, model loader).
        extra: record-specific numbers to store under ``"extra"`` in the JSON.
        probe: ``None`` when timing; ``"baseline"`` or ``"candidate"`` in a peak-memory probe
            (:mod:`benchmarks.peak_memory`): :meth:`measure` then runs that side once under the
            peak-memory meter and raises :class:`ProbeDone`.
        started: ``time.perf_counter()`` when the harness started this record and setting.
    """

    spec: RecordSpec
    setting: Setting
    model: Any
    model_source: str
    inputs: Any
    harness: Any
    seed: int
    extra: dict = field(default_factory=dict)
    probe: str | None = None
    started: float | None = None

    @property
    def check(self) -> bool:
        """Whether the record should run its sanity checks (not in a peak-memory probe, whose
        subprocess only measures one side)."""
        return self.probe is None

    @property
    def device(self):
        return self.harness.device

    @property
    def sync(self) -> Callable[[], None] | None:
        return self.harness.sync

    def fresh_model(self):
        """A private copy of this setting's model (for records that train or mutate it)."""
        return self.harness.load(self.setting.model)

    def measure(self, baseline: Callable[[], object], candidate: Callable[[], object], *,
                one: Callable[[], object] | None = None, repeat: int = 1) -> PairedTiming:
        """Paired, interleaved timing of ``candidate`` against ``baseline`` (see
        :mod:`benchmarks.timing`), with this record's stopping rule.

        The warm-up pairs are skipped when the record's own checks before this call took longer
        than ``max_seconds`` (a record whose calls are minutes long: those checks have already
        run the candidate, and the baseline's work, once); ``extra.warmup_note`` says so.

        ``one`` and ``repeat``: the baseline is ``repeat`` identical sequential calls of ``one``
        (k plain forwards of the same batch). Where the harness runs with
        ``config.scaled_baselines`` (catalogue real models, whose forward is seconds), each pair
        times ``one`` once and counts it ``repeat`` times (``extra.baseline_scaled``); the peak
        memory probe of the baseline runs ``one`` (each call's output is freed before the next,
        so the peak is the same).

        In a peak-memory probe (``self.probe`` set) nothing is timed: the probed side runs once
        under the meter and :class:`ProbeDone` is raised.
        """
        import time

        if self.probe is not None:

            side = self.probe
            fn = candidate if side == "candidate" else (one or baseline)
            result = peak_of(fn, self.device)
            if side == "baseline" and one is not None:
                result["note"] = (f"one of the baseline's {repeat} identical sequential calls (each "
                                  "one's output is freed before the next: the same peak)")
            raise ProbeDone(result)
        cfg = self.harness.config
        scale = 1.0
        if one is not None and repeat > 1 and getattr(cfg, "scaled_baselines", False):
            baseline, scale = one, float(repeat)
            self.extra["baseline_scaled"] = (
                f"each pair times one of the baseline's {repeat} identical plain forwards and counts "
                f"it {repeat} times (catalogue real model: a forward is seconds)")
        spec = self.spec

        def done(ratios: list[float]) -> bool:
            _, (lo, hi) = median_ci(ratios, seed=self.seed)
            return spec.decisive(lo, hi) or (hi - lo) <= spec.precision

        warmup = cfg.warmup
        if warmup and self.started is not None:
            checks_s = time.perf_counter() - self.started
            if checks_s > cfg.max_seconds:
                warmup = 0
                self.extra["warmup_note"] = (
                    f"no warm-up pair: the record's checks before timing took {checks_s:.0f} s "
                    f"(> max_seconds={cfg.max_seconds:g}) and already ran its calls once")
        return paired_timing(baseline, candidate, warmup=warmup, min_pairs=cfg.min_pairs,
                             max_pairs=cfg.max_pairs, max_seconds=cfg.max_seconds, done=done,
                             sync=self.sync, floor_pairs=min(self.floor_pairs, cfg.min_pairs),
                             baseline_scale=scale)

    @property
    def floor_pairs(self) -> int:
        """The record's floor, lowered to 3 on catalogue real models (``config.real_floor_pairs``)."""
        real = getattr(self.harness.config, "real_floor_pairs", None)
        return min(self.spec.floor_pairs, real) if real else self.spec.floor_pairs


def make_record(spec: RecordSpec, setting: Setting | None, *, status: str,
                timing: PairedTiming | None = None, extra: dict | None = None,
                reason: str | None = None, seed: int = 0, target_source: str = "default") -> dict:
    """The JSON record of one measurement (or of a record that could not be measured).

    ``spec`` carries the target used (see :meth:`RecordSpec.for_target`); ``target_source``
    says where it comes from (``"default"`` or e.g. ``"smollm2-135m at the primary setting"``).
    """
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
        "target_source": target_source,
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


__all__ = ["CI_SLACK", "REGISTRY", "STATUSES", "Bench", "NotAvailable", "ProbeDone", "RecordSpec",
           "Setting", "Skipped", "make_record", "register", "verdict"]
