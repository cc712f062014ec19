"""Protocol sec. 9 (amendment 1): the paper's claims in the paper's own edit form, and where the
exclude-self damage sits. Pages built from committed data alone.

    # measure (the claims study's runner, its own data stems; refuses a dirty tree)
    python -m studies run claims --model smollm2-135m --settings amend --windows 32 --batch-size 8
    python -m studies run claims --model smollm2-135m --settings atlas --windows 32 --batch-size 8

    # pages: built by `python -m studies build` (make results) with the claims pages:
    # docs/results/amend_<model>.md and docs/results/atlas_<model>.md

Data files: ``docs/results/data/{amend,atlas}_<model>.{records,profile}.csv`` and their
``manifest.json``, the claims study's layout (one record per text, window and setting).
"""

from __future__ import annotations

import math
from pathlib import Path

from studies.claims import data as D
from studies.claims import stats as S
from studies.paper import EXPERIMENTS, SWEEP_CSV, cite
from tl_directional.core.paired import holm  # noqa: E402

#: The revision's exclude-self PPL sweep (Qwen3-1.7B, WikiText-2; the figure caption at 739519c /
#: b6d7a16: every decoder layer but the first), from its figure-source table
#: ``figs/para_ablation_corrected/ppl_component_scaling_corrected_sources.csv`` at b6d7a16
#: (panel ``parallel``, series ``value``), repository Shwai-He/Transformer-Geometry,
#: folder ``_overleaf_/ARR_May_Revision_Overleaf/``: ``{s_par: ppl}``.
PAPER_VALUE_PPL = {
    0.0: 22.495854647408816,
    0.25: 21.017970173563253,
    0.5: 20.719742185672956,
    0.75: 21.141625344239397,
    1.0: 22.035742552634293,
    1.5: 25.16278036919272,
    2.0: 31.161798165914824,
    2.5: 45.794951976989914,
    3.0: 89.47364410110305,
}
PAPER_SENTENCE = (
    "remaining virtually flat across s in [0, 1] (shifting PPL by less than a point, and by at "
    "most 1.3 points up to scale 3)"
)
#: sec. 3's settings that the amend grid measures again, ``{amend label: claims label}``
REPEATS = {
    "value-exclusive all s_par=0": "value-exclusive s_par=0",
    "value-exclusive all s_par=0.5": "value-exclusive s_par=0.5",
    "value-full all s_par=0": "value-full s_par=0",
    "value-exclusive-joint all s_par=0": "value-exclusive-concat s_par=0",
    "value-full-joint all s_par=0": "value-full-concat s_par=0",
    "resid-attn all s_par=0": "resid-attn s_par=0",
}


def provenance(manifest, stem, texts, tokens, *, section: str = "9",
               builder: str = "python scripts/claims.py build") -> list[str]:
    """The page's opening lines: how it was built, the run, the model, the texts, the statistic."""
    m = manifest["model"]
    done = "" if manifest["complete"] else " (**incomplete run**: the texts below only)"
    return [
        f"Built by `{builder}` from the committed data "
        f"`docs/results/data/{stem}.*` alone (protocol: [protocol.md](protocol.md) sec. {section}); do not edit by hand.",
        "",
        f"- Data made by `{manifest['command']}` at commit `{manifest['commit']}`, {manifest['date']}, "
        f"{manifest['machine']}, {manifest['seconds']:.0f} s{done}.",
        f"- Model: `{m['name']}` ({m['architecture']}, {m['n_layers']} layers, {m['n_heads']} query / "
        f"{m['n_kv_heads']} KV heads{', sandwich norms' if m['sandwich_norm'] else ''}), **dequantised** from "
        f"`{m['source_file']}` ({m['quantisation']}, sha256 `{m['source_sha256'][:16]}...`) to float32 "
        f"(model.safetensors sha256 `{(m['safetensors_sha256'] or 'n/a')[:16]}...`), {m['lane']} lane.",
        "- Texts: "
        + "; ".join(
            f"`{t}` (sha256 `{manifest['texts'][t]['sha256'][:12]}`): {manifest['texts'][t]['windows']} windows, "
            f"{tokens[t]} predicted tokens"
            for t in texts
        )
        + ".",
        f"- `delta`: nats per predicted token, token-weighted, pooled over the texts; intervals: 95% percentile "
        f"bootstrap over windows stratified by text ({S.B} resamples, seed {S.SEED}), the same resamples for "
        "every setting (paired). `corpus ppl`: the relative change of `exp` of the token-weighted mean NLL "
        "(corpus-level perplexity, the form lm-eval reports), pooled over the texts.",
        "",
    ]


