"""The claims page of a run (``docs/results/<stem>.md``, protocol sec. 4): a pure function of the
committed data (:mod:`studies.claims.data`), with the statistics and verdict rules of
:mod:`studies.claims.stats`."""

from __future__ import annotations

import math

from studies.claims.data import load_data
from studies.claims.stats import (
    EXCL_GRID,
    SEED,
    B,
    claim_verdicts,
    fmt_interval,
    pct_format,
    setting_stats,
    window_bootstrap,
)


def _header_lines(stem: str, manifest: dict, rec, st, texts) -> list[str]:
    """The page's title, provenance (data, model, texts) and the statistics' description."""
    m = manifest["model"]
    tokens = {
        t: int(rec[(rec.text == t) & (rec.setting == "baseline")].tokens.sum()) for t in texts
    }
    subset = "" if "value-exclusive s_par=0.25" in st else ", the four removals only"
    return [
        f"# The seed's claims on {m['name']} ({manifest['seq_len']}-token windows{subset}, "
        + ", ".join(f"`{t}`" for t in texts)
        + ")",
        "",
        "Built by `python scripts/claims.py build` from the committed data "
        f"`docs/results/data/{stem}.*` alone (protocol: [protocol.md](protocol.md)); do not edit by hand.",
        "",
        (
            f"- Data made by `{manifest['command']}` at commit `{manifest['commit']}`, {manifest['date']}, "
            f"{manifest['machine']}, {manifest['seconds']:.0f} s"
            if "commits" not in manifest
            else "- Data stitched from "
            + str(len(manifest["commits"]))
            + " runs of the same settings: "
            + "; ".join(
                f"`{t}` by `{manifest['texts'][t]['command']}` at commit `{manifest['texts'][t]['commit']}` "
                f"({manifest['texts'][t]['seconds']:.0f} s)"
                for t in texts
            )
            + f"; last {manifest['date']}, {manifest['machine']}"
        )
        + ("" if manifest["complete"] else " (**incomplete run**: the texts below only)")
        + ".",
        f"- Model: `{m['name']}` ({m['architecture']}, {m['n_layers']} layers, {m['n_heads']} query / "
        f"{m['n_kv_heads']} KV heads{', sandwich norms' if m['sandwich_norm'] else ''}), **dequantised** from "
        f"`{m['source_file']}` ({m['quantisation']}, sha256 `{m['source_sha256'][:16]}...`) to float32 "
        f"(model.safetensors sha256 `{(m['safetensors_sha256'] or 'n/a')[:16]}...`), unprocessed weights, "
        f"{m['lane']} lane. It is a 4-bit model's numbers, not the original float checkpoint's.",
        "- Texts: "
        + "; ".join(
            f"`{t}` ({manifest['texts'][t]['description']}, sha256 "
            f"`{manifest['texts'][t]['sha256'][:12]}`): {manifest['texts'][t]['windows']} windows, "
            f"{tokens[t]} predicted tokens"
            for t in texts
        )
        + ".",
        f"- Every edit on all layers and heads, no BOS exemption. Intervals: 95% percentile bootstrap over windows, "
        f"stratified by text ({B} resamples, seed {SEED}), the same resamples for every setting (paired). "
        "`delta` is nats per predicted token (token-weighted); `ppl` is the per-window perplexity averaged over "
        "the windows of a text, as a relative change (not the paper's statistic: lm-eval's is corpus-level); "
        "`corpus ppl` is the relative change of `exp` of the token-weighted mean NLL, pooled over the texts "
        "(protocol sec. 9.5); `spread` is the range over texts.",
        "",
    ]


def _row(st, texts, label):
    d = st[label]
    per = [float(d[t][0]) for t in texts if t in d]
    return (
        f"| {label} | {fmt_interval(d['pooled'])} | "
        + " | ".join(f"{float(d[t][0]):+.3f}" for t in texts)
        + f" | {min(per):+.3f} .. {max(per):+.3f} | {fmt_interval(d['pooled:ppl_rel'] * 100, pct_format(d['pooled:ppl_rel']))}% | "
        f"{_corpus_ppl_pct(d['pooled'][0])} | {float(d['pooled:kl'][0]):.3f} | {float(d['pooled:top1'][0]):.3f} |"
    )


