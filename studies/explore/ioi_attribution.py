"""How well directional attribution patching ranks nodes: its estimate against the real directional
activation patch, on indirect-object (IOI) pairs, per node type and part, with an interval.

    # measure (refuses a dirty tl_directional/ or studies/); CPU single thread
    TL_DIRECTIONAL_CACHE=... python -m studies.explore.ioi_attribution run --model smollm2-135m --pairs 6

Pairs: a clean prompt ("When Mary and John went to the store, John gave a drink to", answer
" Mary") and its corruption with the two names swapped (answer " John"): the same tokens in
another order, so both have the same length. Names and templates are drawn with a fixed seed from
small lists of single-token names; the metric is the clean answer's logit minus the corrupted
answer's, one number per pair.

Nodes and their real patch (METHOD.md sec. 5; reference from the corrupted run):

* ``resid``: ``blocks.L.hook_resid_pre`` at one position (layer x position), patched by
  ``directional_patch(..., components=("resid_pre",), per_position=True)``;
* ``attn`` / ``mlp``: a layer's update at every position at once (per layer), ``directional_patch``;
* ``value``: one head's ``hook_z`` split against its own value vector, every position at once (per
  layer x head), ``directional_patch(..., components=("value",))``;
* ``head``: one head's write ``W_O[h]^T (z_clean - z_corrupt)`` added to the corrupted attention
  update, split against ``hook_resid_pre`` (patched here by a hook: ``directional_patch`` has no
  residual-space head node); its full patch is the value node's full patch.

The estimate of a node patched at every position is the sum of its per-position estimates.
Per pair and node type, Spearman's rank correlation of estimate and real effect over the nodes
(``full``, ``par``, ``perp``); the summary gives the mean over pairs with a seeded percentile
bootstrap interval over pairs (:func:`tl_directional.bootstrap_mean_interval`), and the
correlation of the pair-mean estimate with the pair-mean effect.

Data: ``docs/results/data/ioi_attribution_<model>.{records.csv,summary.csv,manifest.json}``
(``records``: one row per pair and node with the estimate and the real effect of each part).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from studies import common
from studies.claims.data import csv_bytes
from studies.claims.run import run_header
from tl_directional.core.rank import spearman  # noqa: F401  (re-exported: the tests read it here)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = common.ROOT
DATA = ROOT / "docs" / "results" / "data"

PARTS = ("full", "par", "perp")
NODE_TYPES = ("attn", "mlp", "head", "value", "resid")
SEED = 0
N_RESAMPLES = 2000

# each template has one {A} {B} ... {B} pattern; the answer is {A}
TEMPLATES = (
    "When {A} and {B} went to the store, {B} gave a drink to",
    "When {A} and {B} went to the park, {B} handed the ball to",
    "After {A} and {B} had lunch at the cafe, {B} passed the salt to",
    "Then {A} and {B} were working at the office. {B} sent an email to",
)
NAMES = (
    " Mary",
    " John",
    " Sarah",
    " Tom",
    " Anna",
    " James",
    " Emma",
    " David",
    " Lucy",
    " Peter",
    " Alice",
    " Mark",
    " Kate",
    " Paul",
    " Laura",
    " Mike",
)


def make_pairs(model, n: int, seed: int = SEED) -> list[dict]:
    """``n`` seeded pairs: ``clean`` / ``corrupted`` text (names swapped), their answers' token ids."""
    import random

    rng = random.Random(seed)
    names = [nm for nm in NAMES if len(model.tokenizer.encode(nm, add_special_tokens=False)) == 1]
    pairs = []
    for i in range(n):
        t = TEMPLATES[i % len(TEMPLATES)]
        a, b = rng.sample(names, 2)
        pairs.append(
            {
                "pair": i,
                "template": i % len(TEMPLATES),
                "io": a.strip(),
                "s": b.strip(),
                "clean": t.format(A=a.strip(), B=b.strip()).replace("  ", " "),
                "corrupted": t.format(A=b.strip(), B=a.strip()).replace("  ", " "),
                "ids": (model.to_single_token(a), model.to_single_token(b)),
            }
        )
    return pairs


def logit_diff(ids):
    """The metric of a group of pairs: clean answer minus corrupted answer, one number per pair
    (also for stacked copies of the group, which ``directional_patch`` passes one at a time)."""
    import torch

    def metric(logits):
        last = logits[:, -1]
        rows = torch.arange(last.shape[0])
        return last[rows, ids[rows, 0]] - last[rows, ids[rows, 1]]

    return metric