def corpus_ppl(rec, weights):
    """``{setting: [B + 1]}`` relative change of the pooled corpus-level perplexity."""
    import numpy as np

    out = {}
    for setting, g in rec.groupby("setting", sort=False):
        tok = nll = base = 0.0
        for text, w in weights.items():
            a = g[g.text == text].sort_values("window")[["tokens", "nll", "base_nll"]].to_numpy()
            if len(a):
                s = w @ a
                tok, nll, base = tok + s[:, 0], nll + s[:, 1], base + s[:, 2]
        out[setting] = np.exp((nll - base) / tok) - 1.0
    return out


def settings_table(st, ppl, labels, texts) -> list[str]:
    L = [
        "| setting | delta pooled [95% CI] | " + " | ".join(f"delta `{t}`" for t in texts)
        + " | corpus ppl change | KL | top-1 agree |",
        "|---|---|" + "---:|" * len(texts) + "---:|---:|---:|",
    ]
    for lab in labels:
        if lab not in st:
            continue
        d = st[lab]
        L.append(
            f"| {lab} | {S.fmt_interval(d['pooled'])} | "
            + " | ".join(f"{float(d[t][0]):+.3f}" if t in d else "" for t in texts)
            + f" | {float(ppl[lab][0]) * 100:+.1f}% | {float(d['pooled:kl'][0]):.3f} | "
            f"{float(d['pooled:top1'][0]):.3f} |"
        )
    return L


def _amend_verdicts(st) -> list[tuple[str, str, str, str]]:
    import numpy as np

    rows = []
    ex0, ex5 = "value-exclusive-joint skip0 s_par=0", "value-exclusive-joint skip0 s_par=0.5"
    if ex0 in st and ex5 in st:
        worst = np.maximum(np.abs(st[ex0]["pooled"]), np.abs(st[ex5]["pooled"]))
        rows.append(("A1p", f"exclude-self (joint, skip0) changes loss by at most {S.BUDGET} nats/token at "
                     "s_par 0 and 0.5", f"max abs(delta) over s_par in {{0, 0.5}} = {S.fmt_interval(worst)}",
                     S.verdict_upper(worst, S.BUDGET)))
    if ex5 in st:
        half = np.abs(st[ex5]["pooled"])
        rows.append(("A1h", "... at half retention (s_par = 0.5) alone", f"abs(delta) = {S.fmt_interval(half)}",
                     S.verdict_upper(half, S.BUDGET)))
    for cid, other, name in (
        ("A3h", "value-full-joint skip0 s_par=0.5", "full aggregate (joint, skip0)"),
        ("A3r", "resid-attn skip0 s_par=0.5", "resid-attn (skip0)"),
    ):
        if ex5 in st and other in st:
            diff = st[other]["pooled"] - st[ex5]["pooled"]
            rows.append((cid, f"at s_par = 0.5, exclude-self (joint, skip0) damages less than {name}",
                         f"their delta - exclude-self delta = {S.fmt_interval(diff)}", S.verdict_sign(diff)))
    return rows


def _paper_side_by_side(model: str, data: Path) -> list[str]:
    """A2 restated (sec. 9.1): sec. 3's exclude-self curve beside the paper's table."""
    stem = f"claims_{model}"
    if not (data / f"{stem}.manifest.json").is_file():
        return []
    _, rec, _ = D.load_data(stem)
    st = S.setting_stats(rec, S.window_bootstrap(rec))
    base = PAPER_VALUE_PPL[1.0]
    L = [
        "## A2 restated: the paper's sentence against the paper's table (sec. 9.1)",
        "",
        f"The revision's text ({cite(EXPERIMENTS, '28ae91f')}, \"Site asymmetry\"; the only version read "
        f"that says it, protocol sec. 12): \"{PAPER_SENTENCE}\". "
        f"Its figure-source table for the same sweep ({cite(SWEEP_CSV, 'b6d7a16')}, Qwen3-1.7B, WikiText-2, "
        f"every layer but the first by the figure caption of `739519c` / `b6d7a16`, baseline PPL "
        f"{base:.2f}) is the middle columns; ours (per-head exclude-self on every layer, sec. 3's data "
        f"`{stem}.*`) the last. The paper's log ratio is in nats per unit of its table's perplexity (per "
        "word if it is lm-eval's word perplexity); ours is nats per token.",
        "",
        "| s_par | paper PPL change | paper log PPL ratio | ours: delta [95% CI] |",
        "|---:|---:|---:|---|",
    ]
    for s, p in PAPER_VALUE_PPL.items():
        if s == 1.0:
            continue
        lab = f"value-exclusive s_par={s:g}"
        ours = S.fmt_interval(st[lab]["pooled"]) if lab in st else "not measured"
        L.append(f"| {s:g} | {p - base:+.2f} | {math.log(p / base):+.3f} | {ours} |")
    L += ["", _paper_figure(data), ""]
    L += [
        "",
        "The sentence holds in the table inside [0, 1] only: at 2 and 3 the table's own changes are "
        f"{PAPER_VALUE_PPL[2.0] - base:+.2f} and {PAPER_VALUE_PPL[3.0] - base:+.2f} points, not at most 1.3. "
        "No verdict is drawn from the sentence (sec. 9.1); the first A2 verdict stays on "
        f"[{stem}]({stem}.md) as history.",
        "",
    ]
    return L


