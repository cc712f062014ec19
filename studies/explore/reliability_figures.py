"""The two measured figures of docs/reliability.md and docs/edit.md, regenerated:

    python -m studies.explore.reliability_figures [--repeats 30]

1. The overflow guard's cost: the time of one guard check (``edit.tensors.cast_back`` on an
   edited tensor of the default model's shape, the check's reduction and ``isfinite``) and an
   edited forward's time with the guard, both on the bundled default model at 8 x 128 tokens,
   one CPU thread; medians over ``--repeats`` runs.
2. What ``tld.required_hooks`` saves: the distinct tensors and bytes of a full
   ``run_with_cache`` against one filtered by ``required_hooks`` on the same model and tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import tl_directional as tld
from tl_directional.edit.tensors import cast_back
from tl_directional.model.load import load_model


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    model = load_model("default")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.d_vocab, (8, 128), generator=gen)
    cfg = model.cfg
    z = torch.randn(8, 128, cfg.n_heads, cfg.d_head, generator=gen)
    edit = tld.ValueScale(0.0)
    guard = _median_seconds(lambda: cast_back(z * 0.5, z, edit, 0), args.repeats * 10)
    with tld.apply_edits(model, edit):
        forward = _median_seconds(lambda: model(tokens), args.repeats)
    print(f"guard: {guard * 1e3:.3f} ms per edited tensor [8, 128, {cfg.n_heads}, {cfg.d_head}]; "
          f"edited forward {forward * 1e3:.1f} ms; {cfg.n_layers} guarded tensors per forward = "
          f"{100 * cfg.n_layers * guard / forward:.2f}% of it")

    _, full = model.run_with_cache(tokens)
    _, part = model.run_with_cache(tokens, names_filter=tld.required_hooks(model))

    def distinct(cache):
        return {(t.data_ptr(), tuple(t.shape)): t for t in (cache[k] for k in cache.keys())}

    f, p = distinct(full), distinct(part)
    mib = lambda d: sum(t.numel() * t.element_size() for t in d.values()) / 2**20  # noqa: E731
    print(f"required_hooks: {len(p)} of {len(f)} tensors, {mib(p):.1f} of {mib(f):.1f} MiB "
          "(default model, 8 x 128 tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
