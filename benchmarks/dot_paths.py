"""The measuring kernels' two CPU paths for dot products, timed against each other on this CPU.

Usage (from the repository root)::

    python -m benchmarks.dot_paths                    # SmolLM2-135M's shapes, 1024 tokens
    python -m benchmarks.dot_paths --pairs 40 --json OUT.json

What: one layer of a ``profile`` call's measuring work (``core.kernels.value_stats`` of every head
and ``split_stats`` of three residual units, with the reused buffers a profile passes), seeded
random activations of SmolLM2-135M's shapes (``d_model`` 576, 9 query heads, 3 key-value heads,
``d_head`` 64), once with ``row_dot``'s batched GEMMs (``kernels._GEMM_DOTS = True``, the path on
Intel CPUs) and once with its product-and-sum (``False``, the path elsewhere), in interleaved pairs
(:func:`benchmarks.timing.paired_timing`). Prints the median ratio product-and-sum / GEMM with a
bootstrap interval: below 1, the product-and-sum path is faster on this CPU.

Why: which path is faster depends on the CPU (MKL's small-matrix kernels are tuned for Intel's);
``row_dot`` picks one per machine from the CPU vendor, and this command checks that choice where
it runs. A ratio measured in one run, never an absolute time.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from .jsonout import write_json
from .timing import median_ci, paired_timing


def layer_work(n: int, seed: int):
    """A zero-argument callable doing one layer's measuring kernels on seeded ``[n, ...]`` inputs."""
    from tl_directional.core.kernels import Scratch, split_stats, squared_norm, value_stats

    g = torch.Generator().manual_seed(seed)
    d, heads, kv, e = 576, 9, 3, 64

    def t(*shape):
        return torch.randn(*shape, generator=g)

    x, units = t(n, d), [(t(n, d), t(n, d)) for _ in range(3)]
    z, v, a_tt, w_o = t(n, heads, e), t(n, kv, e), torch.rand(n, heads, generator=g), t(heads, e, d) / d ** 0.5
    scratch = Scratch()

    def run():
        x_sq = squared_norm(x, scratch)
        value_stats(z, v, a_tt, x, w_o, None, x_sq=x_sq, scratch=scratch)
        for u, r in units:
            split_stats(u, r, reference_sq=squared_norm(r, scratch), scratch=scratch)
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dot_paths", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1024, help="rows n (8 x 128 tokens by default)")
    p.add_argument("--pairs", type=int, default=30, help="timed (GEMM, product-and-sum) pairs")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.pairs < 2:
        print("--tokens must be >= 1 and --pairs >= 2 (a ratio needs pairs); e.g. --tokens 1024 --pairs 30",
              file=sys.stderr)
        return 2
    from tl_directional.core import kernels

    from .run import machine_info

    torch.set_num_threads(args.threads)
    work = layer_work(args.tokens, seed=0)

    def with_path(gemm: bool):
        def call():
            kernels._GEMM_DOTS = gemm
            work()
        return call

    chosen = kernels._GEMM_DOTS
    try:
        timing = paired_timing(with_path(True), with_path(False), warmup=3, min_pairs=args.pairs,
                               max_pairs=args.pairs, max_seconds=600.0)
    finally:
        kernels._GEMM_DOTS = chosen
    ratio, ci = median_ci(timing.ratios, seed=0)
    doc = {"command": "python -m benchmarks.dot_paths " + " ".join(sys.argv[1:] if argv is None else argv),
           "machine": machine_info("cpu", "float32"), "load_average_end": os.getloadavg(),
           "cpu_vendor": kernels._cpu_vendor(), "path_chosen_here": "gemm" if chosen else "product_sum",
           "tokens": args.tokens, "pairs": timing.n_pairs, "ratio_product_sum_over_gemm": ratio,
           "ci95": ci, "gemm_s": timing.baseline_s, "product_sum_s": timing.candidate_s}
    print(f"one layer's measuring kernels, {args.tokens} tokens, {args.threads} thread(s), {timing.n_pairs} pairs; "
          f"CPU vendor {doc['cpu_vendor'] or 'unknown'}, row_dot's path here: {doc['path_chosen_here']}")
    print(f"product-and-sum / GEMM: {ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]")
    if args.json:
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
