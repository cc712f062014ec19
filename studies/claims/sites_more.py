"""Protocol sec. 16: the residual sites continued. Three pages, each built from committed data alone
(``python -m studies build``): ``strength_<model>.md`` (sec. 16.3-16.4: the applied strength of the
lead table's edits and the sign distribution of the exclude-self diagonal shift),
``residatlas_<model>.md`` (sec. 16.2: the single-layer residual atlas) and ``residrandom_<model>.md``
(sec. 16.5: random per-layer draws in residual against value space).

    python -m studies run claims --model smollm2-135m --settings strength --windows 16 --batch-size 8 --threads 1
    python -m studies run claims --model smollm2-135m --settings residrandom --windows 16 --batch-size 8 --threads 1
    python -m studies run claims --model smollm2-135m --settings residatlas --windows 16 --batch-size 8 --threads 1
"""

from __future__ import annotations

import io
from pathlib import Path

from studies import common
from studies.claims import data as D
from studies.claims import stats as S
from studies.claims.amend import corpus_ppl, per_layer_table, settings_table
from studies.claims.residual import COMPONENTS, DRAWS, atlas_label, random_label
from studies.paper import APPENDIX, cite
from tl_directional.core.paired import holm  # noqa: E402

#: the paper's audit (appendix table tab:applied-no-para-strength at 8e5278e, Qwen3-0.6B):
#: (perturbation norm, perturbation energy, retained norm), in percent
PAPER_STRENGTH = {"attention residual-space": (25.15, 9.323, 95.01),
                  "attention exclude-self value-space": (49.10, 25.89, 83.36)}
PAIR = ("value-exclusive-joint skip0 s_par=0", "resid-attn skip0 s_par=0")
#: sec. 16.4's reading of the fraction of positive shifts
NONPOSITIVE, SIGNED = 0.01, 0.05
#: sec. 16.2's reading of the layers 0-1 share
MOST = 0.5


def load_frames(stem: str) -> tuple[dict, dict]:
    """``(manifest, {kind: DataFrame})`` of run ``stem`` under the data folder, every file checked
    against the manifest's sha256; a dirty run's data are refused (:class:`studies.claims.data.DataError`)."""
    import pandas as pd

    mpath = D.DATA / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, mpath.name, D.DataError)
    frames = {}
    for name, want in manifest.get("files", {}).items():
        b = common.checked_bytes(D.DATA / name, want, name, mpath.name, D.DataError)
        frames[name.split(".")[-2]] = pd.read_csv(io.BytesIO(b))
    if "+dirty" in manifest["commit"]:
        raise D.DataError(f"{mpath.name}: made from a dirty tree ({manifest['commit']}); rerun from a clean one")
    return manifest, frames


def stems(data: Path, prefix: str) -> list[str]:
    """The ``<prefix>_<model>`` stems with committed data."""
    return sorted(p.name[: -len(".manifest.json")] for p in data.glob(f"{prefix}_*.manifest.json"))


def _head(manifest: dict, stem: str, section: str, title: str) -> list[str]:
    m = manifest["model"]
    done = "" if manifest["complete"] else " (**incomplete run**: the texts below only)"
    texts = ", ".join(f"`{t}` ({v['windows']} windows)" for t, v in manifest["texts"].items())
    return [f"# {title} on {m['name']} (protocol sec. {section})", "",
            f"Built by `python -m studies build` from the committed data `docs/results/data/{stem}.*` alone "
            f"(protocol: [protocol.md](protocol.md) sec. {section}); do not edit by hand.", "",
            f"- Data made by `{manifest['command']}` at commit `{manifest['commit']}`, {manifest['date']}, "
            f"{manifest['machine']}, {manifest['seconds']:.0f} s{done}.",
            f"- Model: `{m['name']}` ({m['architecture']}, {m['n_layers']} layers, {m['n_heads']} query / "
            f"{m['n_kv_heads']} KV heads{', sandwich norms' if m['sandwich_norm'] else ''}), **dequantised** from "
            f"`{m['source_file']}` ({m['quantisation']}) to float32, {m['lane']} lane.",
            f"- Texts: {texts}. Intervals: 95% percentile bootstrap over windows stratified by text "
            f"({S.B} resamples, seed {S.SEED}), the same resamples for every row (paired).", ""]


