"""The seed's claims on a real model, as committed data and pages built from it alone.

Two steps (the protocol, with every statistic, budget and verdict rule, is
``docs/results/protocol.md``; it was written before these runs):

    # measure: per-window records of every all-layer edit on three held-out texts, plus the
    # per-head value-space profile; refuses a dirty tl_directional/ or scripts/
    python scripts/claims.py run --model smollm2-135m --windows 32 --seq-len 128 --batch-size 8

    # build every claims page from docs/results/data/ alone (make results); --check compares
    # with the pages on disk and fails on any difference (the suite runs it)
    python scripts/claims.py build [--check]

Data files (``docs/results/data/claims_<model>.*``): ``records.csv`` (text, window, setting,
tokens, nll, base_nll, kl, agree: sums over the window's predicted tokens), ``profile.csv``
(per-head value-space means and per-layer residual energy ratios, BOS excluded) and
``manifest.json`` (command, commit, model source file / quantisation / sha256, texts and their
sha256, settings, per-file sha256). A page is a pure function of those files.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys

try:
    import _common  # scripts/ is sys.path[0] when a script runs
except ImportError:  # loaded by file path (the tests): through the package
    from scripts import _common

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = _common.ROOT

DATA = ROOT / "docs" / "results" / "data"
PAGES = ROOT / "docs" / "results"

# The study's parts, one module per job (re-exported: the other claims scripts use them as C.*):
# measuring (claims_run), statistics and verdicts (claims_stats); this module reads the data
# and renders the pages.
from claims_run import (  # noqa: E402, F401
    HEADLINE,
    SOURCES,
    TEXTS,
    _concat_hooks,
    run,
    run_header,
    settings,
)
from claims_stats import (  # noqa: E402, F401
    BUDGET,
    BUDGET_TO3,
    EXCL_GRID,
    SEED,
    B,
    _boot,
    _ci,
    _fmt,
    _pct_format,
    _stats,
    _verdict_sign,
    _verdict_threshold,
    _verdict_upper,
    claim_verdicts,
)

sha256_bytes, git_state, write_pages = _common.sha256_bytes, _common.git_state, _common.write_pages


class DataError(RuntimeError):
    """A committed data file is missing, corrupt, or from another model."""


# ---------------------------------------------------------------------------
# build (pure function of the data)
# ---------------------------------------------------------------------------


def _csv(df) -> bytes:
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.10g", lineterminator="\n")
    return buf.getvalue().encode()


def _write_data(stem, rec, prof, manifest):
    files = {f"{stem}.records.csv": _csv(rec), f"{stem}.profile.csv": _csv(prof)}
    _common.write_data(DATA, files, manifest, f"{stem}.manifest.json")
    print(f"wrote {DATA / stem}.* ({len(rec)} records)", flush=True)


def load_data(stem: str):
    import pandas as pd

    mpath = DATA / f"{stem}.manifest.json"
    manifest = _common.read_data_manifest(mpath, str(mpath.relative_to(ROOT)), DataError)
    frames = {}
    for name, want in manifest.get("files", {}).items():
        p = DATA / name
        b = _common.checked_bytes(p, want, str(p.relative_to(ROOT)), mpath.name, DataError)
        frames[name.split(".")[-2]] = pd.read_csv(io.BytesIO(b))
    m = manifest["model"]
    from tl_directional.model.load.catalog import REAL_MODELS

    if m["name"] in REAL_MODELS and REAL_MODELS[m["name"]].source_sha256 != m["source_sha256"]:
        raise DataError(
            f"{mpath.relative_to(ROOT)}: model source sha256 {m['source_sha256'][:12]} is not the "
            f"catalogue's {m['name']} ({REAL_MODELS[m['name']].source_sha256[:12]}): data from another model"
        )
    if any("+dirty" in t.get("commit", "") for t in manifest["texts"].values()) or "+dirty" in manifest["commit"]:
        raise DataError(
            f"{mpath.relative_to(ROOT)}: made from a dirty tree ({manifest['commit']}); rerun from a clean one"
        )
    return manifest, frames["records"], frames["profile"]


def build_page(stem: str) -> str:

    manifest, rec, prof = load_data(stem)
    weights = _boot(rec)
    st = _stats(rec, weights)
    texts = list(weights)
    m = manifest["model"]
    tokens = {
        t: int(rec[(rec.text == t) & (rec.setting == "baseline")].tokens.sum()) for t in texts
    }
    subset = "" if "value-exclusive s_par=0.25" in st else ", the four removals only"
    L = [
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

    def row(label):
        d = st[label]
        per = [float(d[t][0]) for t in texts if t in d]
        return (
            f"| {label} | {_fmt(d['pooled'])} | "
            + " | ".join(f"{float(d[t][0]):+.3f}" for t in texts)
            + f" | {min(per):+.3f} .. {max(per):+.3f} | {_fmt(d['pooled:ppl_rel'] * 100, _pct_format(d['pooled:ppl_rel']))}% | "
            f"{_corpus_ppl_pct(d['pooled'][0])} | {float(d['pooled:kl'][0]):.3f} | {float(d['pooled:top1'][0]):.3f} |"
        )

    head = (
        "| setting | delta pooled [95% CI] | "
        + " | ".join(f"delta `{t}`" for t in texts)
        + " | spread | ppl change [95% CI] | corpus ppl change | KL | top-1 agree |"
    )
    sep = "|---|---|" + "---:|" * len(texts) + "---|---|---:|---:|---:|"
    verdicts, e_rows = claim_verdicts(st, prof, texts)
    ex = [f"value-exclusive s_par={s:g}" for s in EXCL_GRID]
    L += [
        "## Verdicts (rules in [protocol.md](protocol.md))",
        "",
        "| claim | test | statistic [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    L += [f"| {c} | {t} | {s} | {v} |" for c, t, s, v in verdicts]
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
    if m["sandwich_norm"] and "value-full s_par=2" in st:
        L += [
            "",
            "Sandwich norms: the post-attention RMSNorm removes a common scale of the attention output and there "
            "is no `o_proj` bias, so for the **full-aggregate** value edit `s_par = 2` is the same edit as "
            "`s_perp = 0.5` (see [method](../method.md)); such pairs are not counted as parallel-versus-perpendicular "
            "evidence. The twin does not hold for exclude-self: its self message is not scaled (protocol sec. 9.5).",
        ]
    L += [
        "",
        "## Parallel share tracks A_tt (claim E)",
        "",
        "| text | heads | Spearman(A_tt mean, mean abs cos(o_t, v_t)) [95% CI, bootstrap over heads] |",
        "|---|---:|---|",
    ]
    L += [f"| `{t}` | {n} | {_fmt(r, '+.2f')} |" for t, r, n in e_rows]
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
    return "\n".join(L)


def _corpus_ppl_pct(delta_nats: float) -> str:
    """Corpus-level perplexity change from the pooled token-weighted NLL change, in percent."""
    v = math.expm1(float(delta_nats)) * 100
    return f"{v:+.1f}%" if abs(v) < 1000 else f"{v:+.3g}%"


def _d_model(manifest) -> int:
    return {"smollm2-135m": 576, "gemma-3-270m": 640}.get(manifest["model"]["name"], 0)


SUMMARY_START, SUMMARY_END = "<!-- claims-summary -->", "<!-- /claims-summary -->"


def summary_block(stems, depth=(), training=(), amend=(), passes=(), accuracy=(), instruments=()) -> str:
    """The verdict table of every run, for docs/results.md (between the two markers)."""
    import accuracy_claims
    import amend_claims
    import depth_claims
    import training_claims

    L = [SUMMARY_START, "", "| run | claim | statistic [95% CI] | verdict |", "|---|---|---|---|"]
    for stem in amend:
        done = "" if json.loads((DATA / f"{stem}.manifest.json").read_text())["complete"] else " (incomplete)"
        for claim, stat, verdict in amend_claims.verdict_rows(stem, DATA):
            L.append(f"| [{stem}](results/{stem}.md){done} | {claim} | {stat} | {verdict} |")
    for stem in accuracy:
        for claim, stat, verdict in accuracy_claims.verdict_rows(stem, DATA):
            L.append(f"| [{stem}](results/{stem}.md) | {claim} | {stat} | {verdict} |")
    for stem in instruments:  # protocol sec. 11
        import instruments_claims

        done = "" if json.loads((DATA / f"{stem}.manifest.json").read_text())["complete"] else " (incomplete)"
        for claim, stat, verdict in instruments_claims.verdict_rows(stem, DATA):
            L.append(f"| [{stem}](results/{stem}.md){done} | {claim} | {stat} | {verdict} |")
    for stem in training:
        for claim, stat, verdict in training_claims.verdict_rows(stem, DATA):
            L.append(f"| [claims_{stem}](results/claims_{stem}.md) | {claim} | {stat} | {verdict} |")
    for stem in passes:
        import pass_training

        for claim, stat, verdict in pass_training.verdict_rows(stem, DATA):
            L.append(f"| [{stem}](results/{stem}.md) | {claim} | {stat} | {verdict} |")
    for stem in depth:
        for claim, stat, verdict in depth_claims.verdict_rows(stem, DATA):
            L.append(f"| [{stem}](results/{stem}.md) | {claim} | {stat} | {verdict} |")
    compression = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("compression_*.manifest.json")
                         if not p.name[len("compression_"):].split(".")[0].count("_"))
    if compression:
        import compression_claims

        for stem in compression:
            page = compression_claims.build_page(stem)
            row = next(ln for ln in page.splitlines() if "(**pre-registered**)" in ln)
            cells = [c.strip() for c in row.strip("|").split(" | ")]
            L.append(
                f"| [claims_{stem}](results/claims_{stem}.md) | 3: perpendicular error ranks compression damage "
                f"better than parallel error, 1-cos and MSE ({cells[0].split(' (')[0]}) | T = {cells[1]} | {cells[-1]} |"
            )
            amended = [ln for ln in page.split("## Amended reading", 1)[-1].splitlines()
                       if ln.startswith("| attn, per-token mean |")]
            if amended:
                cells = [c.strip() for c in amended[0].strip("|").split(" | ")]
                L.append(
                    f"| [claims_{stem}](results/claims_{stem}.md) | 3 (amended reading, sec. 9.5): perpendicular "
                    f"error ranks compression damage better than parallel error | rho_perp - rho_par = {cells[1]} | "
                    f"{cells[2]} |"
                )
    for stem in stems:
        manifest = json.loads((DATA / f"{stem}.manifest.json").read_text())
        page = build_page(stem)
        rows = [
            ln
            for ln in page.split("\n## Verdicts", 1)[1].split("\n\n", 2)[1].splitlines()[2:]
            if ln.startswith("|")
        ]
        done = "" if manifest["complete"] else " (incomplete)"
        for ln in rows:
            cells = [c.strip() for c in ln.strip("|").split(" | ")]
            L.append(
                f"| [{stem}](results/{stem}.md){done} | {cells[0]} | {cells[2]} | {cells[3]} |"
            )
    L += ["", SUMMARY_END]
    return "\n".join(L)


def build(check: bool) -> int:
    import accuracy_claims
    import amend_claims
    import compression_claims
    import depth_claims
    import instruments_claims
    import paper_vs_ours
    import pass_training
    import training_claims

    amend = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("amend_*.manifest.json"))
    atlas = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("atlas_*.manifest.json"))
    accuracy = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("accuracy_*.manifest.json"))
    instruments = instruments_claims.stems(DATA)

    stems = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("claims_*.manifest.json"))
    depth = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("depth_*.manifest.json"))
    training = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("training_*.manifest.json"))
    passes = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("pass8m*.manifest.json"))
    if not stems:
        print(f"error: no claims data under {DATA.relative_to(ROOT)}", file=sys.stderr)
        return 2
    pages = {}
    try:
        for stem in stems:
            pages[PAGES / f"{stem}.md"] = build_page(stem) + "\n"
        for stem in depth:
            pages[PAGES / f"{stem}.md"] = depth_claims.build_page(stem, DATA) + "\n"
        for stem in training:
            pages[PAGES / f"claims_{stem}.md"] = training_claims.build_page(stem, DATA) + "\n"
        for stem in amend:
            pages[PAGES / f"{stem}.md"] = amend_claims.build_amend_page(stem, DATA) + "\n"
        for stem in passes:
            pages[PAGES / f"{stem}.md"] = pass_training.build_page(stem, DATA) + "\n"
            for name, svg in pass_training.build_figures(stem, DATA).items():
                pages[PAGES / name] = svg
        for stem in atlas:
            pages[PAGES / f"{stem}.md"] = amend_claims.build_atlas_page(stem, DATA) + "\n"
        for stem in accuracy:  # protocol sec. 9.4; a page only where its data exist
            pages[PAGES / f"{stem}.md"] = accuracy_claims.build_page(stem, DATA) + "\n"
        for stem in instruments:  # protocol sec. 11; a page only where its data exist
            pages[PAGES / f"{stem}.md"] = instruments_claims.build_page(stem, DATA) + "\n"
        index = PAGES.parent / "results.md"
        if index.is_file():
            text = index.read_text()
            if SUMMARY_START in text and SUMMARY_END in text:
                head, rest = text.split(SUMMARY_START, 1)
                text = head + summary_block(stems, depth, training, amend, passes, accuracy,
                                            instruments) + rest.split(SUMMARY_END, 1)[1]
            pages[index] = text
        lead = paper_vs_ours.block(DATA)
        for path in (index, ROOT / "README.md"):
            text = pages.get(path) or (path.read_text() if path.is_file() else "")
            if paper_vs_ours.START in text and paper_vs_ours.END in text:
                head, rest = text.split(paper_vs_ours.START, 1)
                pages[path] = head + lead + rest.split(paper_vs_ours.END, 1)[1]
    except (DataError, depth_claims.C.DataError, compression_claims.DataError, training_claims.DataError,
            pass_training.DataError, accuracy_claims.AccuracyDataError,
            instruments_claims.InstrumentsDataError) as e:  # each script's own class
        print(f"error: {e}", file=sys.stderr)
        return 2
    return write_pages(pages, check, ROOT, "make results")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, choices=[*sorted(SOURCES), "default"],
                   help="default (the bundled model): --settings accuracy / instruments smoke runs only")
    r.add_argument("--texts", nargs="+", default=list(TEXTS), choices=list(TEXTS))
    r.add_argument("--windows", type=int, default=32)
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument(
        "--settings",
        choices=("all", "headline", "amend", "atlas", "accuracy", "instruments"),
        default="all",
        help="amend / atlas / accuracy: protocol sec. 9's grids; instruments: sec. 11's; written as "
        "<settings>_<model>.*",
    )
    r.add_argument("--data-dir", default="",
                   help="accuracy / instruments only: write the data files here (smoke runs)")
    r.add_argument(
        "--tag",
        default="",
        help="a suffix of the data files' names, for a run split over processes",
    )
    r.add_argument(
        "--allow-dirty",
        action="store_true",
        help="for smoke runs only: the builder refuses such data",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="keep the texts an earlier run of the same data files finished and run the rest",
    )
    b = sub.add_parser("build")
    b.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    args.cli = argv is None
    if args.cmd == "run" and args.settings == "accuracy":
        import accuracy_run

        return accuracy_run.run_accuracy(args)
    if args.cmd == "run" and args.settings == "instruments":
        import instruments_run

        return instruments_run.run_instruments(args)
    if args.cmd == "run" and args.model not in SOURCES:
        ap.error(f"--model {args.model}: only --settings accuracy / instruments run on it; choose one of {sorted(SOURCES)}")
    return run(args) if args.cmd == "run" else build(args.check)


if __name__ == "__main__":
    _common.run_main(main)
