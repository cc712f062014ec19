"""Peak memory of one record's baseline and of its candidate, one fresh subprocess per
(record, side), beside the record's ratio (``extra.peak_memory``).

On CPU a process's peak RSS (``VmHWM``) only grows, so the timing process cannot say what one
call peaked at after the model loads, the checks and every earlier record. The harness
therefore starts, for each record on the primary setting, two subprocesses::

    python -m benchmarks.peak_memory --record edit_overhead --model smollm2-135m \\
        --seq 128 --batch 8 --side candidate

Each loads the model, builds the same inputs, runs one plain forward of 8 tokens (torch's and
TransformerLens's one-off lazy set-up) and reads every weight once (a model loaded from
memory-mapped safetensors is paged in on first read: without it the embedding matrix, of which a
forward reads a few rows, would count in the first analysis that scans the weights), then runs
the record function with
``Bench.probe = side``: the record skips its sanity checks, does its set-up (edits, grids,
prompt pairs) and, at :meth:`benchmarks.registry.Bench.measure`, this module's :func:`peak_of`
runs the side **once**:

* CPU: ``gc.collect()``, reset ``VmHWM`` to the current RSS (``echo 5 > /proc/self/clear_refs``),
  read ``VmRSS`` (``before_mb``), call, read ``VmHWM`` (``peak_mb``); ``increment_mb`` is the
  difference: what the call itself needed on top of the model and inputs;
* CUDA: ``torch.cuda.reset_peak_memory_stats()``, ``memory_allocated`` before, ``max_memory_allocated``.

The subprocess runs with glibc's ``MALLOC_MMAP_THRESHOLD_=65536`` (as :mod:`benchmarks.memory`:
large buffers are mmapped and returned on free, so RSS follows what is alive rather than the
heap's history). The worker prints one JSON line prefixed by ``BENCH_PEAK_JSON``.
``peer_nnsight`` runs its probe in the nnsight worker (:mod:`benchmarks.peers`), which loads its
own models.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import run as bench_run
from .peak_measure import MARKER, SIDES
from .registry import REGISTRY, Bench, ProbeDone, Setting
from .workloads import forward


def probe(record: str, model_source: str, seq: int, batch: int, side: str, *, device: str = "cpu",
          dtype: str = "float32", threads: int = 1) -> dict:
    """In this process: peak memory of one call of ``side`` of ``record`` on its primary setting."""
    import torch

    if threads and device == "cpu":
        torch.set_num_threads(threads)
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    spec = REGISTRY[record]
    setting = Setting(seq, batch, primary=True)
    config = bench_run.Config(mode="probe", model=model_source, device=device, dtype=dtype, warmup=0,
                              min_pairs=1, max_pairs=1, max_seconds=0.0, memory=False, seed=0,
                              threads=threads, settings=[setting], records=[record])
    harness = bench_run.Harness(config, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        model = harness.model("main")
        inputs = harness.inputs(setting)
        from tl_directional.model.inputs import TokenBatch

        forward(model, TokenBatch(inputs.tokens[:1, :8], inputs.attention_mask[:1, :8]), None)
        # every weight resident before the call: a forward reads only the embedding rows of its
        # tokens, and a model loaded from memory-mapped safetensors pages the rest in at the first
        # full read (every analysis verb's non-finite scan), which RSS would count as the call's
        with torch.no_grad():
            for p in model.parameters():
                p.sum()
        bench = Bench(spec, setting, model, harness.source("main"), inputs, harness, seed=0,
                      probe=side)
        try:
            spec.fn(bench)
        except ProbeDone as done:
            return {**done.result, "side": side}
        raise RuntimeError(f"record {record!r} returned without calling Bench.measure")
    finally:
        harness.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peak_memory", description=__doc__.split("\n")[0])
    p.add_argument("--record", required=True)
    p.add_argument("--model", default="default")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--side", choices=SIDES, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    res = probe(a.record, a.model, a.seq, a.batch, a.side, device=a.device, dtype=a.dtype,
                threads=a.threads)
    print(MARKER + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