def _paper_figure(data: Path) -> str:
    """One inline SVG: the paper's exclude-self curve (its log perplexity ratio) beside ours on
    each model with committed sec. 3 data (pooled delta, nats per token), against s_par."""
    from tl_directional.views import svg_chart

    base = PAPER_VALUE_PPL[1.0]
    series = {"paper Qwen3-1.7B": [(s, math.log(p / base)) for s, p in PAPER_VALUE_PPL.items()]}
    for m in ("smollm2-135m", "gemma-3-270m"):
        if not (data / f"claims_{m}.manifest.json").is_file():
            continue
        _, rec, _ = D.load_data(f"claims_{m}")
        st = S.setting_stats(rec, S.window_bootstrap(rec))
        pts = [(1.0, 0.0)] + [(s, round(float(st[f"value-exclusive s_par={s:g}"]["pooled"][0]), 9)) for s in S.EXCL_GRID
                              if f"value-exclusive s_par={s:g}" in st]
        series[f"ours {m}"] = sorted(pts)
    svg = svg_chart(series, title="exclude-self value scaling, every layer", xlabel="s_par",
                    ylabel="log loss change (nats)", hline=(0.0, "baseline"), width=720, height=380)
    caption = ("The paper's curve is the log ratio of its table's perplexities (nats per unit of that "
               "perplexity); ours are pooled deltas of nats per predicted token (intervals in the table).")
    return "<figure>\n" + svg.strip() + f"\n<figcaption>{caption}</figcaption>\n</figure>"


def _repeat_check(rec, model: str, data: Path) -> list[str]:
    """The amend grid's repeats of sec. 3's settings against sec. 3's records, window by window."""
    import numpy as np

    stem = f"claims_{model}"
    if not (data / f"{stem}.manifest.json").is_file():
        return []
    _, old, _ = D.load_data(stem)
    L = [
        "## Repeats of sec. 3's settings (same windows, same code path or the library's since)",
        "",
        "| setting here | sec. 3's | windows compared | max abs difference of the window NLL sums (nats) |",
        "|---|---|---:|---:|",
    ]
    for new, prev in REPEATS.items():
        a = rec[rec.setting == new].set_index(["text", "window"]).nll
        b = old[old.setting == prev].set_index(["text", "window"]).nll
        shared = a.index.intersection(b.index)
        if len(shared):
            diff = float(np.max(np.abs(a.loc[shared].to_numpy() - b.loc[shared].to_numpy())))
            L.append(f"| {new} | {prev} | {len(shared)} | {diff:.2e} |")
    return L + [""]


def page_inputs(stem: str):
    """``(manifest, records, per-setting stats, corpus ppl, texts, predicted tokens per text)`` of
    run ``stem``, with sec. 2's window bootstrap: what every page of a settings grid starts from."""
    manifest, rec, _ = D.load_data(stem)
    weights = S.window_bootstrap(rec)
    st, ppl = S.setting_stats(rec, weights), corpus_ppl(rec, weights)
    texts = list(weights)
    tokens = {t: int(rec[(rec.text == t) & (rec.setting == "baseline")].tokens.sum()) for t in texts}
    return manifest, rec, st, ppl, texts, tokens


def build_amend_page(stem: str, data: Path) -> str:
    manifest, rec, st, ppl, texts, tokens = page_inputs(stem)
    model = manifest["model"]["name"]
    L = [f"# The paper's edit form on {model} (protocol sec. 9.2)", ""]
    L += provenance(manifest, stem, texts, tokens)
    L += ["## Verdicts (amended rules, [protocol.md](protocol.md) sec. 9.2)", "",
          "| claim | test | statistic [95% CI] | verdict |", "|---|---|---|---|"]
    L += [f"| {c} | {t} | {s} | {v} |" for c, t, s, v in _amend_verdicts(st)]
    labels = [s["label"] for s in manifest["settings"]]
    for s_par in ("0", "0.5"):
        L += ["", f"## s_par = {s_par}", ""]
        L += settings_table(st, ppl, [lab for lab in labels if lab.endswith(f"s_par={s_par}")], texts)
    L += ["", "## Hard diagonal removal", ""]
    L += settings_table(st, ppl, ["hard-diag skip0"], texts)
    # paired contrasts, reported without a verdict
    L += ["", "## Paired contrasts (no verdict)", "", "| contrast | difference of delta [95% CI] |", "|---|---|"]
    for s in ("0", "0.5"):
        for ls in ("all", "skip0", "skip01"):
            a, b = f"value-exclusive-joint {ls} s_par={s}", f"value-exclusive {ls} s_par={s}"
            if a in st and b in st:
                L.append(f"| exclude-self joint - per head ({ls}, s_par={s}) | "
                         f"{S.fmt_interval(st[a]['pooled'] - st[b]['pooled'])} |")
        for form in ("value-exclusive-joint", "value-exclusive"):
            for x, y in (("all", "skip0"), ("skip0", "skip01")):
                a, b = f"{form} {x} s_par={s}", f"{form} {y} s_par={s}"
                if a in st and b in st:
                    L.append(f"| {form}: {x} - {y} (s_par={s}) | {S.fmt_interval(st[a]['pooled'] - st[b]['pooled'])} |")
    L += [""]
    L += _repeat_check(rec, model, data)
    L += _paper_side_by_side(model, data)
    return "\n".join(L).rstrip("\n")


