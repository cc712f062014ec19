"""Where a ``profile`` call's time goes, and a value edit's, beside a forward with logits.

Usage (from the repository root)::

    python -m benchmarks.breakdown --model smollm2-135m --setting 128x8 --calls 3
    python -m benchmarks.breakdown --model smollm2-135m --json OUT.json   # the table also as JSON

What: the harness's ``profile_overhead`` candidate (``profile`` of every component, one batch,
``verify=False``) and ``edit_overhead`` candidate (``ValueScale(s_par=0)`` on every layer and head)
run with wall-clock timers wrapped around the functions the library calls per layer (module
attributes replaced for the run, put back after; no library code changes and nothing is timed
twice: a stage's own time is its total less the stages it calls). Each call of a candidate is
paired with a forward with logits, alternating, and every figure is a median over ``--calls``
calls, in seconds and as a share of that forward. ``W_O x GEMM`` is timed on its own after the
calls (the same shapes, one product per layer), so it is a part of ``value_stats``, not beside it.

Timers cost about a microsecond per wrapped call (a few hundred per profile call), far under the
figures they report. The stages are a map of the cost, not a ratio to compare across machines:
``benchmarks.kernel_paths`` gives the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from .jsonout import write_json

#: (module path, attribute, stage label) of every timed function of a profile call; a class
#: attribute is ``Class.method``.
PROFILE_STAGES = (
    ("tl_directional.measure.stream", "split_stats", "residual splits (split_stats)"),
    ("tl_directional.measure.stream", "squared_norm", "reference squared norms"),
    ("tl_directional.measure.stream", "value_stats", "value splits (value_stats)"),
    ("tl_directional.measure.stream", "_pattern_diagonal", "pattern diagonal copy"),
    ("tl_directional.measure.stream", "_Accumulator.add_residual", "add_residual rest (select, dict)"),
    ("tl_directional.measure.stream", "_Accumulator.add_value", "add_value rest (select, weights)"),
    ("tl_directional.measure.stream", "_Accumulator.add_factorization_check", "factorization check"),
    ("tl_directional.core.stats", "StreamingSummary.update", "statistics staging (update)"),
    ("tl_directional.core.stats", "StreamingSummary.flush", "statistics sums (flush)"),
    ("tl_directional.measure.profiler", "_finish", "tables (quantiles, frames)"),
    ("tl_directional.measure.profiler", "_raise_if_nonfinite", "finite check of the sums"),
)
#: The same for the edit's hook.
EDIT_STAGES = (
    ("tl_directional.edit.value", "value_split_scaled", "edit split (value_split_scaled)"),
    ("tl_directional.edit.value", "cast_back", "edit output check (cast_back)"),
)


class Clock:
    """Inclusive and own (inclusive less the timed stages called inside) seconds per label."""

    def __init__(self) -> None:
        self.own: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[float]] = []  # per open stage: [seconds of timed children]

    def wrap(self, label: str, fn):
        def timed(*args, **kwargs):
            self._stack.append([0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.perf_counter() - t0
                children = self._stack.pop()[0]
                self.own[label] += total - children
                self.calls[label] += 1
                if self._stack:
                    self._stack[-1][0] += total
        return timed

    def reset(self) -> None:
        self.own.clear()
        self.calls.clear()


def _resolve(module: str, attr: str):
    mod = sys.modules.get(module) or __import__(module, fromlist=["_"])
    owner = mod
    parts = attr.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    return owner, parts[-1]


@contextmanager
def instrumented(clock: Clock, stages):
    """Every stage's function replaced by its timed wrapper; the originals put back after."""
    saved = []
    try:
        for module, attr, label in stages:
            owner, name = _resolve(module, attr)
            fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            saved.append((owner, name, fn))
            setattr(owner, name, clock.wrap(label, fn))
        yield clock
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)


def _hooks_timed(clock: Clock, label: str, hooks):
    return [(name, clock.wrap(label, fn)) for name, fn in hooks]


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _measure(clock: Clock, fwd, cand, calls: int) -> tuple[list[float], list[float], list[dict]]:
    """``calls`` alternating (forward, candidate) pairs after one warm-up pair: forward seconds,
    candidate seconds and the clock's own seconds per stage of each candidate call."""
    fwd(), cand()
    f_s, c_s, stages = [], [], []
    for i in range(calls):
        clock.reset()
        if i % 2 == 0:
            f_s.append(_time(fwd))
            clock.reset()
            c_s.append(_time(cand))
        else:
            c_s.append(_time(cand))
            stages.append(dict(clock.own))
            f_s.append(_time(fwd))
            continue
        stages.append(dict(clock.own))
    return f_s, c_s, stages