def _boot(frame, cols, weights) -> dict:
    """``{col: [B + 1]}`` sums of ``cols`` over the resampled windows (``frame``: one row per
    text and window, windows 0..n-1)."""
    import numpy as np

    out = {c: 0.0 for c in cols}
    for text, w in weights.items():
        g = frame[frame.text == text].set_index("window").reindex(range(w.shape[1]), fill_value=0)
        a = g[list(cols)].to_numpy(dtype=float)
        s = w @ a
        for i, c in enumerate(cols):
            out[c] = out[c] + s[:, i]
    return {c: np.asarray(v) for c, v in out.items()}


STRENGTH_COLS = ("count", "norm", "energy", "retained", "diff_sq", "base_sq", "count0", "norm0")


def strength_stats(frame, weights) -> dict:
    """Per edit: ``{"norm", "energy", "retained", "pooled_norm", "norm_no_first": [B + 1]}``
    token-weighted means over edited updates (sec. 16.3), formed inside each resample."""
    out = {}
    for edit, g in frame.groupby("edit", sort=False):
        s = _boot(g.groupby(["text", "window"], as_index=False)[list(STRENGTH_COLS)].sum(), STRENGTH_COLS, weights)
        out[edit] = {"norm": s["norm"] / s["count"], "energy": s["energy"] / s["count"],
                     "retained": s["retained"] / s["count"], "pooled_norm": (s["diff_sq"] / s["base_sq"]) ** 0.5,
                     "norm_no_first": (s["norm"] - s["norm0"]) / (s["count"] - s["count0"]),
                     "count": int(s["count"][0])}
    return out


def _pct(x) -> str:
    v, lo, hi = S.interval(x * 100)
    return f"{v:.2f}% [{lo:.2f}, {hi:.2f}]"


#: the paper's norm ratio, exclude-self value-space over residual-space (49.10 / 25.15)
PAPER_RATIO = PAPER_STRENGTH["attention exclude-self value-space"][0] / PAPER_STRENGTH["attention residual-space"][0]


def strength_comparison(st) -> tuple:
    """Sec. 16.3's comparison on :func:`strength_stats` ``st``: ``(difference, ratio, reading)`` of the
    mean norms of :data:`PAIR` (``[B + 1]`` arrays, exclude-self minus / over the residual edit) and the
    reading of the difference's interval (the paper's ordering holds / is reversed / not decided)."""
    a, b = PAIR
    diff, ratio = st[a]["norm"] - st[b]["norm"], st[a]["norm"] / st[b]["norm"]
    _, lo, hi = S.interval(diff)
    return diff, ratio, ("**holds on this model**" if lo > 0 else "**is reversed on this model**" if hi < 0
                         else "not decided")


