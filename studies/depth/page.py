"""Claim D (the seed's claim 1): pretrained updates carry large parallel components, measured
against an anisotropy control. The page ``docs/results/depth_<model>.md`` (protocol sec. 7), a
pure function of the committed ``docs/results/data/depth_<model>.*``.
"""

from __future__ import annotations

import math
from pathlib import Path

from studies import common
from studies.claims import data as D
from studies.claims import stats as S
from studies.depth.run import COMPONENTS
from tl_directional.core.paired import holm


def load(stem: str, data: Path | None = None):
    """``(manifest, records)`` of ``docs/results/data/<stem>.*`` (or ``data``), checked like the
    claims data."""
    import pandas as pd

    data = D.DATA if data is None else data
    mpath = data / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, str(mpath.relative_to(data.parent.parent.parent)), D.DataError)
    name = f"{stem}.records.csv"
    p = data / name
    if not p.is_file():
        raise D.DataError(f"{p.relative_to(data.parent.parent.parent)}: missing (named by {mpath.name}); restore it from git")
    b = p.read_bytes()
    if common.sha256_bytes(b) != manifest.get("files", {}).get(name):
        raise D.DataError(f"{p.relative_to(data.parent.parent.parent)}: sha256 {common.sha256_bytes(b)[:12]} does not match the manifest; "
                          "the file is corrupt or was edited; restore it from git or rerun")
    from tl_directional.model.load.catalog import REAL_MODELS

    m = manifest["model"]
    if m["name"] in REAL_MODELS and REAL_MODELS[m["name"]].source_sha256 != m["source_sha256"]:
        raise D.DataError(f"{mpath.relative_to(data.parent.parent.parent)}: model source sha256 {m['source_sha256'][:12]} is not the "
                          f"catalogue's {m['name']}: data from another model")
    if "+dirty" in manifest["commit"]:
        raise D.DataError(f"{mpath.relative_to(data.parent.parent.parent)}: made from a dirty tree ({manifest['commit']}); rerun")
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


def _verdict_lines(rec, weights, level: float) -> tuple[list[str], dict]:
    """The verdict rows of claims D1 / D2 and their amended readings, and the per-layer
    bootstrap tables ``{component: {layer: ...}}`` they are read from."""
    import numpy as np

    L: list[str] = []
    tables = {}
    for comp, cid in (("attn", "D1"), ("mlp", "D2")):
        per = _per_layer(rec, weights, comp)
        tables[comp] = per
        mean_x = np.mean([v["x"] for v in per.values()], axis=0)
        v, lo, hi = S.interval(mean_x)
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
            f"anisotropy: mean over layers of the excess above 0 | {S.fmt_interval(mean_x)} | {S.verdict_sign(mean_x)} |"
        )
        L.append(
            f"| {cid}l (amended reading, sec. 9.5) | the seed's literal claim: {comp} E abs cos above the "
            f"random-direction level {level:.3f}, mean over layers | {S.fmt_interval(mean_m, '.3f')} | "
            f"{S.verdict_threshold(mean_m, level)} |"
        )
    return L, tables


def _layer_lines(tables: dict, rec, texts) -> list[str]:
    """Per component, the per-layer table; then the signed mean cos(u, r) per layer."""
    L: list[str] = []
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
                f"| {layer} | {S.fmt_interval(d['m'], '.3f')} | {S.fmt_interval(d['c'], '.3f')} | {S.fmt_interval(d['x'])} | "
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
    return L


def build_page(stem: str, data: Path | None = None) -> str:
    """The depth page of run ``stem`` (protocol sec. 7), from its committed data alone."""
    import numpy as np

    manifest, rec = load(stem, data)
    weights = S.window_bootstrap(rec)
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
        f"- Intervals: 95% percentile bootstrap over windows, stratified by text ({S.B} resamples, seed {S.SEED}), "
        "the same resamples for every layer.",
        "",
        "## Verdicts (rules in [protocol.md](protocol.md), sec. 7)",
        "",
        "| id | claim | statistic [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    rows, tables = _verdict_lines(rec, weights, level)
    L += rows
    L += [
        "",
        "Anisotropy share (amended reading, sec. 9.5: the finding reported first), mean over layers of "
        "control / E abs cos [95% CI]: "
        + "; ".join(
            f"{comp} {S.fmt_interval(np.mean([d['c'] / d['m'] for d in tables[comp].values()], axis=0), '.2f')}"
            for comp in COMPONENTS
        )
        + ". That share of the paper's depth statistic comes back with another window's stream at the same "
        "position: it is a property of the stream's shared directions, not of the token's own update.",
    ]
    L += [
        "",
        "Mean over layers, pooled over texts: "
        + "; ".join(
            f"{comp} E|cos| {S.fmt_interval(np.mean([d['m'] for d in tables[comp].values()], axis=0), '.3f')}, "
            f"control {S.fmt_interval(np.mean([d['c'] for d in tables[comp].values()], axis=0), '.3f')}"
            for comp in COMPONENTS
        )
        + ". The control is the share of E|cos| that any token's stream would give.",
    ]
    L += _layer_lines(tables, rec, texts)
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