def build_atlas_page(stem: str, data: Path) -> str:
    import numpy as np

    manifest, rec, _ = D.load_data(stem)
    weights = S.window_bootstrap(rec)
    st = S.setting_stats(rec, weights)
    texts = list(weights)
    tokens = {t: int(rec[(rec.text == t) & (rec.setting == "baseline")].tokens.sum()) for t in texts}
    m = manifest["model"]
    n = m["n_layers"]
    labels = [f"value-exclusive L{L} s_par=0" for L in range(n) if f"value-exclusive L{L} s_par=0" in st]
    L = [f"# Where the exclude-self damage sits on {m['name']}: single-layer atlas (protocol sec. 9.3)", ""]
    L += provenance(manifest, stem, texts, tokens)
    level = S.BUDGET / n
    pvals = {lab: float(np.mean(st[lab]["pooled"][1:] <= level)) for lab in labels}
    above = holm(pvals)
    total = np.sum([st[lab]["pooled"] for lab in labels], axis=0)
    early = np.sum([st[lab]["pooled"] for lab in labels[:2]], axis=0)
    L += [
        "## Summary (no verdict)",
        "",
        "| statistic | value [95% CI] |",
        "|---|---|",
        f"| layers measured | {len(labels)} of {n} |",
        f"| sum of single-layer deltas | {S.fmt_interval(total)} |",
        f"| share of that sum in layers 0 and 1 | {S.fmt_interval(early / total, '+.2f')} |",
        f"| layers whose delta exceeds an even share of the budget, {S.BUDGET}/{n} = {level:.4f} "
        f"(Holm, one-sided, alpha 0.05) | {len(above)}: {', '.join(lab.split()[1] for lab in labels if lab in above) or 'none'} |",
    ]
    all_layer = f"claims_{m['name']}"
    if (data / f"{all_layer}.manifest.json").is_file():
        _, old, _ = D.load_data(all_layer)
        old = old[old.text.isin(texts)]  # the same texts as the atlas, so the two compare
        ost = S.setting_stats(old, S.window_bootstrap(old))
        if "value-exclusive s_par=0" in ost:
            L.append(f"| all-layer delta on the same texts, sec. 3's data (`{all_layer}`) | "
                     f"{S.fmt_interval(ost['value-exclusive s_par=0']['pooled'])} |")
    L += ["", "Edits interact: the sum of single-layer deltas need not equal the all-layer delta.", "",
          "## Per layer", ""] + per_layer_table(st, labels, texts)
    return "\n".join(L)


def per_layer_table(st: dict, labels: list[str], texts: list[str]) -> list[str]:
    """The markdown rows of a single-layer atlas: per layer (read from a label ``"<edit> L<i> ..."``)
    the pooled delta with its interval, each text's delta, KL and top-1 agreement."""
    rows = ["| layer | delta pooled [95% CI] | " + " | ".join(f"delta `{t}`" for t in texts) + " | KL | top-1 agree |",
            "|---:|---|" + "---:|" * len(texts) + "---:|---:|"]
    for lab in labels:
        d = st[lab]
        rows.append(f"| {lab.split()[1][1:]} | {S.fmt_interval(d['pooled'])} | "
                    + " | ".join(f"{float(d[t][0]):+.3f}" if t in d else "" for t in texts)
                    + f" | {float(d['pooled:kl'][0]):.3f} | {float(d['pooled:top1'][0]):.3f} |")
    return rows


def verdict_rows(stem: str, data: Path) -> list[tuple[str, str, str]]:
    """``(claim, statistic, verdict)`` rows of an amend page, for docs/results.md's summary."""
    manifest, rec, _ = D.load_data(stem)
    st = S.setting_stats(rec, S.window_bootstrap(rec))
    return [(f"{c}: {t}", s, v) for c, t, s, v in _amend_verdicts(st)]