def _strength_section(st, sandwich: bool) -> list[str]:
    L = ["## Applied strength (sec. 16.3)", "",
         "Per edited update (one token of one edited layer): `norm = ||y~ - y|| / ||y||`, "
         "`energy = ||y~ - y||^2 / ||y||^2`, `retained = ||y~|| / ||y||`, token-weighted means over every edited "
         "layer and position; `pooled norm`: `sqrt(sum ||y~ - y||^2 / sum ||y||^2)`. Site: the summed attention "
         "output after `W_O` (value-space and pattern edits), the residual update (residual edits).", ""]
    if sandwich:
        L += ["On this sandwich-norm model the value-space and pattern edits are measured before the "
              "post-attention RMSNorm and the residual attention edit after it (sec. 16.3).", ""]
    L += ["| edit | norm [95% CI] | energy [95% CI] | retained [95% CI] | pooled norm [95% CI] | norm, first position out | updates |",
          "|---|---|---|---|---|---|---:|"]
    for edit, d in st.items():
        L.append(f"| {edit} | {_pct(d['norm'])} | {_pct(d['energy'])} | {_pct(d['retained'])} | "
                 f"{_pct(d['pooled_norm'])} | {float(d['norm_no_first'][0]) * 100:.2f}% | {d['count']} |")
    L += ["", f"The paper ({cite(APPENDIX, '8e5278e')}, table `tab:applied-no-para-strength`, Qwen3-0.6B; not in "
          f"the file at `739519c` / `b6d7a16`):", "", "| geometry | norm | energy | retained |", "|---|---:|---:|---:|"]
    L += [f"| {k} | {a:.2f}% | {b:.3f}% | {c:.2f}% |" for k, (a, b, c) in PAPER_STRENGTH.items()]
    a, b = PAIR
    if a in st and b in st:
        diff, ratio, reading = strength_comparison(st)
        L += ["", "| comparison (sec. 16.3) | value [95% CI] |", "|---|---|",
              f"| norm({a}) - norm({b}) | {S.fmt_interval(diff * 100, '+.2f')} points |",
              f"| norm ratio, ours | {S.fmt_interval(ratio, '.2f')} |", f"| norm ratio, the paper | {PAPER_RATIO:.2f} |",
              f"| the paper's ordering (exclude-self above the residual edit) | {reading} |"]
    return L


SIGN_COLS = ("n", "neg", "zero", "pos", "big", "sum", "degenerate")


def sign_stats(signs, weights) -> dict[str, tuple]:
    """Sec. 16.4 per form (joint, per head): ``{form: (sums, rows, reading)}``, ``sums`` the
    resampled sums of :data:`SIGN_COLS` (``[B + 1]``), ``rows`` the form's records and ``reading``
    that of the fraction positive's interval (non-positive in practice / signed / not decided)."""
    out = {}
    for form, g in signs.groupby("form", sort=False):
        s = _boot(g.groupby(["text", "window"], as_index=False)[list(SIGN_COLS)].sum(), SIGN_COLS, weights)
        _, lo, hi = S.interval(s["pos"] / s["n"])
        out[form] = (s, g, "**non-positive in practice**" if hi < NONPOSITIVE else "**signed**" if lo > SIGNED
                     else "not decided")
    return out


def _signs_section(signs, weights) -> list[str]:
    L = ["", "## Sign of the exclude-self diagonal shift (sec. 16.4)", "",
         "`Delta A_tt = -gamma_t`, `gamma_t = (c_t . v_t) / ||v_t||^2`, `c_t = o_t - A_tt v_t`, read inside the "
         "exclude-self removal forward pass (every layer but the first, `s_par = 0`) at every edited layer and "
         "position `t >= 1`; joint: one shift per token over the concatenated heads (the paper's form); per head: "
         "one per token and head. Reading: fraction positive with upper bound < "
         f"{NONPOSITIVE:g}: **non-positive in practice**; lower bound > {SIGNED:g}: **signed**; else not decided.", "",
         "| form | shifts | negative [95% CI] | zero | positive [95% CI] | mean shift [95% CI] | min | max | abs > 1 | reading |",
         "|---|---:|---|---:|---|---|---:|---:|---:|---|"]
    for form, (s, g, reading) in sign_stats(signs, weights).items():
        pos = s["pos"] / s["n"]
        L.append(f"| {form} | {int(s['n'][0])} | {_pct(s['neg'] / s['n'])} | {int(s['zero'][0])} | {_pct(pos)} | "
                 f"{S.fmt_interval(s['sum'] / s['n'], '+.4f')} | {g['min'].min():+.3f} | {g['max'].max():+.3f} | "
                 f"{int(s['big'][0])} | {reading} |")
    by_layer = signs.groupby(["form", "layer"])[["n", "pos"]].sum()
    forms = list(dict.fromkeys(signs.form))
    L += ["", "Fraction of positive shifts per layer:", "", "| layer | " + " | ".join(forms) + " |",
          "|---:|" + "---:|" * len(forms)]
    for layer in sorted(signs.layer.unique()):
        cells = [f"{by_layer.loc[(f, layer), 'pos'] / by_layer.loc[(f, layer), 'n']:.3f}" for f in forms]
        L.append(f"| {layer} | " + " | ".join(cells) + " |")
    return L


