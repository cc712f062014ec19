"""Component-weighted Wanda on the bundled default model: the fraction of pruned weights each
weighting flips against standard Wanda, the total-vs-perpendicular ranking overlap beside its
isotropic null, and the held-out loss of each pruned model.

    PYTHONPATH=$PWD python -m studies.explore.weighted_wanda_flips [--sparsity 0.5] [--calib 64] [--eval 64]

Calibration: the first ``--calib`` verses of the bundled held-out KJV slice longer than 40
characters; evaluation: the next ``--eval`` ones (disjoint). Deterministic (seed 0 for the null).
"""

from __future__ import annotations

import argparse

import torch

import tl_directional as tld
from tl_directional.compression import collect_error_energy
from tl_directional.io.corpus import heldout_text
from tl_directional.model.load import load_model


def mean_loss(model, texts) -> float:
    batch = tld.prepare_inputs(model, texts)
    with torch.no_grad():
        logits = model(batch.tokens, attention_mask=batch.attention_mask)
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    nll = -logp.gather(-1, batch.tokens[:, 1:, None]).squeeze(-1)
    m = batch.attention_mask[:, 1:].bool() & batch.attention_mask[:, :-1].bool()
    return float(nll[m].mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--eval", type=int, default=64)
    ap.add_argument("--n-null", type=int, default=8)
    args = ap.parse_args()
    model = load_model("default")
    lines = [line for line in heldout_text().splitlines() if len(line) > 40]
    calib, held = lines[:args.calib], lines[args.calib:args.calib + args.eval]
    energy = collect_error_energy(model, calib, n_null=args.n_null, seed=0)
    print(f"default model, sparsity {args.sparsity:g}, {energy.n_tokens} calibration tokens, "
          f"held-out loss over {len(held)} verses; dense loss {mean_loss(model, held):.4f}")
    for weighting in tld.compression.WEIGHTINGS:
        res = tld.prune_wanda_weighted(model, sparsity=args.sparsity, weighting=weighting, energy=energy)
        st = res.record.stats
        print(f"  {weighting:>4}: flipped {st['flipped_vs_wanda']:.6%} of pruned weights "
              f"({int(st['flipped_weights'])} / {int(st['pruned_weights'])}), held-out loss "
              f"{mean_loss(res.model, held):.4f}")
    table = tld.ranking_overlap(model, sparsity=args.sparsity, n_null=args.n_null, energy=energy)
    row = table.iloc[-1]
    print(f"  ranking overlap (total vs perp pruned sets, all linears): {row['overlap']:.6f}; isotropic "
          f"norm-matched null {row['null_mean']:.6f} +- {row['null_sd']:.6f} "
          f"[{row['null_min']:.6f}, {row['null_max']:.6f}] over {int(row['n_null'])} draws; "
          f"linears inside the null: {int(table.iloc[:-1]['inside_null'].sum())} / {len(table) - 1}")


if __name__ == "__main__":
    main()
