"""The accuracy page (protocol sec. 9.4), a pure function of the committed per-item data
``docs/results/data/accuracy_<model>.*`` (written by ``claims.py run --settings accuracy``)."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from studies import common

N_RESAMPLES, SEED = 2000, 0
WITHIN, WORSE = 1.5, 3.0
#: sec. 9.4's rule families: exclude-self within 1.5 points; V-Para and hard diagonal removal >= 3 worse
WITHIN_FAMILY = tuple(
    f"value-exclusive{f} {ls} s_par={s}"
    for s in ("0", "0.5")
    for f in ("-joint", "")
    for ls in ("all", "skip0")
)
WORSE_FAMILY = ("value-full-joint skip0 s_par=0", "hard-diag skip0")


class AccuracyDataError(RuntimeError):
    """A committed accuracy data file is missing, corrupt, or made from a dirty tree."""


def load(stem: str, data: Path):
    import pandas as pd

    mpath = data / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, mpath.name, AccuracyDataError)
    if "+dirty" in manifest["commit"] or any(
        "+dirty" in t.get("commit", "") for t in manifest["texts"].values()
    ):
        raise AccuracyDataError(
            f"{mpath.name}: made from a dirty tree ({manifest['commit']}); rerun from a clean one"
        )
    got = {}
    for name, want in manifest["files"].items():
        got[name] = common.checked_bytes(data / name, want, name, mpath.name, AccuracyDataError)
    rec = pd.read_csv(io.BytesIO(got[f"{stem}.records.csv"]))
    items = json.loads(got[f"{stem}.items.json"])
    return manifest, rec, items


INCOMPLETE = "not decided (suite incomplete)"


#: the item kinds in the page's column order (``cloze-hard``: sec. 9.7's hard distractors)
KINDS = ("cloze", "cloze-hard", "continuation")


def is_fair(suite: dict | None) -> bool:
    """Whether a run's suite is sec. 9.7's (hard distractors, macro average over text x kind,
    window-cluster bootstrap); data from before it keeps sec. 9.4's pooled item bootstrap."""
    return bool(suite) and suite.get("bootstrap") == "window-cluster"


def drop_of(rec, lab: str, fair: bool):
    """Baseline minus ``lab`` accuracy (PairedDrop): sec. 9.7's macro average over text x kind
    with the window-cluster bootstrap stratified by text (``fair``), else sec. 9.4's pooled item
    bootstrap; 2,000 resamples, seed 0, the same for every setting."""
    import torch

    from tl_directional.core.paired import cluster_paired_drop, paired_drop

    base, edit = torch.tensor(rec["baseline"].to_numpy()), torch.tensor(rec[lab].to_numpy())
    if not fair:
        return paired_drop(base, edit, N_RESAMPLES, SEED)
    text = torch.tensor(rec["text"].astype("category").cat.codes.to_numpy(), dtype=torch.long)
    window = torch.tensor(rec["window"].to_numpy(), dtype=torch.long)
    kind = torch.tensor([KINDS.index(k) for k in rec["kind"]], dtype=torch.long)
    clusters = text * (int(window.max()) + 1) + window
    return cluster_paired_drop(base, edit, clusters, text, text * len(KINDS) + kind, N_RESAMPLES, SEED)


def verdicts(rec, complete: bool = True, fair: bool = False) -> list[tuple[str, str, object, str]]:
    """``[(setting, rule, PairedDrop, verdict)]`` on all items (:func:`drop_of`: pooled over
    texts and kinds, or ``fair``, sec. 9.7's macro average with the window-cluster bootstrap), then
    Holm over each rule's family (the count line of the page). While the run has not measured
    every text (``complete`` false in the manifest) a rule decides nothing."""
    from tl_directional.core.paired import within_verdict, worse_verdict

    out = []
    for lab in [c for c in rec.columns if c not in ("text", "item", "kind", "window", "baseline")]:
        d = drop_of(rec, lab, fair)
        if lab in WITHIN_FAMILY:
            v = within_verdict(d, WITHIN) if complete else INCOMPLETE
            out.append((lab, f"within {WITHIN:g} points", d, v))
        elif lab in WORSE_FAMILY:
            v = worse_verdict(d, WORSE) if complete else INCOMPLETE
            out.append((lab, f"at least {WORSE:g} points worse", d, v))
        else:
            out.append((lab, "no rule (context)", d, "-"))
    return out


#: the two suites' names, as every reader of the accuracy verdicts prints them
FAIR, POOLED = "fair", "pooled"
#: the claim prefix of each suite's verdict rows (the closing table matches on it)
CLAIM_PREFIX = {FAIR: "accuracy (sec. 9.7, fair suite): ", POOLED: "accuracy (sec. 9.4, pooled suite): "}


