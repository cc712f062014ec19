"""Peak memory of streaming ``profile`` vs the naive cache, one subprocess per corpus size.

Peak RSS only grows inside a process, so each (way, size) pair runs in its own subprocess::

    python -m benchmarks.memory --model default --mode streaming --n-seq 128 --seq 128 --batch 8

The worker loads the model, builds the inputs, runs one plain forward on a single 8-token
sequence (so torch's and TransformerLens' one-off lazy set-up is paid before the baseline, and
no batch-sized activations are held), then

* on CPU: resets the kernel's peak-RSS mark (``echo 5 > /proc/self/clear_refs`` sets VmHWM
  to the current VmRSS), reads the baseline VmRSS, does the work, reads VmHWM; the result is
  ``VmHWM - baseline``. Where ``clear_refs`` is not available it falls back to
  ``resource.getrusage`` (``ru_maxrss`` cannot be reset, so a load-time peak can hide a smaller
  run-time peak; the JSON says which method was used);
* on CUDA: ``torch.cuda.reset_peak_memory_stats()``, baseline ``memory_allocated()``, peak
  ``max_memory_allocated()``.

The subprocess runs with ``MALLOC_MMAP_THRESHOLD_=65536`` (unless the caller's environment
sets it): glibc's default *dynamic* mmap threshold keeps freed activation buffers in the heap
after the first batch, so peak RSS then depends on fragmentation history (33 to 40 MB for the
same 1x run in trials here) rather than on what is alive. A fixed threshold makes every large
tensor an mmap that is returned on free, so RSS follows live memory. The JSON records it
(``allocator``); set ``MALLOC_MMAP_THRESHOLD_`` yourself to measure another way.

The work is either ``profile(model, all_sequences, batch_size=B, verify=False)`` (streaming,
one batch of activations alive at a time) or the naive way: one ``run_with_cache`` of every
needed hook over all sequences, then ``Profile.from_cache`` (the only way to get one
``Profile`` of the whole corpus from a cache). The worker prints one JSON line prefixed by
``BENCH_MEMORY_JSON``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MARKER = "BENCH_MEMORY_JSON "
REPO_ROOT = Path(__file__).resolve().parent.parent

#: glibc mmap threshold for the worker (bytes), see the module docstring.
MMAP_THRESHOLD = "65536"
#: What the worker can run: streaming profile, run_with_cache + Profile.from_cache,
#: run_with_cache + hand-written torch math (:func:`benchmarks.workloads.handwritten_profile`), or
#: the streaming profile keeping no values for exact quantiles (``exact_quantiles=0``).
MODES = ("streaming", "naive", "handwritten", "streaming-histogram")
#: Corpus sizes, as multiples of one batch, at which memory is reported.
MULTIPLIERS = (1, 4, 16)
#: Allowed growth of streaming peak memory from 1x to 16x (the target).
STREAMING_GROWTH_TARGET = 1.10
#: What the live count is (:func:`live_peak_of`), as a run's JSON states it.
METHOD_LIVE = ("fresh subprocess per (record, side): the high-water mark of the bytes torch's CPU "
               "allocator holds for live tensors during one call (torch.profiler profile_memory: the "
               "running sum of every allocation and free), over what was live before it")
#: The workers' environment variable that picks what they count on CPU (this module's corpus
#: worker and :func:`benchmarks.peak_measure.peak_of`): ``rss`` (VmHWM, what a user sees, the
#: allocator's slack included) or ``live`` (:data:`METHOD_LIVE`).
COUNT_ENV = "BENCH_PEAK_COUNT"
COUNTS = ("rss", "live")


def status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Set VmHWM to the current VmRSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    hwm, rss = status_kb("VmHWM"), status_kb("VmRSS")
    return hwm is not None and rss is not None and hwm <= rss + 1024


def live_peak_of(fn) -> dict:
    """Run ``fn()`` once under ``torch.profiler`` with ``profile_memory`` and return the high-water
    mark of the bytes torch's CPU allocator held for tensors during the call over what it held
    before (MB, ``increment_mb``): the running sum of every allocation (positive) and free
    (negative) the profiler recorded, in time order. It counts what is alive, not what the C
    allocator keeps resident (glibc's heap, freed blocks, page rounding), nor memory outside
    torch's allocator (Python objects, memory-mapped weights)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation:
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    mb = 2.0 ** 20
    return {"before_mb": 0.0, "peak_mb": peak / mb, "increment_mb": peak / mb, "call_s": seconds,
            "count": "live", "allocations": sum(size > 0 for _, size in events)}


def measure(model_source: str, mode: str, n_seq: int, seq: int, batch_size: int,
            device: str = "cpu", dtype: str = "float32", threads: int = 0) -> dict:
    """Peak memory increment (MB) of one streaming or naive profile in this process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from tl_directional import profile
    from tl_directional.model.inputs import TokenBatch
    from tl_directional.model.load import load_model

    from .workloads import (
        all_components,
        forward,
        handwritten_profile,
        naive_profile,
        needed_hooks,
        text_batch,
    )

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    model = load_model(model_source, device=device, dtype=getattr(torch, dtype)).eval()
    inputs = text_batch(model, n_seq, seq).to(device)
    comps = all_components(model)
    names = needed_hooks(model, comps)
    forward(model, TokenBatch(inputs.tokens[:1, :8], inputs.attention_mask[:1, :8]))
    gc.collect()

    def work() -> int:  # the tokens the analysis saw
        if mode in ("streaming", "streaming-histogram"):
            limit = {"exact_quantiles": 0} if mode == "streaming-histogram" else {}
            # every token, as the hand-written and peer computations count them
            return int(profile(model, inputs, batch_size=batch_size, components=comps, verify=False,
                               progress=False, exclude_first_token=False, **limit).metadata["tokens_seen"])
        if mode == "naive":
            return int(naive_profile(model, inputs, comps, names).metadata["tokens_seen"])
        return int(handwritten_profile(model, inputs, names)["tokens"])

    cuda = str(device).startswith("cuda")
    if not cuda and os.environ.get(COUNT_ENV, "rss") == "live":  # the live tensor bytes, not VmHWM
        seen: list[int] = []
        live = live_peak_of(lambda: seen.append(work()))
        return {"mode": mode, "n_sequences": n_seq, "seq": seq, "batch_size": batch_size, "tokens_seen": seen[0],
                "baseline_mb": 0.0, "peak_mb": live["peak_mb"], "peak_increment_mb": live["increment_mb"],
                "method": METHOD_LIVE, "count": "live", "allocator": "(not read: the live count)"}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_b = torch.cuda.memory_allocated()
        method = "torch.cuda.max_memory_allocated - memory_allocated before the work"
    elif reset_peak_rss():
        base_b = status_kb("VmRSS") * 1024
        method = "VmHWM after the work - VmRSS before it (VmHWM reset via /proc/self/clear_refs)"
    else:
        base_b = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        method = "ru_maxrss after - ru_maxrss before (not resettable: may under-report)"

    tokens_seen = work()

    if cuda:
        torch.cuda.synchronize()
        peak_b = torch.cuda.max_memory_allocated()
    elif method.startswith("VmHWM"):
        peak_b = status_kb("VmHWM") * 1024
    else:
        peak_b = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "mode": mode,
        "n_sequences": n_seq,
        "seq": seq,
        "batch_size": batch_size,
        "tokens_seen": tokens_seen,
        "baseline_mb": base_b / 2**20,
        "peak_mb": peak_b / 2**20,
        "peak_increment_mb": max(peak_b - base_b, 0) / 2**20,
        "method": method,
        "allocator": "glibc MALLOC_MMAP_THRESHOLD_=" + os.environ.get("MALLOC_MMAP_THRESHOLD_", "(dynamic)"),
    }


def run_worker(model_source: str, mode: str, n_seq: int, seq: int, batch_size: int,
               device: str = "cpu", dtype: str = "float32", threads: int = 0,
               timeout: float = 900, count: str = "rss") -> dict:
    """Run :func:`measure` in a fresh subprocess and return its result; ``count``: what a CPU
    worker counts, VmHWM (``rss``) or the live tensor bytes (``live``,
    :func:`live_peak_of`)."""
    if count not in COUNTS:
        raise ValueError(f"count={count!r} is not a peak count; choose from {COUNTS}")
    if count == "live" and not str(device).startswith("cpu"):
        raise ValueError(f"count='live' counts CPU tensors, not device={device!r}'s; on CUDA leave count "
                         f"out (the worker reads max_memory_allocated)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)
    env[COUNT_ENV] = count
    cmd = [sys.executable, "-m", "benchmarks.memory", "--model", str(model_source), "--mode", mode,
           "--n-seq", str(n_seq), "--seq", str(seq), "--batch", str(batch_size),
           "--device", str(device), "--dtype", dtype, "--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = (proc.stderr or proc.stdout)[-2000:]
    raise RuntimeError(f"memory worker failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def memory_scaling(model_source: str, *, seq: int, batch_size: int, device: str = "cpu",
                   dtype: str = "float32", multipliers=MULTIPLIERS, threads: int = 0,
                   log=print, other: str = "naive", skip=None, timeout: float = 900, count: str = "rss") -> dict:
    """Peak memory of streaming and naive profiling at ``multipliers`` x ``batch_size``
    sequences, one subprocess each; growth is the largest size's increment over the smallest's.

    ``skip(mode, multiplier)`` (optional) returns why a point must not run (e.g. the memory
    model predicts it would not fit in RAM), or None to run it. A skipped point is listed in
    ``skipped`` with its reason and has ``None`` in its increments list; a side's growth is then
    over its measured points only (``growth_multipliers`` says which), ``None`` where fewer than
    two were measured. With ``skip`` given, a point whose worker fails or runs past ``timeout``
    seconds is listed in ``failed`` with the reason (the other points kept); without it, the
    harness's way, the failure is raised. ``count``: as :func:`run_worker`'s."""
    rows: dict[str, list[dict]] = {"streaming": [], other: []}
    increments: dict[str, list[float | None]] = {"streaming": [], other: []}
    skipped: list[dict] = []
    failed: list[dict] = []
    for m in multipliers:
        for mode in ("streaming", other):
            reason = skip(mode, m) if skip is not None else None
            if reason:
                log(f"  memory {mode:9s} {m:>2d}x ({m * batch_size} seqs): skipped: {reason}")
                skipped.append({"mode": mode, "multiplier": m, "n_sequences": m * batch_size,
                                "reason": reason})
                increments[mode].append(None)
                continue
            try:
                r = run_worker(model_source, mode, m * batch_size, seq, batch_size, device, dtype,
                               threads, timeout=timeout, count=count)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                if skip is None:
                    raise
                # one point lost (e.g. a long corpus past the timeout) must not lose the others
                log(f"  memory {mode:9s} {m:>2d}x ({m * batch_size} seqs): failed: {type(exc).__name__}")
                failed.append({"mode": mode, "multiplier": m, "n_sequences": m * batch_size,
                               "reason": f"{type(exc).__name__}: {str(exc)[:500]}"})
                increments[mode].append(None)
                continue
            log(f"  memory {mode:9s} {m:>2d}x ({m * batch_size} seqs): "
                f"+{r['peak_increment_mb']:.1f} MB")
            rows[mode].append({**r, "multiplier": m})
            increments[mode].append(r["peak_increment_mb"])

    def growth(mode):
        pts = [(m, v) for m, v in zip(multipliers, increments[mode], strict=True) if v is not None]
        if len(pts) < 2:
            return None, [m for m, _ in pts]
        (m0, first), (m1, last) = pts[0], pts[-1]
        return (last / first if first > 0 else float("inf")), [m0, m1]

    (s_growth, s_over), (n_growth, n_over) = growth("streaming"), growth(other)
    # met needs the full 1x -> largest streaming growth; the other side only has to grow where
    # it was measured at two sizes or more (a skipped large point cannot make it "not grow")
    full = s_over == [multipliers[0], multipliers[-1]]
    met = None if not full else bool(s_growth <= STREAMING_GROWTH_TARGET
                                      and (n_growth is None or n_growth > s_growth))
    measured = rows["streaming"] or rows[other]
    return {
        "status": "ok",
        "compared_with": other,
        "multipliers": list(multipliers),
        "n_sequences": [m * batch_size for m in multipliers],
        "seq": seq,
        "batch_size": batch_size,
        "streaming_peak_increment_mb": increments["streaming"],
        # "naive_*" whatever `other` is (the key older JSONs use); compared_with names the side
        "naive_peak_increment_mb": increments[other],
        "streaming_growth": s_growth,
        "naive_growth": n_growth,
        "growth_multipliers": {"streaming": s_over, other: n_over},
        "skipped": skipped,
        "failed": failed,
        "target": f"streaming peak increment {multipliers[-1]}x / {multipliers[0]}x <= "
                  f"{STREAMING_GROWTH_TARGET:g} (and the naive way grows)",
        "met": met,
        "method": measured[0]["method"] if measured else None,
        "count": count,
        "allocator": measured[0]["allocator"] if measured else None,
        "runs": rows["streaming"] + rows[other],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--n-seq", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    result = measure(a.model, a.mode, a.n_seq, a.seq, a.batch, a.device, a.dtype, a.threads)
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
