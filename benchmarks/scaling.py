"""The scaling family: the harness's records on decoders of real shapes, 135M to 1.5B parameters.

Usage (from the repository root)::

    python -m benchmarks.scaling --json benchmarks/results/scaling_cpu.json \\
        --sizes smollm2-135m,smollm2-360m,qwen3-0.6b,llama-3.2-1b,qwen2.5-1.5b \\
        --dtypes float32,bfloat16 --setting 64x1
    python -m benchmarks.scaling --device cuda --json scaling_cuda.json   # the device run
    python -m benchmarks.scaling --sizes smollm2-360m,qwen2.5-1.5b --records none \\
        --corpus-memory naive --memory-setting 64x4 --json corpus_memory.json

What: each size is a decoder built from a real model's configuration (depth, width, heads, KV
heads, MLP width, vocabulary; :data:`SIZES`) with seeded random weights
(:func:`tl_directional.model.load.build_tiny_hf_model`, no download), so the costs are those of
the real shapes (GQA and 150k-token vocabularies included), not of trained weights. For each size
and dtype the harness (:mod:`benchmarks.run`) runs the chosen records on one workload, in its own
process (the peak memory of one size does not carry into the next), and this driver collects the
records with the size's parameter count into one JSON.

The shapes are the published configurations of the named models, except that a head's width is
``d_model / n_heads`` here (Qwen3-0.6B's real ``head_dim`` is 128 with 16 heads on a 1024-wide
stream; here it is 64): ``build_tiny_hf_model`` derives it, and the record says so. The built
models do not tie the unembedding to the embedding (SmolLM2, Llama-3.2-1B and Qwen2.5-1.5B do),
so their weights take ``vocab x d_model`` more memory than the named models'.

Corpus-length memory (``--corpus-memory naive|handwritten|streaming-histogram``): per size and
dtype, the peak memory increment of the streaming ``profile`` and of the comparison side
(``naive``: ``run_with_cache`` + ``Profile.from_cache``; ``handwritten``: ``run_with_cache`` +
torch math; ``streaming-histogram``: ``profile(..., exact_quantiles=0)``) at
``--multipliers`` x one batch of ``--memory-setting`` (:func:`benchmarks.memory.memory_scaling`,
one subprocess per point), under ``corpus_memory`` in the size's entry, each point beside the
memory model's prediction (:func:`corpus_prediction`). A point whose predicted need (the weights
plus the predicted increment) is over ``--memory-headroom`` of the machine's available RAM at
that moment is not run: it is listed in ``skipped`` with the prediction and the RAM it was
compared with. ``--records none`` runs the memory measurement alone (no timed record).

Records: by default the profile, the edit, a sweep setting and the three TransformerLens
comparisons (directional, attribution and path patching); ``--records`` picks others. On CPU the
1B+ sizes take minutes per record even at ``--setting 64x1``; run them alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .sizes import SIZES, Size, build

__all__ = ["MEMORY_HEADROOM", "SIZES", "Size", "available_ram_bytes", "build", "corpus_memory", "corpus_prediction",
           "counted_parameters", "main", "measure"]

DEFAULT_RECORDS = ("profile_overhead", "edit_overhead", "sweep_cost", "patching_vs_transformer_lens",
                   "attribution_vs_transformer_lens", "path_patching_vs_transformer_lens")


def counted_parameters(path: Path) -> int:
    """Parameters stored in the built model's safetensors files (a tied matrix stored once)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                n = 1
                for dim in st.get_slice(key).get_shape():
                    n *= int(dim)
                total += n
    return total


#: The share of MemAvailable a point's predicted need (weights + increment) may take: the rest
#: is for what the model does not count (RSS reads up to a third above it on CPU,
#: docs/performance.md "What the misses were") and for the machine's other jobs.
MEMORY_HEADROOM = 0.7