def build_strength_page(stem: str, data: Path) -> str:  # noqa: ARG001  (data: the pages' signature)
    manifest, frames = load_frames(stem)
    weights = S.window_bootstrap(frames["strength"])
    L = _head(manifest, stem, "16.3-16.4", "Applied strength of the edits and the diagonal shift's sign")
    L += _strength_section(strength_stats(frames["strength"], weights), manifest["model"]["sandwich_norm"])
    L += _signs_section(frames["signs"], weights)
    return "\n".join(L)


def _sum_over(st, labels):
    import numpy as np

    return np.sum([st[lab]["pooled"] for lab in labels], axis=0)


def atlas_share(st, labels) -> tuple:
    """Sec. 16.2 on one component's single-layer ``labels`` (layer order): ``(sum of the deltas, share
    of it in layers 0 and 1, reading)``, both ``[B + 1]``, the reading of the share's interval
    against :data:`MOST` (layers 0-1 carry most / do not carry most / not decided)."""
    total, early = _sum_over(st, labels), _sum_over(st, labels[:2])
    share = early / total
    _, lo, hi = S.interval(share)
    return total, share, "**carry most**" if lo > MOST else "**do not carry most**" if hi < MOST else "not decided"


def _atlas_inputs(stem: str) -> tuple:
    """``(manifest, st, texts, {component: its single-layer labels, layer order})`` of run ``stem``."""
    manifest, frames = load_frames(stem)
    weights = S.window_bootstrap(frames["records"])
    st = S.setting_stats(frames["records"], weights)
    n = manifest["model"]["n_layers"]
    labels = {c: [atlas_label(c, layer) for layer in range(n) if atlas_label(c, layer) in st] for c in COMPONENTS}
    return manifest, st, list(weights), labels


def build_residatlas_page(stem: str, data: Path) -> str:
    import numpy as np

    manifest, st, texts, by_component = _atlas_inputs(stem)
    m = manifest["model"]
    n = m["n_layers"]
    L = _head(manifest, stem, "16.2", "Where the residual edits' damage sits: single-layer atlas")
    sites = D.DATA / f"sites_{m['name']}.manifest.json"
    old = None
    if sites.is_file():
        _, old, _ = D.load_data(f"sites_{m['name']}")
        old = old[old.text.isin(texts)]
        old = S.setting_stats(old, S.window_bootstrap(old))
    level = S.BUDGET / n
    for c in COMPONENTS:
        labels = by_component[c]
        if not labels:
            continue
        total, share, reading = atlas_share(st, labels)
        above = holm({lab: float(np.mean(st[lab]["pooled"][1:] <= level)) for lab in labels})
        L += [f"## resid-{c}", "", "| statistic | value [95% CI] |", "|---|---|",
              f"| layers measured | {len(labels)} of {n} |",
              f"| sum of single-layer deltas | {S.fmt_interval(total)} |",
              f"| share of that sum in layers 0 and 1 | {S.fmt_interval(share, '+.2f')} |",
              f"| reading (sec. 16.2): layers 0-1 | {reading} |",
              f"| layers above an even share of the budget, {S.BUDGET}/{n} = {level:.4f} (Holm, one-sided, alpha "
              f"0.05) | {len(above)}: {', '.join(lab.split()[1] for lab in labels if lab in above) or 'none'} |"]
        if old is not None and f"resid-{c} all s_par=0" in old:
            L.append(f"| all-layer delta, sec. 14's `all` (`sites_{m['name']}`, same texts) | "
                     f"{S.fmt_interval(old[f'resid-{c} all s_par=0']['pooled'])} |")
        L += [""] + per_layer_table(st, labels, texts) + [""]
    L.append("Edits interact: the sum of single-layer deltas need not equal the all-layer delta.")
    return "\n".join(L)


