"""Protocol sec. 11: the revision's other instruments (MLP carrier edits, component-weighted
Wanda, random per-layer value-space scales), their verdicts and pages, built from committed data
alone (``docs/results/data/instruments_<model>.*``; measured by :mod:`instruments_run`).

    python -m studies run claims --model smollm2-135m --settings instruments --windows 24 --batch-size 8
    python -m studies build        # writes docs/results/instruments_<model>.md (make results)

The statistics are the claims study's (secs. 1-2): ``delta`` in nats per predicted token, pooled
over the texts, 95% percentile bootstrap over windows stratified by text, the same resamples for
every setting, worst members taken inside each resample.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from studies import common
from studies.claims import stats as S  # the bootstrap, intervals and verdict rules of secs. 2-3
from studies.paper import APPENDIX, cite

#: the revision's numbers (Shwai-He/Transformer-Geometry, _overleaf_/ARR_May_Revision_Overleaf/
#: sections/appendix.tex at 739519c), quoted on the page beside ours, never used as evidence
PAPER_CARRIER = {  # Table tab:mlp-internal-carrier, Qwen3-0.6B, C4 loss change: (No-Para, No-Perp)
    "resid-mlp": (0.1165, 15.9567),
    "carrier-input": (0.0301, 13.4184),
    "carrier-block": (0.0037, 13.3324),
}
PAPER_WANDA = (
    "perpendicular weighting changes the eight-task average by -0.24 to +0.38 points against "
    "standard Wanda on six models; it flips 0.0098% / 0.0081% of pruned weights on Qwen3-1.7B / 4B, "
    "parallel weighting 8.81% / 9.68%, and underperforms the perpendicular weighting by 0.35 to 2.79 "
    "points on five models"
)
PAPER_RANKING = (
    "overlap of the largest 1% / 10% entries ranked by total and by perpendicular error: observed "
    "99.40% / 99.86%, norm-matched isotropic direction 99.94% / 99.95% (it matches or exceeds the "
    "observed overlap in 22/23 and 21/23 groups)"
)
PAPER_RANDOM = (
    "accuracy changes in points: bounded Gaussian, eight-task mean, Qwen3-4B -0.4, Qwen3-8B +0.0; "
    "RULER 4k, all positions: uniform -0.93 (Qwen3-4B) to -6.23 (Qwen3-0.6B), Llama-3.2-3B -1.59; "
    "Gaussian -0.20 (Qwen3-4B / 8B) to -1.64 (Qwen3-0.6B), Llama-3.2-3B -0.68"
)
CARRIER = (
    "resid-mlp s_par=0",
    "carrier-input s_par=0",
    "carrier-block s_par=0",
    "carrier-input s_perp=0",
    "carrier-block s_perp=0",
)
WANDA = ("wanda", "wanda-perp", "wanda-par")
SEEDS = (0, 1, 2)
FIXED = "fixed s_par=0.5"
#: settings that repeat another study's, ``{label: (stem prefix, that study's label)}``
REPEATS = {
    "resid-mlp s_par=0": ("claims", "resid-mlp s_par=0"),
    FIXED: ("amend", "value-exclusive-joint skip0 s_par=0.5"),
}


class InstrumentsDataError(RuntimeError):
    """A committed instruments data file is missing, corrupt, dirty or from another model."""


def load(stem: str, data: Path):
    """``(manifest, {kind: DataFrame})`` of ``data/<stem>.*``, every file checked against the
    manifest's sha256; dirty-tree data and data from another model than the catalogue's are refused."""
    import pandas as pd

    mpath = data / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, mpath.name, InstrumentsDataError)
    frames = {}
    for name, want in manifest.get("files", {}).items():
        b = common.checked_bytes(data / name, want, name, mpath.name, InstrumentsDataError)
        frames[name.split(".")[-2]] = pd.read_csv(io.BytesIO(b))
    if "+dirty" in manifest["commit"] or any(
        "+dirty" in t.get("commit", "") for t in manifest["texts"].values()
    ):
        raise InstrumentsDataError(
            f"{mpath.name}: made from a dirty tree ({manifest['commit']}); rerun from a clean one"
        )
    m = manifest["model"]
    from tl_directional.model.load.catalog import REAL_MODELS

    if m["name"] in REAL_MODELS and REAL_MODELS[m["name"]].source_sha256 != m["source_sha256"]:
        raise InstrumentsDataError(
            f"{mpath.name}: model source sha256 {str(m['source_sha256'])[:12]} is not the "
            f"catalogue's {m['name']}: data from another model"
        )
    for kind in ("records", "profile", "ranking"):
        if kind not in frames:
            raise InstrumentsDataError(f"{mpath.name}: names no {stem}.{kind}.csv; rerun the study")
    return manifest, frames


def statistics(rec):
    """``{setting: {"pooled": [B + 1], text: [B + 1], ...}}`` (:func:`claims_stats._stats`)."""
    return S.setting_stats(rec, S.window_bootstrap(rec))


def verdicts(st) -> list[tuple[str, str, str, str]]:
    """Sec. 11's verdict rows ``(id, claim, statistic [95% CI], verdict)``; a claim whose
    settings are not all measured is not decided."""
    import numpy as np

    def d(label):
        return st[label]["pooled"]

    def missing(*labels):
        return [lab for lab in labels if lab not in st]

    rows = []

    def add(cid, claim, labels, stat_fn, name, rule):
        if gone := missing(*labels):
            rows.append((cid, claim, f"settings missing: {', '.join(gone)}", "**not decided**"))
            return
        stat = stat_fn()
        rows.append((cid, claim, f"{name} = {S.fmt_interval(stat)}", rule(stat)))

    def upper(x):
        return S.verdict_upper(x, S.BUDGET)

    def below0(x):
        return S.verdict_sign(x, held_if_positive=False)

    add(
        "M1",
        "parallel removal at the carrier input site costs less than residual MLP parallel removal",
        ("resid-mlp s_par=0", "carrier-input s_par=0"),
        lambda: d("resid-mlp s_par=0") - d("carrier-input s_par=0"),
        "delta(resid-mlp) - delta(carrier-input)",
        S.verdict_sign,
    )
    add(
        "M2",
        "... and at the carrier block site",
        ("resid-mlp s_par=0", "carrier-block s_par=0"),
        lambda: d("resid-mlp s_par=0") - d("carrier-block s_par=0"),
        "delta(resid-mlp) - delta(carrier-block)",
        S.verdict_sign,
    )
    add(
        "M3",
        f"carrier parallel removal changes loss by at most {S.BUDGET} nats/token at both sites",
        ("carrier-input s_par=0", "carrier-block s_par=0"),
        lambda: np.maximum(np.abs(d("carrier-input s_par=0")), np.abs(d("carrier-block s_par=0"))),
        "max over the sites of abs(delta)",
        upper,
    )
    add(
        "W1",
        f"perpendicular weighting preserves Wanda's quality (within {S.BUDGET} nats/token)",
        ("wanda", "wanda-perp"),
        lambda: np.abs(d("wanda-perp") - d("wanda")),
        "abs(delta(wanda-perp) - delta(wanda))",
        upper,
    )
    add(
        "W2",
        "parallel weighting damages more than perpendicular weighting",
        ("wanda-perp", "wanda-par"),
        lambda: d("wanda-par") - d("wanda-perp"),
        "delta(wanda-par) - delta(wanda-perp)",
        S.verdict_sign,
    )
    for dist, tag in (("uniform", "u"), ("gaussian", "g")):
        draws = [f"{dist} seed={s}" for s in SEEDS]
        add(
            f"R1{tag}",
            f"random {dist} per-layer scales change loss by at most {S.BUDGET} nats/token (every draw)",
            draws,
            lambda draws=draws: np.max([np.abs(d(x)) for x in draws], axis=0),
            "max over seeds of abs(delta)",
            upper,
        )
        add(
            f"R2{tag}",
            f"random {dist} per-layer scales cost no more than fixed s_par = 0.5 (every draw)",
            (*draws, FIXED),
            lambda draws=draws: np.max([d(x) - d(FIXED) for x in draws], axis=0),
            "max over seeds of (delta(draw) - delta(fixed 0.5))",
            below0,
        )
    return rows


def verdict_rows(stem: str, data: Path) -> list[tuple[str, str, str]]:
    """``(claim, statistic, verdict)`` rows for the summary table of docs/results.md."""
    _, frames = load(stem, data)
    return [
        (f"{cid}: {claim}", stat, v)
        for cid, claim, stat, v in verdicts(statistics(frames["records"]))
    ]


def _table(st, labels, texts, paper=None) -> list[str]:
    head = (
        "| setting | delta pooled [95% CI] | "
        + " | ".join(f"delta `{t}`" for t in texts)
        + " | KL | top-1 agree |"
        + (" paper |" if paper else "")
    )
    L = [head, "|---|---|" + "---:|" * len(texts) + "---:|---:|" + ("---:|" if paper else "")]
    for lab in labels:
        if lab not in st:
            continue
        x = st[lab]
        L.append(
            f"| {lab} | {S.fmt_interval(x['pooled'])} | "
            + " | ".join(f"{float(x[t][0]):+.3f}" if t in x else "" for t in texts)
            + f" | {float(x['pooled:kl'][0]):.3f} | {float(x['pooled:top1'][0]):.3f} |"
            + (f" {paper.get(lab, '')} |" if paper else "")
        )
    return L


def _repeat_check(rec, label: str, data: Path, model: str) -> str:
    """How the setting ``label`` compares with the same edit in another committed study, window
    by window (first windows of each text); a sentence for the page."""
    import pandas as pd

    prefix, other = REPEATS[label]
    stem = f"{prefix}_{model}"
    mpath = data / f"{stem}.manifest.json"
    if not mpath.is_file():
        return f"`{label}` repeats `{other}` of `{stem}`, whose data are not in this directory: not compared."
    try:
        m = json.loads(mpath.read_text())
        b = common.checked_bytes(
            data / f"{stem}.records.csv",
            m["files"][f"{stem}.records.csv"],
            f"{stem}.records.csv",
            mpath.name,
            InstrumentsDataError,
        )
    except (OSError, ValueError, KeyError, InstrumentsDataError) as e:
        return f"`{label}` repeats `{other}` of `{stem}`, whose data cannot be read ({e}): not compared."
    theirs = pd.read_csv(io.BytesIO(b))
    theirs = theirs[theirs.setting == other][["text", "window", "nll", "base_nll"]]
    ours = rec[rec.setting == label][["text", "window", "nll", "base_nll"]]
    j = ours.merge(theirs, on=["text", "window"], suffixes=("", "_o"))
    if j.empty:
        return f"`{label}` repeats `{other}` of `{stem}`, but no window is in both: not compared."
    dn = float((j.nll - j.nll_o).abs().max())
    db = float((j.base_nll - j.base_nll_o).abs().max())
    same = "the same" if dn == 0 and db == 0 else "not bit-identical"
    return (
        f"`{label}` repeats `{other}` of `{stem}` on {len(j)} common windows: {same}; largest per-window "
        f"difference of the NLL sums {dn:.3g} nats edited, {db:.3g} baseline (of about "
        f"{float(j.nll.abs().mean()):.0f} per window)."
    )


def _carrier_lines(st, texts, manifest: dict, rec, prof, data: Path) -> list[str]:
    """The carrier section (protocol sec. 11.2): table, matched pairs, repeat check, per-layer profile."""
    import numpy as np

    m, car = manifest["model"], manifest["carrier"]
    L: list[str] = []
    paper = {}
    for lab in CARRIER:
        space, what = lab.split(" ")
        par, perp = PAPER_CARRIER[space]
        paper[lab] = f"{par:+.4f}" if what == "s_par=0" else f"{perp:+.4f}"
    L += [
        "",
        "## (a) MLP carrier edits against the residual MLP edit (every layer)",
        "",
        f"The carrier `h` (`d_mlp = {car['d_mlp']}`) is cut into `G = {car['blocks']}` blocks of width "
        f"`d = {car['d_model']}`"
        + (
            f"; `d_mlp` is not a multiple of `d`, so the last block holds {car['partial_width']} real coordinates "
            f'and is zero-padded (`remainder="{car["remainder"]}"`, see [method](../method.md)).'
            if car["partial_width"]
            else " (an exact multiple)."
        ),
        '`site="input"`: each block `h_g` split against the MLP input `x` before `W_down`; `site="block"`: each '
        "contribution `W_down[:, I_g] h_g` split against `h_g` before the sum. `paper`: the revision's Qwen3-0.6B "
        "C4 loss change (appendix, Table `tab:mlp-internal-carrier`), quoted, not comparable in level.",
        "",
    ]
    L += _table(st, CARRIER, texts, paper)
    pairs = [(f"carrier-{s} s_perp=0", f"carrier-{s} s_par=0") for s in ("input", "block")]
    if all(a in st and b in st for a, b in pairs):
        L += [
            "",
            "Perpendicular minus parallel removal (context, no verdict): "
            + "; ".join(
                f"{a.split(' ')[0]} {S.fmt_interval(st[a]['pooled'] - st[b]['pooled'])}" for a, b in pairs
            )
            + ".",
        ]
    if m["sandwich_norm"]:
        L += [
            "",
            "Sandwich norms: the MLP output passes a post-feedforward RMSNorm before it joins the stream; the "
            "carrier edits act before that norm, the residual MLP edit after it (protocol sec. 11.2).",
        ]
    L += ["", _repeat_check(rec, "resid-mlp s_par=0", data, m["name"])]
    L += [
        "",
        "Carrier blocks' parallel share per layer (BOS excluded, token-weighted over the texts): "
        "`sum ||h_g,par||^2 / sum ||h_g||^2` against `x` (input site) and of `y_g` against `h_g` (block site), "
        "beside the residual MLP update's mean abs cos against its stream.",
        "",
        "| layer | carrier input par share | carrier block par share | resid MLP mean abs cos |",
        "|---:|---:|---:|---:|",
    ]
    for layer, g in prof.groupby("layer"):
        w = g["count"].to_numpy(dtype=float)
        cells = [
            float(np.average(g[c].to_numpy(dtype=float), weights=w))
            for c in ("carrier_input_par_share", "carrier_block_par_share", "par_frac_mean")
        ]
        L.append(f"| {int(layer)} | {cells[0]:.4f} | {cells[1]:.4f} | {cells[2]:.3f} |")
    return L


def _wanda_lines(st, texts, manifest: dict, ranking) -> list[str]:
    """The weighted-Wanda section (sec. 11.3): table, flip fractions, ranking overlap."""

    L: list[str] = []
    cal = manifest["calibration"]
    L += [
        "",
        f"## (b) Component-weighted Wanda at {cal['sparsity']:.0%} unstructured",
        "",
        f"Every attention and MLP linear of every layer, scores compared within each output row. Calibration: "
        f"windows {cal['first_window']}-{cal['first_window'] + cal['windows_per_text'] - 1} of each text "
        f"({cal['tokens']} tokens, disjoint from the evaluation windows), one pass shared by the three weightings. "
        "`delta` is each pruned model against the dense one.",
        "",
    ]
    L += _table(st, WANDA, texts)
    if all(w in st for w in WANDA):
        L += [
            "",
            f"- wanda-perp minus wanda (signed): {S.fmt_interval(st['wanda-perp']['pooled'] - st['wanda']['pooled'], '+.4f')} "
            f"nats/token; wanda-par minus wanda: {S.fmt_interval(st['wanda-par']['pooled'] - st['wanda']['pooled'], '+.4f')}.",
        ]
    wst = manifest["wanda"]
    L += [
        "- Pruned weights flipped against standard Wanda: "
        + "; ".join(
            f"{lab} {wst[lab]['flipped_vs_wanda']:.4%} ({int(wst[lab]['flipped_weights'])} of "
            f"{int(wst[lab]['pruned_weights'])})"
            for lab in ("wanda-perp", "wanda-par")
        )
        + "."
    ]
    allrow = ranking[ranking.name == "all"].iloc[0]
    per = ranking[ranking.name != "all"]
    L += [
        f"- Ranking overlap of the total-error and perpendicular-error pruned sets (all linears pooled): "
        f"{float(allrow.overlap):.6f}; norm-matched isotropic null over {int(allrow.n_null)} draws: mean "
        f"{float(allrow.null_mean):.6f}, sd {float(allrow.null_sd):.2g}, range [{float(allrow.null_min):.6f}, "
        f"{float(allrow.null_max):.6f}]; observed {'inside' if bool(allrow.inside_null) else 'outside'} the null's "
        f"range; linears inside their null's range: {int(per.inside_null.astype(bool).sum())} of {len(per)}, "
        f"below it: {int((per.overlap < per.null_min).sum())}. Ours is the overlap of the pruned half (the lowest "
        "scores), the paper's of the largest 1% / 10%: compare with the null, not across.",
        f'- The paper ({cite(APPENDIX, "739519c")}, "Overall pruning-error rankings"): {PAPER_WANDA}; {PAPER_RANKING}.',
    ]
    return L


def _random_lines(st, texts, manifest: dict, rec, data: Path) -> list[str]:
    """The random per-layer scales section (sec. 11.4): table, draws, spread, repeat check."""

    m = manifest["model"]
    L: list[str] = []
    L += [
        "",
        "## (c) Random per-layer value-space scales against fixed half retention",
        "",
        "Exclude-self value-space scaling in the joint form (one split per token over the concatenated heads, "
        '`ValueScale(mode="exclusive", joint=True)`), every layer but the first, `s_perp = 1`; each draw\'s '
        "`s_par` per layer from `random_scales(n_layers, dist, seed)` (uniform on [0, 2]; Gaussian mean 1, sd 1/3 "
        "truncated to [0, 2]).",
        "",
    ]
    rand = [FIXED, *(f"{dist} seed={s}" for dist in ("uniform", "gaussian") for s in SEEDS)]
    L += _table(st, rand, texts)
    extra = {s["label"]: s for s in manifest["settings"]}
    L += [
        "",
        "| draw | mean s_par (edited layers) | delta - delta(fixed 0.5) [95% CI] | s_par per layer (layer 0 unused) |",
        "|---|---:|---|---|",
    ]
    for lab in rand[1:]:
        if lab not in st or FIXED not in st:
            continue
        draw = extra[lab].get("extra", {}).get("draw", [])
        L.append(
            f"| {lab} | {extra[lab]['s_par']:.3f} | {S.fmt_interval(st[lab]['pooled'] - st[FIXED]['pooled'])} | "
            + " ".join(f"{v:.2f}" for v in draw)
            + " |"
        )
    for dist in ("uniform", "gaussian"):
        xs = [float(st[f"{dist} seed={s}"]["pooled"][0]) for s in SEEDS if f"{dist} seed={s}" in st]
        if xs:
            L.append(
                f"\nSpread over the {len(xs)} {dist} draws: {min(xs):+.3f} .. {max(xs):+.3f} nats/token."
            )
    L += [
        "",
        _repeat_check(rec, FIXED, data, m["name"]),
        "",
        f'The paper ({cite(APPENDIX, "739519c")}, "Random layerwise value-parallel scaling"), {PAPER_RANDOM}.',
        "",
    ]
    return L


def build_page(stem: str, data: Path) -> str:
    """The page ``instruments_<model>.md``, a pure function of ``data/<stem>.*`` (and, for the
    repeat checks only, of the other committed studies' records in ``data``)."""

    manifest, frames = load(stem, data)
    rec, prof, ranking = frames["records"], frames["profile"], frames["ranking"]
    st = statistics(rec)
    texts = sorted(rec.text.unique())
    m = manifest["model"]
    tokens = {
        t: int(rec[(rec.text == t) & (rec.setting == "baseline")].tokens.sum()) for t in texts
    }
    done = "" if manifest["complete"] else " (**incomplete run**: the texts below only)"
    L = [
        f"# The revision's other instruments on {m['name']} ({manifest['seq_len']}-token windows, "
        + ", ".join(f"`{t}`" for t in texts)
        + ")",
        "",
        "Built by `python scripts/claims.py build` from the committed data "
        f"`docs/results/data/{stem}.*` alone (protocol: [protocol.md](protocol.md) sec. 11, written before the "
        "run); do not edit by hand.",
        "",
        f"- Data made by `{manifest['command']}` at commit `{manifest['commit']}`, {manifest['date']}, "
        f"{manifest['machine']}, {manifest['seconds']:.0f} s{done}.",
        f"- Model: `{m['name']}` ({m['architecture']}, {m['n_layers']} layers, {m['n_heads']} query / "
        f"{m['n_kv_heads']} KV heads{', sandwich norms' if m['sandwich_norm'] else ''}"
        + (
            f"), **dequantised** from `{m['source_file']}` ({m['quantisation']}, sha256 "
            f"`{str(m['source_sha256'])[:16]}...`) to float32"
            if m.get("dequantised")
            else "), float32 as trained"
        )
        + f", unprocessed weights, {m['lane']} lane.",
        "- Texts: "
        + "; ".join(
            f"`{t}` (sha256 `{manifest['texts'][t]['sha256'][:12]}`): {manifest['texts'][t]['windows']} windows, "
            f"{tokens[t]} predicted tokens"
            for t in texts
        )
        + ".",
        f"- `delta`: nats per predicted token, token-weighted, pooled over the texts; intervals: 95% percentile "
        f"bootstrap over windows stratified by text ({S.B} resamples, seed {S.SEED}), the same resamples for every "
        "setting (paired); a claim about every member takes the worst member inside each resample. Every edit "
        "on every position, no BOS exemption.",
        "",
        "## Verdicts (rules in [protocol.md](protocol.md) sec. 11)",
        "",
        "| claim | test | statistic [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    L += [f"| {c} | {t} | {s} | {v} |" for c, t, s, v in verdicts(st)]

    L += _carrier_lines(st, texts, manifest, rec, prof, data)
    L += _wanda_lines(st, texts, manifest, ranking)
    L += _random_lines(st, texts, manifest, rec, data)
    return "\n".join(L)


def stems(data: Path) -> list[str]:
    """The instruments data stems under ``data``."""
    return sorted(
        p.name[: -len(".manifest.json")] for p in data.glob("instruments_*.manifest.json")
    )