def _wo_gemm_seconds(model, n_tokens: int, calls: int) -> float:
    """Median seconds of the value split's ``W_O[h] x_t`` products of one forward (one
    ``[n, d_model] @ [d_model, n_heads d_head]`` per layer, float32, seeded inputs)."""
    from tl_directional.model.sites import resolve_sites
    from tl_directional.model.weights import attention_output_weights

    sites = resolve_sites(model, warn=False)
    g = torch.Generator().manual_seed(0)
    ws = [attention_output_weights(model, L)[0].detach().float() for L in range(sites.n_layers)]
    x = torch.randn(n_tokens, ws[0].shape[-1], generator=g)
    mats = [w.reshape(-1, w.shape[-1]).T for w in ws]
    out = torch.empty(n_tokens, mats[0].shape[1])

    def run():
        for w in mats:
            torch.matmul(x, w, out=out)

    run()
    return statistics.median(_time(run) for _ in range(calls))


def _rows(f_s, c_s, stages, extra: dict[str, float]) -> list[dict]:
    fwd = statistics.median(f_s)
    cand = statistics.median(c_s)
    labels = sorted({k for s in stages for k in s})
    rows = [{"stage": "forward with logits (baseline)", "seconds": fwd}]
    timed = 0.0
    for lab in labels:
        sec = statistics.median(s.get(lab, 0.0) for s in stages)
        timed += sec
        rows.append({"stage": lab, "seconds": sec})
    for lab, sec in extra.items():
        rows.append({"stage": lab, "seconds": sec})
    rows.append({"stage": "candidate, untimed rest (the model's own forward, dispatch)", "seconds": cand - timed})
    rows.append({"stage": "candidate call (total)", "seconds": cand})
    for r in rows:
        r["share_of_forward"] = r["seconds"] / fwd
    return rows


def profile_breakdown(model, batch, calls: int) -> list[dict]:
    """The stage table of a ``profile`` call of every component (see the module docstring)."""
    from tl_directional import profile
    from tl_directional.measure import profiler

    from .workloads import all_components, forward

    comps = all_components(model)
    clock = Clock()
    orig_hooks = profiler._streaming_hooks

    def hooks(*a, **k):
        hs, n = orig_hooks(*a, **k)
        return _hooks_timed(clock, "hook functions rest (block difference, state, dispatch)", hs), n

    def cand():
        profile(model, batch, batch_size=len(batch), components=comps, verify=False, progress=False,
                exclude_first_token=False)

    with instrumented(clock, PROFILE_STAGES):
        profiler._streaming_hooks = hooks
        try:
            f_s, c_s, stages = _measure(clock, lambda: forward(model, batch, "logits"), cand, calls)
        finally:
            profiler._streaming_hooks = orig_hooks
    n = batch.tokens.numel()
    return _rows(f_s, c_s, stages, {"  of which W_O x GEMM (timed alone)": _wo_gemm_seconds(model, n, calls)})


def edit_breakdown(model, batch, calls: int) -> list[dict]:
    """The stage table of a forward with logits under ``ValueScale(s_par=0)`` on every layer and head."""
    from tl_directional import ValueScale, apply_edits

    from .workloads import forward

    clock = Clock()
    edit = ValueScale(s_par=0.0)

    def cand():
        with apply_edits(model, edit):
            forward(model, batch, "logits")

    orig = edit.fwd_hooks

    def fwd_hooks(m):
        return [(name, clock.wrap("edit hooks rest (state, scale factors)", fn)) for name, fn in orig(m)]

    edit.fwd_hooks = fwd_hooks
    with instrumented(clock, EDIT_STAGES):
        f_s, c_s, stages = _measure(clock, lambda: forward(model, batch, "logits"), cand, calls)
    return _rows(f_s, c_s, stages, {})


def format_rows(title: str, rows: list[dict]) -> str:
    lines = [title, f"{'stage':62s} {'seconds':>9s} {'x forward':>10s}"]
    for r in rows:
        lines.append(f"{r['stage']:62s} {r['seconds']:9.4f} {r['share_of_forward']:10.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.breakdown", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="anything load_model takes")
    p.add_argument("--setting", default="128x8", help="SEQxBATCH")
    p.add_argument("--calls", type=int, default=3, help="timed (forward, candidate) pairs per table")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--what", default="profile,edit", help="comma-separated subset of profile,edit")
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args(argv)
    from tl_directional.model.load import load_model

    from .run import machine_info
    from .workloads import text_batch

    torch.set_num_threads(args.threads)
    seq, n_seq = (int(s) for s in args.setting.lower().split("x"))
    model = load_model(args.model).eval()
    batch = text_batch(model, n_seq, seq)
    doc = {"command": "python -m benchmarks.breakdown " + " ".join(sys.argv[1:] if argv is None else argv),
           "machine": machine_info("cpu", "float32"), "load_average_start": os.getloadavg(), "tables": {}}
    for what in [w.strip() for w in args.what.split(",") if w.strip()]:
        fn = {"profile": profile_breakdown, "edit": edit_breakdown}[what]
        with torch.no_grad():
            rows = fn(model, batch, args.calls)
        doc["tables"][what] = rows
        print(format_rows(f"{what}: {args.model}, {args.setting}, {args.threads} thread(s), median of "
                          f"{args.calls} calls", rows), flush=True)
    doc["load_average_end"] = os.getloadavg()
    print(f"load average (1, 5, 15 min): start {doc['load_average_start']}, end {doc['load_average_end']}")
    if args.json:
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