def _value_records(model: str, rec):
    """Sec. 11.4's value-space draws on the windows and texts of ``rec``, labelled ``value <draw>``,
    and the largest NLL difference of the two runs' baseline records; ``(None, None)`` without data."""
    stem = f"instruments_{model}"
    if not (D.DATA / f"{stem}.manifest.json").is_file():
        return None, None
    _, old, _ = D.load_data(stem)
    keys = set(zip(rec.text, rec.window, strict=True))
    old = old[[k in keys for k in zip(old.text, old.window, strict=True)]]
    base_new = rec[rec.setting == "baseline"].set_index(["text", "window"]).nll
    base_old = old[old.setting == "baseline"].set_index(["text", "window"]).nll
    diff = float((base_new - base_old.reindex(base_new.index)).abs().max())
    draws = ["fixed s_par=0.5"] + [f"{d} seed={k}" for d, k in DRAWS]
    val = old[old.setting.isin(draws)].copy()
    val["setting"] = "value " + val.setting
    return val, diff


def v1_verdict(st, pairs) -> tuple:
    """Sec. 16.5's V1: ``(statistic [B + 1], verdict)``, the minimum over ``pairs`` ``(residual label,
    value label)`` of delta(resid) - delta(value), held if its interval lies above 0."""
    import numpy as np

    worst = np.min([st[r]["pooled"] - st[v]["pooled"] for r, v in pairs], axis=0)
    _, lo, hi = S.interval(worst)
    return worst, "**held**" if lo > 0 else "**failed**" if hi < 0 else "not decided"


def _random_inputs(stem: str) -> tuple:
    """``(manifest, both records, weights, st, pairs, value records, baseline difference)`` of run
    ``stem`` with sec. 11.4's value-space side (``pairs``: the measured (residual, value) labels)."""
    import pandas as pd

    manifest, frames = load_frames(stem)
    rec = frames["records"]
    val, diff = _value_records(manifest["model"]["name"], rec)
    both = rec if val is None else pd.concat([rec, val], ignore_index=True)
    weights = S.window_bootstrap(both)
    st = S.setting_stats(both, weights)
    pairs = [(random_label(c, f"{d} seed={k}"), f"value {d} seed={k}") for c in COMPONENTS for d, k in DRAWS]
    return manifest, both, weights, st, [(r, v) for r, v in pairs if r in st and v in st], val, diff