def head_patches(model, sites, clean_tokens, corrupted_tokens, metric, eps: float = 1e-12):
    """Real patch of each head's residual-space write, parallel and perpendicular to
    ``hook_resid_pre`` of the corrupted run: ``{part: [pairs, layer, head]}`` effects (metric
    minus the corrupted metric). One forward per (layer, part) from block ``L`` with every head's
    copy stacked along the batch."""
    import numpy as np
    import torch

    from tl_directional.model.handle import forward_recording_block_input, from_block
    from tl_directional.model.lanes import BlockInput
    from tl_directional.model.weights import attention_output_weights

    names = {f"blocks.{L}.hook_resid_pre" for L in range(sites.n_layers)}
    names |= {sites.value[L].z_hook for L in range(sites.n_layers)}
    with torch.no_grad():
        _, clean = model.run_with_cache(clean_tokens, names_filter=lambda n: n in names)
        _, corr = model.run_with_cache(corrupted_tokens, names_filter=lambda n: n in names)
        am = torch.ones_like(corrupted_tokens)
        logits, block0 = forward_recording_block_input(model, corrupted_tokens, am, 0)
        base = metric(logits).double().numpy()
    b, H = corrupted_tokens.shape[0], sites.n_heads
    out = {p: np.full((b, sites.n_layers, H), np.nan) for p in ("par", "perp")}
    for L in range(sites.n_layers):
        W_O, _ = attention_output_weights(model, L)
        dz = clean[sites.value[L].z_hook] - corr[sites.value[L].z_hook]  # [b, p, h, e]
        write = torch.einsum("bphe,hed->hbpd", dz.double(), W_O.detach().double())
        x = corr[f"blocks.{L}.hook_resid_pre"].double()
        coef = (write * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True).clamp_min(eps)
        par = coef * x
        resid = corr[f"blocks.{L}.hook_resid_pre"].repeat(H, 1, 1)
        tokens = corrupted_tokens.repeat(H, 1)
        for part, delta in (("par", par), ("perp", write - par)):
            add = delta.reshape(H * b, *delta.shape[2:]).to(resid.dtype)

            def hook(t, hook, add=add):  # noqa: ARG001 - TL hook signature
                return t + add

            update = sites.units["attn"][L].update_hook
            with (
                torch.no_grad(),
                from_block(model, BlockInput(L, resid, block0.output_form)) as run,
                model.hooks(fwd_hooks=[(update, hook)]),
            ):
                logits = run(tokens, am.repeat(H, 1))
            for h in range(H):
                out[part][:, L, h] = metric(logits[h * b : (h + 1) * b]).double().numpy() - base
            del logits
    return out


def measure_group(model, sites, group: list[dict]):
    """Estimate and real effect of every node for one group of equal-length pairs: a DataFrame,
    one row per pair and node."""
    import numpy as np
    import pandas as pd
    import torch

    import tl_directional as tld

    clean = model.to_tokens([p["clean"] for p in group])
    corr = model.to_tokens([p["corrupted"] for p in group])
    if clean.shape != corr.shape:
        raise SystemExit(f"pair lengths differ: {clean.shape} vs {corr.shape}")
    metric = logit_diff(torch.tensor([p["ids"] for p in group]))
    est = tld.attribution_patch(model, clean, corr, metric)
    layer_patch = tld.directional_patch(
        model, clean, corr, metric, components=("attn", "mlp", "value"), result=True
    )
    resid_patch = tld.directional_patch(
        model, clean, corr, metric, components=("resid_pre",), per_position=True, result=True
    )
    heads = head_patches(model, sites, clean, corr, metric)
    heads["full"] = layer_patch.values["value"]["full"]
    rows = []
    for i, p in enumerate(group):
        for node in NODE_TYPES:
            e = {w: est.values[node][w][i] for w in PARTS}
            if node == "resid":
                r = {w: resid_patch.values["resid_pre"][w][i] for w in PARTS}
            elif node == "head":
                r = {w: heads[w][i] for w in PARTS}
            else:
                r = {w: layer_patch.values[node][w][i] for w in PARTS}
                e = {w: v.sum(axis=1) for w, v in e.items()}  # every position at once
            if node == "head":
                e = {w: v.sum(axis=1) for w, v in e.items()}
            for idx in np.ndindex(*r["full"].shape):
                row = {
                    "pair": p["pair"],
                    "template": p["template"],
                    "node_type": node,
                    "layer": idx[0],
                    "pos": idx[1] if node == "resid" else -1,
                    "head": idx[1] if node in ("head", "value") else -1,
                }
                row.update({f"est_{w}": float(e[w][idx]) for w in PARTS})
                row.update({f"patch_{w}": float(r[w][idx]) for w in PARTS})
                rows.append(row)
    base = pd.DataFrame(
        {
            "pair": [p["pair"] for p in group],
            "clean_metric": layer_patch.clean_metric,
            "corrupted_metric": layer_patch.corrupted_metric,
        }
    )
    return pd.DataFrame(rows), base