def suite_of(manifest: dict) -> str:
    """:data:`FAIR` for a run of sec. 9.7's suite (:func:`is_fair` on its manifest), else :data:`POOLED`."""
    return FAIR if is_fair(manifest.get("suite")) else POOLED


def fmt_drop(d) -> str:
    """``+x.xx [+lo, +hi]`` points of a PairedDrop, as every accuracy cell prints it."""
    return f"{d.point:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}]"


def verdict_rows(stem: str, data: Path) -> list[tuple[str, str, str]]:
    """``[(claim, statistic, verdict)]`` of every setting under a rule, for the summary table of
    docs/results.md. The claim names the suite (:data:`CLAIM_PREFIX`); on the fair suite the
    statistic is the macro average with its window-cluster interval and the pooled item average of
    the same items follows it, deciding nothing."""
    manifest, rec, _ = load(stem, data)
    suite = suite_of(manifest)
    rows = []
    for lab, rule, d, v in verdicts(rec, manifest.get("complete", True), suite == FAIR):
        if v == "-":
            continue
        claim = CLAIM_PREFIX[suite] + f"{lab} {rule} " + ("of baseline" if rule.startswith("within") else "than baseline")
        if suite == FAIR:
            stat = (f"macro average over text x kind, baseline - edited = {fmt_drop(d)} points (window-cluster "
                    f"bootstrap); pooled item average {fmt_drop(drop_of(rec, lab, False))} (decides nothing)")
        else:
            stat = f"baseline - edited = {fmt_drop(d)} points"
        rows.append((claim, stat, f"**{v}**"))
    return rows


@dataclass(frozen=True)
class LeadRun:
    """The accuracy run the lead table reads for one model (:func:`lead_run`): its data ``stem``,
    its ``suite`` (:data:`FAIR` or :data:`POOLED`), ``drops`` ``{setting: (PairedDrop, verdict)}``
    on that suite's statistic (baseline minus edited, points; the same resamples for every setting,
    so differences are paired), and ``pooled`` ``{setting: PairedDrop}``, the item average of the
    same items with the item bootstrap (on the fair suite shown beside, deciding nothing; on the
    pooled suite the statistic itself)."""

    stem: str
    suite: str
    drops: dict
    pooled: dict


def lead_stem(model: str, data: Path) -> str | None:
    """``accuracy_<model>_fair`` where its manifest is committed in ``data``, else ``accuracy_<model>``
    where that is, else None (protocol sec. 9.7, the switch)."""
    for stem in (f"accuracy_{model}_fair", f"accuracy_{model}"):
        if (data / f"{stem}.manifest.json").is_file():
            return stem
    return None


def lead_run(model: str, data: Path) -> LeadRun | None:
    """The :class:`LeadRun` of :func:`lead_stem`, or None where no accuracy data of ``model`` exist."""
    stem = lead_stem(model, data)
    if stem is None:
        return None
    manifest, rec, _ = load(stem, data)
    suite = suite_of(manifest)
    rows = verdicts(rec, manifest.get("complete", True), suite == FAIR)
    pooled = {lab: (drop_of(rec, lab, False) if suite == FAIR else d) for lab, _, d, _ in rows}
    return LeadRun(stem, suite, {lab: (d, v) for lab, _, d, v in rows}, pooled)


def item_counts(stem: str, data: Path) -> tuple[int, int, int]:
    """``(items, cloze items, items per window)`` of a run's records (kind ``cloze`` only: the
    random-distractor items; the largest number of items one text's window carries)."""
    _, rec, _ = load(stem, data)
    return len(rec), int((rec["kind"] == "cloze").sum()), int(rec.groupby(["text", "window"]).size().max())


def drops(stem: str, data: Path) -> dict[str, tuple[object, str]]:
    """``{setting: (PairedDrop, verdict)}`` for every edited setting (``"-"``: no rule)."""
    manifest, rec, _ = load(stem, data)
    return {lab: (d, v) for lab, _, d, v in verdicts(rec, manifest.get("complete", True),
                                                     is_fair(manifest.get("suite")))}


def holm_counts(rows) -> list[str]:
    from tl_directional.core.paired import holm, one_sided_p

    lines = []
    for fam, margin, below, what in (
        (WITHIN_FAMILY, WITHIN, True, "exclude-self within 1.5 points"),
        (WORSE_FAMILY, WORSE, False, "V-Para / hard diagonal at least 3 points worse"),
    ):
        ds = {lab: d for lab, _, d, _ in rows if lab in fam}
        if not ds:
            continue
        held = holm({k: one_sided_p(d, margin, below) for k, d in ds.items()})
        opposite = holm({k: one_sided_p(d, margin, not below) for k, d in ds.items()})
        lines.append(
            f"- {what}: held in {len(held)} of {len(ds)} settings, failed in {len(opposite)} "
            f"(Holm over the family, one-sided bootstrap p-values, family-wise 0.05)"
        )
    return lines


