"""Matrix-product floors of the harness's ratios, counted from a model's shape.

Usage (from the repository root)::

    python -m benchmarks.floors                       # the scaling family's sizes, seq 128
    python -m benchmarks.floors --seq 64 --sizes smollm2-135m,qwen2.5-1.5b

What: a ratio's *floor* is what the candidate must cost against its baseline even if every
elementwise pass, hook and statistic were free: the multiply-adds of the matrix products each
side runs, counted per token from the shape (:class:`benchmarks.shapes.Shape`). A target below its floor cannot be
met by making the code faster; it needs less work (fewer units, a cheaper baseline). The counts
are those of TransformerLens's forward: the query / key / value / output projections (GQA: keys
and values of ``n_kv_heads`` heads), the attention scores and the weighted values over the full
``seq x seq`` matrix (TransformerLens computes it whole and masks it), the MLP (three matrices
when gated, two otherwise), and the unembedding; embedding lookups, norms and softmax are not
products and are left out. :func:`forward_macs` is checked against
``torch.utils.flop_counter.FlopCounterMode`` on a tiny model in ``tests/integration/test_floors.py``.

``profile_overhead`` (:func:`profile_floor`): the forward stopped after the last block plus the
value split's ``W_O[h] x_t`` product. ``compression_local_cost`` (:func:`compression_local_floor`): one dense forward stopped after
the last block (no unembedding), one compressed forward stopped there with every unit fed the
dense input, and, where a sequential block is measured as ``mlp`` and as ``block`` at once, the
compressed MLP called a second time on the dense ``resid_mid``
(:mod:`tl_directional.compression.accumulate`); against one full forward of the dense model.
"""

from __future__ import annotations

import argparse

from .shapes import Shape


def attention_macs(s: Shape, seq: int) -> int:
    """Multiply-adds per token of one attention layer: four projections, scores and values."""
    projections = s.d_model * s.dh * (2 * s.n_heads + 2 * s.n_kv_heads)
    return projections + 2 * s.n_heads * s.dh * seq


def mlp_macs(s: Shape) -> int:
    """Multiply-adds per token of one MLP (gate, up and down, or in and out)."""
    return (3 if s.gated_mlp else 2) * s.d_model * s.d_mlp


def block_macs(s: Shape, seq: int) -> int:
    """Multiply-adds per token of one block."""
    return attention_macs(s, seq) + mlp_macs(s)


def forward_macs(s: Shape, seq: int) -> int:
    """Multiply-adds per token of a full forward with logits."""
    return s.n_layers * block_macs(s, seq) + s.d_model * s.vocab


def compression_local_floor(s: Shape, seq: int, *, mlp_twice: bool = True) -> float:
    """Floor of ``compression_local_cost``: (dense stopped forward + compressed stopped forward
    [+ the MLP again on the dense ``resid_mid``]) / a full dense forward."""
    stopped = s.n_layers * block_macs(s, seq)
    extra = s.n_layers * mlp_macs(s) if mlp_twice else 0
    return (2 * stopped + extra) / forward_macs(s, seq)


def profile_floor(s: Shape, seq: int) -> float:
    """Floor of ``profile_overhead``: the forward stopped after the last block (``profile`` runs no
    unembedding) plus the value split's one matrix product per layer, ``W_O[h] x_t`` for every
    head (``n_heads x d_head x d_model`` per token), against a full forward with logits. Every
    elementwise pass of the statistics comes on top."""
    stopped = s.n_layers * block_macs(s, seq)
    value_split = s.n_layers * s.n_heads * s.dh * s.d_model
    return (stopped + value_split) / forward_macs(s, seq)


def unembedding_share(s: Shape, seq: int) -> float:
    """The unembedding's share of a full forward's multiply-adds."""
    return s.d_model * s.vocab / forward_macs(s, seq)


def _scaling_shapes() -> dict[str, Shape]:
    # the scaling family's published shapes; head width d_model / n_heads, as it builds them
    from benchmarks.scaling import SIZES

    return {name: z.shape for name, z in SIZES.items()}


def main(argv: list[str] | None = None) -> int:
    shapes = _scaling_shapes()
    p = argparse.ArgumentParser(prog="python -m benchmarks.floors", description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--sizes", default=",".join(n for n in shapes if n != "tiny"),
                   help=f"comma-separated, of {', '.join(shapes)}")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.sizes.split(",") if n.strip()]
    unknown = [n for n in names if n not in shapes]
    if unknown or args.seq < 1:
        p.error(f"--sizes: unknown {unknown}; valid: {', '.join(shapes)}" if unknown
                else f"--seq must be >= 1, got {args.seq}")
    print(f"| size (seq {args.seq}) | unembedding share | compression_local_cost floor | without the second MLP "
          "| profile_overhead floor |")
    print("|---|---|---|---|---|")
    for n in names:
        s = shapes[n]
        print(f"| {n} | {unembedding_share(s, args.seq):.3f} | {compression_local_floor(s, args.seq):.3f} | "
              f"{compression_local_floor(s, args.seq, mlp_twice=False):.3f} | {profile_floor(s, args.seq):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