def summarise(rec):
    """Per node type and part: the mean over pairs of the per-pair Spearman correlation with its
    bootstrap interval, and the correlation of the pair means."""
    import numpy as np
    import pandas as pd

    from tl_directional import bootstrap_mean_interval

    out = []
    for node in NODE_TYPES:
        sub = rec[rec.node_type == node]
        keys = ["layer", "pos", "head"]
        means = sub.groupby(keys)[[f"{k}_{w}" for k in ("est", "patch") for w in PARTS]].mean()
        for w in PARTS:
            per_pair = np.array(
                [spearman(g[f"est_{w}"], g[f"patch_{w}"]) for _, g in sub.groupby("pair")]
            )
            lo, hi = bootstrap_mean_interval(per_pair[:, None], n_resamples=N_RESAMPLES, seed=SEED)
            out.append(
                {
                    "node_type": node,
                    "part": w,
                    "nodes": int(len(means)),
                    "pairs": int(len(per_pair)),
                    "spearman_mean": float(np.nanmean(per_pair)),
                    "low": float(lo[0]),
                    "high": float(hi[0]),
                    "spearman_of_pair_means": spearman(means[f"est_{w}"], means[f"patch_{w}"]),
                }
            )
    return pd.DataFrame(out)


def run(args) -> int:
    import pandas as pd
    import torch

    from tl_directional.model.load import load_model
    from tl_directional.model.sites import resolve_sites

    commit, dirty = common.git_state()
    if (refused := common.refuse_dirty(dirty, args.allow_dirty)) is not None:
        return refused
    torch.set_num_threads(args.threads)
    t0, c0 = time.time(), time.process_time()
    model = load_model(args.model).eval()
    sites = resolve_sites(model, warn=False)
    pairs = make_pairs(model, args.pairs)
    groups: dict[int, list[dict]] = {}
    for p in pairs:
        groups.setdefault(len(model.to_tokens(p["clean"])[0]), []).append(p)
    recs, bases = [], []
    for n_pos, group in sorted(groups.items()):
        r, b = measure_group(model, sites, group)
        recs.append(r)
        bases.append(b)
        print(
            f"{len(group)} pairs of {n_pos} tokens done ({time.process_time() - c0:.0f} s CPU)",
            flush=True,
        )
    rec = pd.concat(recs, ignore_index=True).sort_values(
        ["pair", "node_type", "layer", "pos", "head"]
    )
    base = pd.concat(bases, ignore_index=True).sort_values("pair")
    summary = summarise(rec)
    manifest = run_header("ioi_attribution", args, sites, commit, dirty)
    manifest.update(
        {
            "pairs": [
                {k: p[k] for k in ("pair", "template", "io", "s", "clean", "corrupted")}
                for p in pairs
            ],
            "templates": list(TEMPLATES),
            "metric": "logit(clean answer) - logit(corrupted answer) at the last position, per pair",
            "clean_metric": base.clean_metric.round(6).tolist(),
            "corrupted_metric": base.corrupted_metric.round(6).tolist(),
            "seed": SEED,
            "bootstrap_resamples": N_RESAMPLES,
            "seconds": round(time.time() - t0, 1),
            "cpu_seconds": round(time.process_time() - c0, 1),
            "complete": True,
            "files": {},
        }
    )
    stem = f"ioi_attribution_{args.model}"
    common.write_data(
        DATA,
        {f"{stem}.records.csv": csv_bytes(rec), f"{stem}.summary.csv": csv_bytes(summary)},
        manifest,
        f"{stem}.manifest.json",
    )
    with pd.option_context("display.width", 160, "display.precision", 3):
        print(summary.to_string(index=False))
    print(
        f"wrote {DATA / stem}.* ({len(rec)} records); {manifest['cpu_seconds']} s CPU, {manifest['seconds']} s wall"
    )
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "gemma-3-270m"))
    r.add_argument("--pairs", type=int, default=6)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--allow-dirty", action="store_true", help="for smoke runs only")
    args = ap.parse_args(argv)
    if args.pairs < 2:
        print("error: --pairs must be >= 2 (the interval resamples pairs)", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    common.run_main(main)