def build_page(stem: str, data: Path) -> str:
    manifest, rec, _ = load(stem, data)
    m = manifest["model"]
    texts = list(manifest["texts"])
    L = [
        f"# Accuracy on {m['name']} (protocol sec. 9.4)",
        "",
        f"Data: `docs/results/data/{stem}.*` (per item, 1 = the model's choice is right), commit "
        f"`{manifest['commit']}`, command `{manifest['command']}`. Model source sha256 "
        f"`{(m.get('source_sha256') or '-')[:12]}`, dequantised.",
        "",
        f"Suite (seed {manifest['suite']['seed']}): per window {manifest['suite']['cloze_per_window']} four-way "
        f"cloze items (true next token against three from its frequency band of the text, {manifest['suite']['frequency_bands']} "
        f"bands) read from one forward of each window per setting, and {manifest['suite']['continuation_per_window']} continuation "
        f"items ({manifest['suite']['context_len']}+ context tokens, four {manifest['suite']['continuation_len']}-token "
        "continuations, length-normalised log-likelihood). Chance is 25%.",
        "",
    ]
    fair = is_fair(manifest["suite"])
    if fair:
        L += [
            "Sec. 9.7: beside each random cloze item a hard twin (`cloze-hard`: the same position against the "
            "three wrong tokens the unedited model ranks highest, its ranks 2-4 when it is right); verdicts on "
            "the macro average over text x item kind with a window-cluster bootstrap stratified by text.",
            "",
        ]
    if (chk := manifest.get("scorer_check")) is not None:
        L += [
            "Only the positions an item reads are unembedded (`logits_at`); checked in this run against "
            f"the full forward on {chk['text']} windows {chk['windows'][0]}-{chk['windows'][1]}: largest "
            f"logit difference {chk['max_abs_logit_difference']:.2g}, "
            f"{'the same' if chk['same_choices'] else 'NOT the same'} choices.",
            "",
        ]
    L += ["| text | windows | cloze items | continuation items |", "|---|---|---|---|"]
    L += [
        f"| {t} | {manifest['texts'][t]['windows']} | {manifest['texts'][t]['cloze_items']} | "
        f"{manifest['texts'][t]['continuation_items']} |"
        for t in texts
    ]
    complete = manifest.get("complete", True)
    if not complete:
        L += [
            "",
            f"**Incomplete run**: measured so far on {', '.join(texts)} only. The rules decide on the "
            "complete suite; until the run is resumed to its end every verdict reads "
            f"\"{INCOMPLETE}\" and the intervals below describe the texts measured so far.",
        ]
    rows = verdicts(rec, complete, fair)
    if fair:
        pooled = {lab: drop_of(rec, lab, False) for lab, *_ in rows}
        L += ["", "## Verdicts (macro average over text x item kind; window-cluster bootstrap stratified by text, "
              "2,000 resamples, seed 0)", "",
              "| setting | rule | baseline - edited, points [95% CI] | verdict | pooled, item bootstrap (sec. 9.4) |",
              "|---|---|---|---|---|"]
        L += [f"| {lab} | {rule} | {d.point:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] | {('**' + v + '**') if v != '-' else v} "
              f"| {pooled[lab].point:+.2f} [{pooled[lab].lo:+.2f}, {pooled[lab].hi:+.2f}] |"
              for lab, rule, d, v in rows]
    else:
        L += ["", "## Verdicts (all items pooled; paired item bootstrap, 2,000 resamples, seed 0)", "",
              "| setting | rule | baseline - edited, points [95% CI] | verdict |", "|---|---|---|---|"]
        L += [f"| {lab} | {rule} | {d.point:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] | {('**' + v + '**') if v != '-' else v} |"
              for lab, rule, d, v in rows]
    L += [""] + (holm_counts(rows) if complete else [])
    L += ["", "## Accuracy by text and item kind (%)", ""]
    cols = [(t, k) for t in texts for k in KINDS if k != "cloze-hard" or (rec.kind == k).any()]
    L += [
        "| setting | " + " | ".join(f"{t} {k}" for t, k in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for lab in ["baseline"] + [r[0] for r in rows]:
        cells = []
        for t, k in cols:
            sel = rec[(rec.text == t) & (rec.kind == k)][lab]
            cells.append(f"{100 * sel.mean():.1f}" if len(sel) else "-")
        L.append(f"| {lab} | " + " | ".join(cells) + " |")
    return "\n".join(L)
