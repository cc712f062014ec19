"""Peak memory of one call, and both sides of a record measured in fresh worker subprocesses
(the worker is :mod:`benchmarks.peak_memory`, which has the full account)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .memory import COUNT_ENV, COUNTS, live_peak_of, reset_peak_rss, status_kb

MARKER = "BENCH_PEAK_JSON "
REPO_ROOT = Path(__file__).resolve().parent.parent
SIDES = ("baseline", "candidate")
METHOD_CPU = ("fresh subprocess per (record, side): VmHWM after one call - VmRSS before it "
              "(VmHWM reset via /proc/self/clear_refs); glibc MALLOC_MMAP_THRESHOLD_=65536")
METHOD_CUDA = ("fresh subprocess per (record, side): torch.cuda.max_memory_allocated after one "
               "call - memory_allocated before it")


def peak_of(fn, device) -> dict:
    """Run ``fn()`` once and return its peak memory (MB): ``before_mb``, ``peak_mb``,
    ``increment_mb`` (``peak - before``) and the ``method``.

    On CPU, with ``BENCH_PEAK_COUNT=live`` in the environment (:data:`COUNT_ENV`), the increment
    is the live tensor bytes' high-water mark (:func:`live_peak_of`) instead of VmHWM's."""
    import torch

    gc.collect()
    cuda = str(device).startswith("cuda")
    if not cuda and os.environ.get(COUNT_ENV, "rss") == "live":
        return live_peak_of(fn)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        if not reset_peak_rss():
            raise RuntimeError("cannot reset the peak-RSS mark (/proc/self/clear_refs): peak memory "
                               "of one call cannot be measured on this system")
        before = status_kb("VmRSS") * 1024
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = status_kb("VmHWM") * 1024
    mb = 2.0 ** 20
    return {"before_mb": before / mb, "peak_mb": peak / mb, "increment_mb": (peak - before) / mb,
            "call_s": seconds}


def run_probe(record: str, model_source: str, seq: int, batch: int, side: str, *, device: str,
              dtype: str, threads: int, command: list[str] | None = None,
              timeout: float = 3600, count: str = "rss") -> dict:
    """Run one probe in a fresh subprocess (``command``: another worker command line that prints
    the same marker, e.g. the nnsight peer's) and return its JSON; ``count``: what the CPU
    probe counts (:data:`COUNTS`: VmHWM, or the live tensor bytes of :func:`live_peak_of`)."""
    if count not in COUNTS:
        raise ValueError(f"count={count!r} is not a peak count; choose from {COUNTS}")
    env = dict(os.environ)
    if count == "rss":  # the live count does not depend on the C allocator: glibc's defaults there
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    env[COUNT_ENV] = count
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    cmd = command or [sys.executable, "-m", "benchmarks.peak_memory", "--record", record,
                      "--model", model_source, "--seq", str(seq), "--batch", str(batch),
                      "--side", side, "--device", device, "--dtype", dtype,
                      "--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise RuntimeError(f"peak-memory probe failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                       f"{(proc.stderr or proc.stdout)[-2000:]}")


def peak_memory(spec, model_source: str, seq: int, batch: int, *, device: str, dtype: str,
                threads: int, log=None) -> dict:
    """``extra.peak_memory`` of one record: both sides, each in its own subprocess."""
    command_for = getattr(spec.fn, "probe_command", None)
    out: dict = {"status": "ok", "method": METHOD_CUDA if device.startswith("cuda") else METHOD_CPU,
                 "setting": f"seq={seq},batch={batch}"}
    t0 = time.perf_counter()
    for side in SIDES:
        cmd = command_for(model_source, seq, batch, side, threads) if command_for else None
        if command_for and cmd is None:
            return {"status": "skipped", "reason": "the peer's worker is not available here"}
        out[side] = run_probe(spec.name, model_source, seq, batch, side, device=device, dtype=dtype,
                              threads=threads, command=cmd)
        if log:
            log(f"  peak memory {spec.name} {side}: {out[side]['peak_mb']:.0f} MB "
                f"(+{out[side]['increment_mb']:.0f} MB during the call)")
    b, c = out["baseline"]["increment_mb"], out["candidate"]["increment_mb"]
    out["candidate_over_baseline_increment"] = c / b if b > 0 else None
    out["probe_wall_s"] = time.perf_counter() - t0
    return out
