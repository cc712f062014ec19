"""Claim D (the seed's claim 1): pretrained updates carry large parallel components, measured
against an anisotropy control. Committed data and pages built from it alone.

    # measure: per (text, window, layer, component) sums of abs cos(u_t, r_t) (the paper's
    # E|cos| depth profile) and of the control abs cos(u_t, r'_t), r' the same layer's
    # reference of another window at the same position; refuses a dirty tl_directional/ or scripts/
    python scripts/depth_claims.py run --model smollm2-135m --windows 32 --batch-size 8

    # pages: built by `python scripts/claims.py build` (make results) with the claims pages

Protocol: ``docs/results/protocol.md`` sec. 7 (written before these runs). Data files
``docs/results/data/depth_<model>.{records.csv,manifest.json}``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

try:
    import _common  # scripts/ is sys.path[0] when a script runs
except ImportError:  # loaded by file path (the tests): through the package
    from scripts import _common

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = _common.ROOT

import claims as C  # noqa: E402  (the claims study's data layout, hashing and bootstrap)
from tl_directional.core.paired import holm  # noqa: E402

COMPONENTS = ("attn", "mlp")


def run(args) -> int:
    import pandas as pd
    import torch

    from tl_directional.model.inputs import load_text_sequences
    from tl_directional.model.load import load_model
    from tl_directional.model.sites import resolve_sites

    commit, dirty = _common.git_state()
    if (refused := _common.refuse_dirty(dirty, args.allow_dirty)) is not None:
        return refused
    if args.batch_size < 2:
        print("error: --batch-size must be >= 2 (the control pairs windows of one batch)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(args.model)
    sites = resolve_sites(model, warn=False)
    units = [u for c in COMPONENTS for u in sites.units.get(c, [])]
    names = {u.update_hook for u in units} | {u.reference_hook for u in units}
    stem = f"depth_{args.model}"
    manifest = C.run_header("depth", "depth_claims.py", args, sites, commit, dirty)
    manifest.update({
        "windows": args.windows,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "texts": {},
        "complete": False,
        "files": {},
    })
    records = []
    for text in args.texts:
        desc, rel = C.TEXTS[text]
        path = ROOT / rel
        batch = load_text_sequences(model, str(path), max_sequences=args.windows, seq_len=args.seq_len)
        if len(batch) < args.windows or args.windows % args.batch_size:
            print(f"error: text {text} gives {len(batch)} windows; --windows must be a multiple of "
                  f"--batch-size and available", file=sys.stderr)
            return 2
        t1 = time.time()
        for i in range(0, len(batch), args.batch_size):
            part = batch.slice(i, i + args.batch_size)
            _, cache = model.run_with_cache(part.tokens, attention_mask=part.attention_mask,
                                            names_filter=lambda n: n in names)
            mask = part.attention_mask.bool().clone()
            mask[:, 0] = False  # BOS excluded: the attention sink's stream is another object
            # the control pairs window w with window w + 1 of the batch at the same position
            both = mask & mask.roll(-1, 0)
            for u in units:
                upd = cache[u.update_hook].double()
                ref = cache[u.reference_hook].double()
                if u.update_is_difference:
                    upd = upd - ref
                un, rn = upd.norm(dim=-1), ref.norm(dim=-1)
                ok = (un > 0) & (rn > 0)
                cos = (upd * ref).sum(-1) / (un * rn).clamp_min(1e-300)
                ref_c = ref.roll(-1, 0)
                cos_c = (upd * ref_c).sum(-1) / (un * ref_c.norm(dim=-1)).clamp_min(1e-300)
                m = mask & ok
                mc = both & ok & (ref_c.norm(dim=-1) > 0)
                for j in range(part.tokens.shape[0]):
                    records.append({
                        "text": text, "window": i + j, "layer": u.layer, "component": u.component,
                        "tokens": int(m[j].sum()),
                        "abs_cos": float(cos[j][m[j]].abs().sum()),
                        "control_tokens": int(mc[j].sum()),
                        "abs_cos_control": float(cos_c[j][mc[j]].abs().sum()),
                        "cos": float(cos[j][m[j]].sum()),
                    })
            del cache
            print(f"{text}: windows {i}-{i + part.tokens.shape[0] - 1} done ({time.time() - t1:.0f} s)", flush=True)
        manifest["texts"][text] = {"description": desc, "file": rel, "sha256": C.sha256_bytes(path.read_bytes()),
                                   "windows": len(batch), "seconds": round(time.time() - t1, 1)}
    manifest["seconds"] = round(time.time() - t0, 1)
    manifest["complete"] = True
    _write(stem, pd.DataFrame(records), manifest)
    return 0


def _write(stem, rec, manifest):
    _common.write_data(C.DATA, {f"{stem}.records.csv": C._csv(rec)}, manifest, f"{stem}.manifest.json")
    print(f"wrote {C.DATA / stem}.* ({len(rec)} records)", flush=True)


# ---------------------------------------------------------------------------
# build (pure function of the data)
# ---------------------------------------------------------------------------


def load(stem: str, data: Path | None = None):
    """``(manifest, records)`` of ``docs/results/data/<stem>.*`` (or ``data``), checked like the
    claims data."""
    import pandas as pd

    data = C.DATA if data is None else data
    mpath = data / f"{stem}.manifest.json"
    manifest = _common.read_data_manifest(mpath, str(mpath.relative_to(data.parent.parent.parent)), C.DataError)
    name = f"{stem}.records.csv"
    p = data / name
    if not p.is_file():
        raise C.DataError(f"{p.relative_to(data.parent.parent.parent)}: missing (named by {mpath.name}); restore it from git")
    b = p.read_bytes()
    if C.sha256_bytes(b) != manifest.get("files", {}).get(name):
        raise C.DataError(f"{p.relative_to(data.parent.parent.parent)}: sha256 {C.sha256_bytes(b)[:12]} does not match the manifest; "
                          "the file is corrupt or was edited; restore it from git or rerun")
    from tl_directional.model.load.catalog import REAL_MODELS

    m = manifest["model"]
    if m["name"] in REAL_MODELS and REAL_MODELS[m["name"]].source_sha256 != m["source_sha256"]:
        raise C.DataError(f"{mpath.relative_to(data.parent.parent.parent)}: model source sha256 {m['source_sha256'][:12]} is not the "
                          f"catalogue's {m['name']}: data from another model")
    if "+dirty" in manifest["commit"]:
        raise C.DataError(f"{mpath.relative_to(data.parent.parent.parent)}: made from a dirty tree ({manifest['commit']}); rerun")
    import io

    return manifest, pd.read_csv(io.BytesIO(b))


def random_level(d: int) -> float:
    """E abs cos of two independent uniform directions in ``d`` dimensions (exact)."""
    return math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi)


def _per_layer(rec, weights, comp):
    """``{layer: {"m": [B+1], "c": [B+1], "x": [B+1]}}`` pooled over texts (token-weighted)."""
    out = {}
    for layer, g in rec[rec.component == comp].groupby("layer"):
        tok = s = tc = sc = 0.0
        per_text = {}
        for text, w in weights.items():
            gt = g[g.text == text].sort_values("window")
            a = gt[["tokens", "abs_cos", "control_tokens", "abs_cos_control"]].to_numpy(dtype=float)
            v = w @ a
            tok, s, tc, sc = tok + v[:, 0], s + v[:, 1], tc + v[:, 2], sc + v[:, 3]
            per_text[text] = float(a[:, 1].sum() / a[:, 0].sum())
        m, c = s / tok, sc / tc
        out[int(layer)] = {"m": m, "c": c, "x": m - c, "texts": per_text}
    return out


def build_page(stem: str, data: Path | None = None) -> str:
    import numpy as np

    manifest, rec = load(stem, data)
    weights = C._boot(rec)
    texts = list(weights)
    m = manifest["model"]
    level = random_level(int(m["d_model"]))
    tokens = {t: int(rec[(rec.text == t) & (rec.component == "attn") & (rec.layer == 0)].tokens.sum()) for t in texts}
    L = [
        f"# Claim D on {m['name']}: depth profile of abs cos(u, r) with an anisotropy control",
        "",
        "Built by `python scripts/claims.py build` from the committed data "
        f"`docs/results/data/{stem}.*` alone (protocol: [protocol.md](protocol.md), sec. 7); do not edit by hand.",
        "",
        f"- Data made by `{manifest['command']}` at commit `{manifest['commit']}`, {manifest['date']}, "
        f"{manifest['machine']}, {manifest['seconds']:.0f} s.",
        f"- Model: `{m['name']}` ({m['architecture']}, {m['n_layers']} layers, d_model {m['d_model']}"
        f"{', sandwich norms: the attention / MLP update is the post-norm output' if m['sandwich_norm'] else ''}), "
        f"**dequantised** from `{m['source_file']}` ({m['quantisation']}, sha256 `{m['source_sha256'][:16]}...`), "
        f"unprocessed weights, {m['lane']} lane.",
        "- Texts: " + "; ".join(
            f"`{t}` ({manifest['texts'][t]['description']}, sha256 `{manifest['texts'][t]['sha256'][:12]}`): "
            f"{manifest['texts'][t]['windows']} windows of {manifest['seq_len']} tokens, {tokens[t]} tokens per unit"
            for t in texts) + ".",
        f"- `E|cos|` is the mean over tokens (BOS excluded) of abs cos(u_t, r_t), u the attention or MLP update "
        "and r the stream it is added to (METHOD sec. 1-2), pooled over texts. The **control** is abs cos(u_t, r'_t) "
        f"with r' the same layer's stream of another window (the next in its batch of {manifest['batch_size']}) at "
        "the same position: what a stream direction shared by all tokens (anisotropy) gives without any "
        "token-specific alignment. `excess` = E|cos| - control. Random-direction level "
        f"E|cos| for independent directions in d = {m['d_model']}: {level:.4f}.",
        f"- Intervals: 95% percentile bootstrap over windows, stratified by text ({C.B} resamples, seed {C.SEED}), "
        "the same resamples for every layer.",
        "",
        "## Verdicts (rules in [protocol.md](protocol.md), sec. 7)",
        "",
        "| id | claim | statistic [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    tables = {}
    for comp, cid in (("attn", "D1"), ("mlp", "D2")):
        per = _per_layer(rec, weights, comp)
        tables[comp] = per
        mean_x = np.mean([v["x"] for v in per.values()], axis=0)
        v, lo, hi = C._ci(mean_x)
        verdict = "**held**" if lo > level else ("**failed**" if hi < level else "not decided")
        pvals = {str(k): float(np.mean(d["x"][1:] <= 0)) for k, d in per.items()}
        passed = holm(pvals)
        L.append(
            f"| {cid} | {comp} updates are aligned with their own token's stream beyond anisotropy: mean over "
            f"layers of the excess above the random-direction level {level:.3f} | {v:+.3f} [{lo:+.3f}, {hi:+.3f}]; "
            f"layers with excess > 0 (Holm, one-sided, alpha 0.05): {len(passed)} of {len(per)} | {verdict} |"
        )
    for comp, cid in (("attn", "D1"), ("mlp", "D2")):
        per = tables[comp]
        mean_x = np.mean([v["x"] for v in per.values()], axis=0)
        mean_m = np.mean([v["m"] for v in per.values()], axis=0)
        L.append(
            f"| {cid}a (amended reading, sec. 9.5) | {comp} updates carry any own-token alignment beyond "
            f"anisotropy: mean over layers of the excess above 0 | {C._fmt(mean_x)} | {C._verdict_sign(mean_x)} |"
        )
        L.append(
            f"| {cid}l (amended reading, sec. 9.5) | the seed's literal claim: {comp} E abs cos above the "
            f"random-direction level {level:.3f}, mean over layers | {C._fmt(mean_m, '.3f')} | "
            f"{C._verdict_threshold(mean_m, level)} |"
        )
    L += [
        "",
        "Anisotropy share (amended reading, sec. 9.5: the finding reported first), mean over layers of "
        "control / E abs cos [95% CI]: "
        + "; ".join(
            f"{comp} {C._fmt(np.mean([d['c'] / d['m'] for d in tables[comp].values()], axis=0), '.2f')}"
            for comp in COMPONENTS
        )
        + ". That share of the paper's depth statistic comes back with another window's stream at the same "
        "position: it is a property of the stream's shared directions, not of the token's own update.",
    ]
    L += [
        "",
        "Mean over layers, pooled over texts: "
        + "; ".join(
            f"{comp} E|cos| {C._fmt(np.mean([d['m'] for d in tables[comp].values()], axis=0), '.3f')}, "
            f"control {C._fmt(np.mean([d['c'] for d in tables[comp].values()], axis=0), '.3f')}"
            for comp in COMPONENTS
        )
        + ". The control is the share of E|cos| that any token's stream would give.",
    ]
    for comp in COMPONENTS:
        per = tables[comp]
        L += [
            "",
            f"## {comp}: per layer",
            "",
            "| layer | E abs cos [95% CI] | control [95% CI] | excess [95% CI] | control / E abs cos | "
            + " | ".join(f"`{t}`" for t in texts) + " |",
            "|---:|---|---|---|---:|" + "---:|" * len(texts),
        ]
        for layer, d in sorted(per.items()):
            L.append(
                f"| {layer} | {C._fmt(d['m'], '.3f')} | {C._fmt(d['c'], '.3f')} | {C._fmt(d['x'])} | "
                f"{float(d['c'][0] / d['m'][0]):.2f} | " + " | ".join(f"{d['texts'][t]:.3f}" for t in texts) + " |"
            )
    L += [
        "",
        "Signed mean cos(u, r) per layer (the sign says whether the parallel part adds to or erases the stream):",
        "",
        "| layer | " + " | ".join(COMPONENTS) + " |",
        "|---:|" + "---:|" * len(COMPONENTS),
    ]
    signed = rec.groupby(["component", "layer"])[["cos", "tokens"]].sum()
    for layer in sorted(rec.layer.unique()):
        L.append(f"| {layer} | " + " | ".join(
            f"{signed.loc[(c, layer), 'cos'] / signed.loc[(c, layer), 'tokens']:+.3f}" for c in COMPONENTS) + " |")
    return "\n".join(L)


def verdict_rows(stem: str, data: Path | None = None) -> list[tuple[str, str, str]]:
    """``(claim, statistic, verdict)`` rows of the page, for the summary table of docs/results.md."""
    page = build_page(stem, data)
    rows = []
    for ln in page.split("\n## Verdicts", 1)[1].split("\n\n", 2)[1].splitlines()[2:]:
        if ln.startswith("|"):
            cells = [c.strip() for c in ln.strip("|").split(" | ")]
            rows.append((f"{cells[0]}: {cells[1]}", cells[2], cells[3]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, choices=sorted(C.SOURCES))
    r.add_argument("--texts", nargs="+", default=list(C.TEXTS), choices=list(C.TEXTS))
    r.add_argument("--windows", type=int, default=32)
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--allow-dirty", action="store_true", help="for smoke runs only: the builder refuses such data")
    args = ap.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    _common.run_main(main)