def available_ram_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (bytes); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def corpus_prediction(name: str, mode: str, dtype: str, seq: int, batch: int, multiplier: int,
                      count: str = "rss") -> float:
    """The memory model's peak increment (bytes) of one corpus memory point: ``multiplier x
    batch`` sequences of ``seq`` tokens; in VmHWM (``count="rss"``: the first-call term and the
    VmHWM fits included) or in live tensor bytes (``"live"``).

    ``streaming`` / ``streaming-histogram``: :func:`benchmarks.memory_model.estimate`'s
    ``profile`` in batches of ``batch``, the corpus's tokens given (what the summaries keep grows
    with them), with ``exact_quantiles`` 0 for the histogram-only mode; ``naive`` /
    ``handwritten``: its ``cache_split`` (``run_with_cache`` of the profile's hooks + a split)
    over the whole corpus: the model has no term of its own for ``Profile.from_cache``'s work
    on the cache (the forward's end is the larger)."""
    from .memory_model import DTYPE_BYTES, EXACT_QUANTILE_LIMIT, estimate

    if DTYPE_BYTES.get(dtype) is None:
        raise ValueError(f"dtype={dtype!r} has no byte size in the memory model; use one of {list(DTYPE_BYTES)}")
    shape = SIZES[name].shape
    tokens = multiplier * batch * seq
    if mode in ("streaming", "streaming-histogram"):
        limit = 0 if mode == "streaming-histogram" else EXACT_QUANTILE_LIMIT
        return estimate(shape, "profile", batch, seq, dtype, tokens=tokens, exact_quantiles=limit,
                        fixed=count == "rss")["total"]
    return estimate(shape, "cache_split", multiplier * batch, seq, dtype, fixed=count == "rss")["total"]


def corpus_memory(name: str, dtype: str, args: argparse.Namespace, root: Path) -> dict:
    """The corpus-length memory measurement of size ``name`` in ``dtype``
    (:func:`benchmarks.memory.memory_scaling`), points predicted not to fit skipped, every
    point's prediction beside it."""
    from .memory import memory_scaling
    from .memory_model import DTYPE_BYTES, MB

    seq, batch = (int(x) for x in args.memory_setting.split("x"))
    multipliers = tuple(int(m) for m in args.multipliers.split(","))
    weights = SIZES[name].parameters() * DTYPE_BYTES[dtype]
    checks: list[dict] = []

    def skip(mode: str, m: int) -> str | None:
        need = weights + corpus_prediction(name, mode, dtype, seq, batch, m)
        avail = available_ram_bytes()
        checks.append({"mode": mode, "multiplier": m, "predicted_need_gb": need / 1e9,
                       "available_gb": None if avail is None else avail / 1e9})
        if avail is not None and need > args.memory_headroom * avail:
            return (f"predicted {need / 1e9:.1f} GB (weights {weights / 1e9:.1f} GB + increment "
                    f"{(need - weights) / 1e9:.1f} GB, memory model) > {args.memory_headroom:g} x "
                    f"MemAvailable {avail / 1e9:.1f} GB")
        return None

    try:
        out = memory_scaling(str(build(name, root)), seq=seq, batch_size=batch, device=args.device,
                             dtype=dtype, multipliers=multipliers, threads=args.threads,
                             log=lambda m: print(m, file=sys.stderr, flush=True),
                             other=args.corpus_memory, skip=skip, timeout=args.worker_timeout,
                             count=args.corpus_count)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, never hidden
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "ram_checks": checks}
    out["predicted_mb"] = {mode: [corpus_prediction(name, mode, dtype, seq, batch, m, args.corpus_count) / MB
                                  for m in multipliers] for mode in ("streaming", args.corpus_memory)}
    what = "VmHWM (first-call term included)" if args.corpus_count == "rss" else "live tensor bytes"
    out["predicted_note"] = (f"benchmarks.memory_model, {what}: streaming = "
                             "profile at one batch, exact-quantile term at the corpus's tokens; "
                             f"{args.corpus_memory} = cache_split over the whole corpus")
    out["weights_gb"] = weights / 1e9
    out["headroom"] = args.memory_headroom
    out["ram_checks"] = checks
    return out


