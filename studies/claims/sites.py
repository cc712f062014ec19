"""Protocol sec. 14: where the residual edits' damage comes from. The page is built from committed
data alone.

    # measure (the claims study's runner, its own data stem; refuses a dirty tree)
    python -m studies run claims --model smollm2-135m --settings sites --windows 16 --batch-size 8

    # page: built by `python -m studies build` (make results): docs/results/sites_<model>.md

Data files: ``docs/results/data/sites_<model>.{records,profile}.csv`` and its ``manifest.json``,
the claims study's layout (one record per text, window and setting).
"""

from __future__ import annotations

from pathlib import Path

from studies.claims import data as D
from studies.claims import stats as S
from studies.claims.amend import page_inputs, provenance, settings_table

COMPONENTS = ("mlp", "attn")
CONVENTIONS = ("all", "spare0", "skip0", "skip0 spare0")
#: protocol sec. 14.3: a convention "explains" the gap when its delta's upper bound is at most this
EXPLAINS_NATS = 0.5
#: ... and "accounts for most" of it when the upper bound of its ratio to ``all`` is below this
MOST = 0.5
#: the paper's residual-MLP removal, Qwen3-0.6B on C4 (sections/appendix.tex@739519c,
#: tab:mlp-internal-carrier)
PAPER_RESID_MLP = 0.1165
#: earlier runs that measured the ``all`` settings on the same first windows: (stem prefix, label)
REPEATS = {"resid-mlp all s_par=0": ("instruments", "resid-mlp s_par=0"),
           "resid-attn all s_par=0": ("amend", "resid-attn all s_par=0")}


def label(component: str, convention: str) -> str:
    """The setting's label in the data (``studies.claims.run.sites_settings``)."""
    return f"resid-{component} {convention} s_par=0"


def reading(delta, ratio) -> str:
    """Sec. 14.3's reading of one convention from its bootstrap arrays (index 0: the estimate)."""
    _, _, hi = S.interval(delta)
    _, r_lo, r_hi = S.interval(ratio)
    if hi <= EXPLAINS_NATS:
        return "**explains**"
    if r_hi < MOST:
        return "**accounts for most**"
    if r_lo > MOST:
        return "does not explain"
    return "not decided"


def _readings(st) -> list[str]:
    L = ["## Readings (protocol sec. 14.3)", "",
         f"`R` = the convention's delta / the `all` delta, inside each resample. **explains**: delta's upper "
         f"bound <= {EXPLAINS_NATS} nats; **accounts for most**: `R`'s upper bound < {MOST}; does not explain: "
         f"`R`'s lower bound > {MOST}; else not decided. The paper's residual-MLP removal: "
         f"+{PAPER_RESID_MLP} nats (Qwen3-0.6B, C4; `sections/appendix.tex`@`739519c`, `tab:mlp-internal-carrier`).",
         "", "| component | convention | delta [95% CI] | R [95% CI] | reading |", "|---|---|---|---|---|"]
    for c in COMPONENTS:
        base = st.get(label(c, "all"))
        for conv in CONVENTIONS[1:]:
            d = st.get(label(c, conv))
            if base is None or d is None:
                L.append(f"| {c} | {conv} | not measured | | not decided |")
                continue
            ratio = d["pooled"] / base["pooled"]
            L.append(f"| {c} | {conv} | {S.fmt_interval(d['pooled'])} | {S.fmt_interval(ratio, '.3f')} | "
                     f"{reading(d['pooled'], ratio)} |")
    return L


def _repeat_check(rec, model: str, data: Path) -> list[str]:
    """Sec. 14.1: a setting measured before on the same windows must give the same records."""
    L = []
    for lab, (prefix, old_label) in REPEATS.items():
        stem = f"{prefix}_{model}"
        if not (data / f"{stem}.manifest.json").is_file():
            continue
        _, old, _ = D.load_data(stem)
        keys = ["text", "window"]
        a = rec[rec.setting == lab].set_index(keys)
        b = old[old.setting == old_label].set_index(keys)
        common = a.index.intersection(b.index)
        if len(common):
            diff = float((a.loc[common, "nll"] - b.loc[common, "nll"]).abs().max())
            L.append(f"| {lab} | `{stem}` {old_label} | {len(common)} | {diff:.2e} |")
    if not L:
        return []
    return ["", "## Repeats (sec. 14.1)", "",
            "| setting | earlier run | windows in common | max abs NLL difference (nats per window) |",
            "|---|---|---:|---:|", *L]


def build_sites_page(stem: str, data: Path) -> str:
    manifest, rec, st, ppl, texts, tokens = page_inputs(stem)
    m = manifest["model"]
    L = [f"# Where the residual edits' damage comes from on {m['name']} (protocol sec. 14)", ""]
    L += provenance(manifest, stem, texts, tokens, section="14", builder="python -m studies build")
    L += _readings(st)
    L += ["", "## Every setting", ""]
    L += settings_table(st, ppl, [label(c, conv) for c in COMPONENTS for conv in CONVENTIONS], texts)
    L += _repeat_check(rec, m["name"], data)
    return "\n".join(L)


def stems(data: Path) -> list[str]:
    """The ``sites_<model>`` stems with committed data."""
    return sorted(p.name[: -len(".manifest.json")] for p in data.glob("sites_*.manifest.json"))