def _edit_tables(st, texts, sandwich_norm: bool) -> list[str]:
    """The removals, exclude-self and perpendicular tables (rows only for settings the run has),
    with their notes."""
    head = (
        "| setting | delta pooled [95% CI] | "
        + " | ".join(f"delta `{t}`" for t in texts)
        + " | spread | ppl change [95% CI] | corpus ppl change | KL | top-1 agree |"
    )
    sep = "|---|---|" + "---:|" * len(texts) + "---|---|---:|---:|---:|"
    ex = [f"value-exclusive s_par={s:g}" for s in EXCL_GRID]
    row = lambda label: _row(st, texts, label)  # noqa: E731
    L: list[str] = []
    L += ["", "## Removals (s_par = 0 unless named), all layers", "", head, sep]
    for lab in [
        "value-exclusive s_par=0",
        "value-full s_par=0",
        "value-exclusive-concat s_par=0",
        "value-full-concat s_par=0",
        "resid-attn s_par=0",
        "resid-mlp s_par=0",
        "hard-diag",
    ]:
        if lab in st:
            L.append(row(lab))
    if "value-full-concat s_par=0" in st:
        L += [
            "",
            "`-concat`: the same edit with the projection on all heads' concatenated outputs against the "
            "concatenated own values (the per-head question the paper's revision leaves open).",
        ]
    if any(lab in st for lab in ex[1:]):
        L += ["", "## Exclude-self value edits over s_par", "", head, sep]
        L += [row(lab) for lab in ex if lab in st]
    perp = [
        "value s_perp=0",
        "resid-attn s_perp=0",
        "resid-mlp s_perp=0",
        "value-exclusive matched-norm perp",
        "value-full matched-norm perp",
        "resid-attn matched-norm perp",
        "resid-mlp matched-norm perp",
        "value-full s_par=2",
    ]
    if any(lab in st for lab in perp):
        L += [
            "",
            "## Perpendicular edits",
            "",
            "Matched scale: `s_perp = 0` (remove the perpendicular part). Matched norm: "
            "`s_perp = 1 - k` with `k` the text's energy ratio `sqrt(sum ||u_par||^2 / sum ||u_perp||^2)` per layer "
            "(residual) or per layer and head (value; exclusive or full aggregate), so that the perpendicular edit "
            "moves the update by the same energy as the parallel removal (`k > 1` gives `s_perp < 0`).",
            "",
            head,
            sep,
        ]
        L += [row(lab) for lab in perp if lab in st]
    if sandwich_norm and "value-full s_par=2" in st:
        L += [
            "",
            "Sandwich norms: the post-attention RMSNorm removes a common scale of the attention output and there "
            "is no `o_proj` bias, so for the **full-aggregate** value edit `s_par = 2` is the same edit as "
            "`s_perp = 0.5` (see [method](../method.md)); such pairs are not counted as parallel-versus-perpendicular "
            "evidence. The twin does not hold for exclude-self: its self message is not scaled (protocol sec. 9.5).",
        ]
    return L


def _depth_lines(prof, manifest: dict, texts) -> list[str]:
    """The depth profile table (mean abs cos(u, r) per layer, BOS excluded) and its random level."""
    L: list[str] = []
    pr = prof[prof.table == "residual"]
    L += [
        "",
        "## Depth profile (BOS excluded): mean abs cos(u, r) per layer",
        "",
        "| layer | "
        + " | ".join(f"attn `{t}`" for t in texts)
        + " | "
        + " | ".join(f"mlp `{t}`" for t in texts)
        + " |",
        "|---:|" + "---:|" * (2 * len(texts)),
    ]
    rnd = math.exp(
        math.lgamma(prof_d := _d_model(manifest) / 2) - math.lgamma(prof_d + 0.5)
    ) / math.sqrt(math.pi)
    for layer in sorted(pr.layer.unique()):
        cells = []
        for comp in ("attn", "mlp"):
            for t in texts:
                r = pr[(pr.text == t) & (pr.layer == layer) & (pr.component == comp)]
                cells.append(f"{float(r.par_frac_mean.iloc[0]):.3f}" if len(r) else "")
        L.append(f"| {int(layer)} | " + " | ".join(cells) + " |")
    L += [
        "",
        f"Random-direction level of E abs cos in d_model = {_d_model(manifest)}: {rnd:.3f}. "
        "No anisotropy control (a mismatched token's stream) in this run.",
        "",
    ]
    return L


def build_page(stem: str) -> str:
    """The claims page of run ``stem`` (protocol sec. 4), from its committed data alone."""
    manifest, rec, prof = load_data(stem)
    weights = window_bootstrap(rec)
    st = setting_stats(rec, weights)
    texts = list(weights)
    L = _header_lines(stem, manifest, rec, st, texts)
    verdicts, e_rows = claim_verdicts(st, prof, texts)
    L += [
        "## Verdicts (rules in [protocol.md](protocol.md))",
        "",
        "| claim | test | statistic [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    L += [f"| {c} | {t} | {s} | {v} |" for c, t, s, v in verdicts]
    L += _edit_tables(st, texts, manifest["model"]["sandwich_norm"])
    L += [
        "",
        "## Parallel share tracks A_tt (claim E)",
        "",
        "| text | heads | Spearman(A_tt mean, mean abs cos(o_t, v_t)) [95% CI, bootstrap over heads] |",
        "|---|---:|---|",
    ]
    L += [f"| `{t}` | {n} | {fmt_interval(r, '+.2f')} |" for t, r, n in e_rows]
    L += _depth_lines(prof, manifest, texts)
    return "\n".join(L)


def _corpus_ppl_pct(delta_nats: float) -> str:
    """Corpus-level perplexity change from the pooled token-weighted NLL change, in percent."""
    v = math.expm1(float(delta_nats)) * 100
    return f"{v:+.1f}%" if abs(v) < 1000 else f"{v:+.3g}%"


def _d_model(manifest) -> int:
    return {"smollm2-135m": 576, "gemma-3-270m": 640}.get(manifest["model"]["name"], 0)