def measure(name: str, dtype: str, args: argparse.Namespace, root: Path) -> dict:
    """One harness run (its own process) for size ``name`` in ``dtype``; its JSON document."""
    out = root / f"{name}-{dtype}.json"
    cmd = [sys.executable, "-m", "benchmarks.run", "--model", str(build(name, root)), "--dtype", dtype,
           "--device", args.device, "--records", args.records, "--setting", args.setting,
           "--no-memory", "--no-wide", "--json", str(out), "--max-seconds", str(args.max_seconds)]
    cmd += ["--peak-memory"] if args.peak_memory else ["--no-peak-memory"]
    if args.min_pairs is not None:
        cmd += ["--min-pairs", str(args.min_pairs), "--max-pairs", str(max(args.min_pairs, args.max_pairs))]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not out.exists():
        return {"status": "error", "returncode": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
    doc = json.loads(out.read_text())
    doc["driver_seconds"] = time.time() - started
    return doc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=",".join(n for n in SIZES if n != "tiny"),
                   help=f"comma-separated subset of {','.join(SIZES)}")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    p.add_argument("--records", default=",".join(DEFAULT_RECORDS))
    p.add_argument("--setting", default="64x1", help="SEQxBATCH, one workload for every size")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--min-pairs", type=int, default=None)
    p.add_argument("--max-pairs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up pairs per record (the harness's default, 1, when not given)")
    p.add_argument("--peak-memory", action="store_true", help="peak memory of each side (slow)")
    p.add_argument("--corpus-memory", choices=("naive", "handwritten", "streaming-histogram"), default=None,
                   help="also measure peak memory against corpus length, streaming profile vs this side")
    p.add_argument("--corpus-count", choices=("rss", "live"), default="rss",
                   help="what --corpus-memory's workers count: VmHWM (rss, what a user sees) or the live "
                        "tensor bytes (live: torch.profiler's allocations, what the memory model describes; slow)")
    p.add_argument("--memory-setting", default="64x4", help="SEQxBATCH of --corpus-memory's batch")
    p.add_argument("--multipliers", default="1,4,16", help="--corpus-memory's corpus sizes, in batches")
    p.add_argument("--memory-headroom", type=float, default=MEMORY_HEADROOM,
                   help="skip a --corpus-memory point whose predicted need is over this share of MemAvailable")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the --corpus-memory workers")
    p.add_argument("--worker-timeout", type=float, default=900.0,
                   help="seconds a --corpus-memory worker may run (a point past it is listed in failed)")
    p.add_argument("--workdir", default=None, help="where the built models go (default: a temp dir)")
    p.add_argument("--json", required=True, metavar="OUT")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build and measure every size x dtype; write one JSON; exit 1 if any run errored."""
    args = parse_args(argv)
    names = [n.strip() for n in args.sizes.split(",") if n.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        print(f"python -m benchmarks.scaling: error: --sizes has unknown name(s) {unknown}; "
              f"known: {list(SIZES)}", file=sys.stderr)
        return 2
    root = Path(args.workdir or tempfile.mkdtemp(prefix="tl_directional_scaling_"))
    root.mkdir(parents=True, exist_ok=True)
    pairs = [(n, d.strip()) for n in names for d in args.dtypes.split(",") if d.strip()]
    timed = args.records.strip().lower() not in ("", "none")
    if not timed and not args.corpus_memory:
        print("python -m benchmarks.scaling: error: --records none measures nothing without "
              "--corpus-memory naive|handwritten; give records or --corpus-memory", file=sys.stderr)
        return 2
    if args.corpus_count == "live" and (not args.corpus_memory or not args.device.startswith("cpu")):
        print(f"python -m benchmarks.scaling: error: --corpus-count live counts a CPU worker's tensors "
              f"(--corpus-memory {args.corpus_memory}, --device {args.device}); give --corpus-memory and "
              f"--device cpu, or leave --corpus-count out (on CUDA the peak is the allocator's already)",
              file=sys.stderr)
        return 2
    runs: list[dict] = []
    for name, dtype in pairs:
        print(f"scaling: {name} in {dtype} ...", file=sys.stderr, flush=True)
        entry = {"size": name, "dtype": dtype, "shape": asdict(SIZES[name]),
                 "parameters_published_shape": SIZES[name].parameters(),
                 "run": measure(name, dtype, args, root) if timed else {"status": "skipped",
                                                                       "reason": "--records none"}}
        if args.corpus_memory:
            entry["corpus_memory"] = corpus_memory(name, dtype, args, root)
        entry["parameters"] = counted_parameters(build(name, root))
        runs.append(entry)
        # written after every size and dtype: a run stopped for time keeps what it measured
        _write(args, argv, runs, complete=len(runs) == len(pairs))
    return 1 if any(r["run"].get("status") == "error" or r.get("corpus_memory", {}).get("status") == "error"
                    for r in runs) else 0


def _write(args: argparse.Namespace, argv: list[str] | None, runs: list[dict], complete: bool) -> None:
    """The family's JSON so far (``complete`` false until every size and dtype has run)."""
    doc = {"command": "python -m benchmarks.scaling " + " ".join(sys.argv[1:] if argv is None else argv),
           "setting": args.setting, "device": args.device, "runs": runs, "complete": complete}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)

if __name__ == "__main__":
    raise SystemExit(main())