def build_residrandom_page(stem: str, data: Path) -> str:
    manifest, both, weights, st, pairs, val, diff = _random_inputs(stem)
    m = manifest["model"]
    L = _head(manifest, stem, "16.5", "Random per-layer draws: residual against value space")
    L += ["## Verdict (sec. 16.5)", "", "| claim | statistic | value [95% CI] | verdict |", "|---|---|---|---|"]
    if val is None or len(pairs) < 2 * len(DRAWS):
        L.append("| V1 | min over draws and components of delta(resid) - delta(value) | not measured | not decided |")
    else:
        worst, verdict = v1_verdict(st, pairs)
        L.append(f"| V1: value-space random per-layer scales are more stable than residual-space ones with the same "
                 f"draws ({cite(APPENDIX, '739519c')}, \"Random layerwise value-parallel scaling\") | min over "
                 f"{len(pairs)} (draw, component) pairs of delta(resid) - delta(value) | {S.fmt_interval(worst)} | {verdict} |")
        L += ["", f"Value-space side: sec. 11.4's records (`instruments_{m['name']}`) on the same windows; largest "
              f"baseline NLL difference between the two runs: {diff:.2e} nats per window."]
    L += ["", "| draw | resid-attn delta | resid-mlp delta | value delta | resid-attn - value | resid-mlp - value |",
          "|---|---|---|---|---|---|"]
    for draw in ["fixed s_par=0.5"] + [f"{d} seed={k}" for d, k in DRAWS]:
        cells = [S.fmt_interval(st[lab]["pooled"]) if lab in st else "not measured"
                 for lab in (random_label("attn", draw), random_label("mlp", draw), f"value {draw}")]
        for c in ("attn", "mlp"):
            r, v = random_label(c, draw), f"value {draw}"
            cells.append(S.fmt_interval(st[r]["pooled"] - st[v]["pooled"]) if r in st and v in st else "")
        L.append(f"| {draw} | " + " | ".join(cells) + " |")
    drawn = {s["label"]: s for s in manifest.get("settings", [])}
    L += ["", "## Every setting", ""]
    L += settings_table(st, corpus_ppl(both, weights), [lab for lab in st if lab != "baseline"], list(weights))
    if drawn:
        L += ["", "Mean `s_par` over the edited layers: " + "; ".join(
            f"{lab} {s['s_par']:.3f}" for lab, s in drawn.items() if s.get("s_par") is not None) + "."]
    return "\n".join(L)


def verdict_rows(prefix: str, stem: str) -> list[tuple[str, str, str]]:
    """``[(id, statistic, verdict or reading)]`` of a sec. 16 run, as its page states them (the
    closing table, :mod:`studies.claims_table`): ``strength`` gives sec. 16.3's comparison and sec.
    16.4's sign reading per form, ``residatlas`` sec. 16.2's share per component, ``residrandom``
    sec. 16.5's V1. Readings carry no verdict on the paper: ``no rule (reading: ...)``."""
    if prefix == "strength":
        manifest, frames = load_frames(stem)
        weights = S.window_bootstrap(frames["strength"])
        st = strength_stats(frames["strength"], weights)
        rows = []
        if all(e in st for e in PAIR):
            diff, ratio, reading = strength_comparison(st)
            rows.append(("strength (sec. 16.3)", f"norm(exclude-self joint) - norm(resid-attn), skip0 s_par=0 = "
                         f"{S.fmt_interval(diff * 100, '+.2f')} points; ratio {S.fmt_interval(ratio, '.2f')} "
                         f"(the paper: {PAPER_RATIO:.2f})", f"no rule (reading: the paper's ordering {reading})"))
        for form, (sums, _, reading) in sign_stats(frames["signs"], weights).items():
            rows.append((f"sign (sec. 16.4), {form}", f"fraction of positive shifts = {_pct(sums['pos'] / sums['n'])}",
                         f"no rule (reading: {reading})"))
        return rows
    if prefix == "residatlas":
        _, st, _, by_component = _atlas_inputs(stem)
        return [(f"atlas (sec. 16.2), resid-{c}", f"share of the summed single-layer deltas in layers 0-1 = "
                 f"{S.fmt_interval(share, '+.2f')} ({len(labels)} layers)", f"no rule (reading: layers 0-1 {reading})")
                for c, labels in by_component.items() if labels for _, share, reading in [atlas_share(st, labels)]]
    _, _, _, st, pairs, val, _ = _random_inputs(stem)
    if val is None or len(pairs) < 2 * len(DRAWS):
        return [("V1 (sec. 16.5)", "not measured", "not decided")]
    worst, verdict = v1_verdict(st, pairs)
    return [("V1 (sec. 16.5)", f"min over {len(pairs)} (draw, component) pairs of delta(resid) - delta(value) = "
             f"{S.fmt_interval(worst)}", verdict)]


__all__ = ["atlas_share", "build_residatlas_page", "build_residrandom_page", "build_strength_page", "load_frames",
           "sign_stats", "stems", "strength_comparison", "v1_verdict", "verdict_rows"]
