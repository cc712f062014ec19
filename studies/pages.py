"""The one page writer: every results page, rebuilt from the committed data under
``docs/results/data/`` alone (``python -m studies build``, ``make results``), and the marker
blocks of ``docs/results.md`` (the verdict table of every run) and ``README.md`` /
``docs/results.md`` (the paper-vs-ours lead), and the closing table of every claim
(``docs/results/claims_table.md``, :mod:`studies.claims_table`). ``--check`` compares each page with the file on
disk and fails on any difference (the suite runs it); a page is never edited by hand.
"""

from __future__ import annotations

import json
import sys

from studies import claims_table, common, paper_vs_ours
from studies.accuracy import page as accuracy_claims
from studies.claims import amend as amend_claims
from studies.claims import page as claims_page
from studies.claims import sites as sites_claims
from studies.claims import sites_more
from studies.claims.data import DATA, PAGES, ROOT, DataError
from studies.compression import page as compression_page
from studies.depth import page as depth_claims
from studies.instruments import page as instruments_claims
from studies.pass_training import page as pass_training
from studies.ruler import page as ruler_page
from studies.training import page as training_claims

#: each study's own error class for bad committed data (a build stops with one ``error:`` line)
DATA_ERRORS = (DataError, training_claims.DataError, pass_training.DataError,
               accuracy_claims.AccuracyDataError, instruments_claims.InstrumentsDataError)


SUMMARY_START, SUMMARY_END = "<!-- claims-summary -->", "<!-- /claims-summary -->"


def _done(stem: str) -> str:
    return "" if json.loads((DATA / f"{stem}.manifest.json").read_text())["complete"] else " (incomplete)"


def summary_rows(stems, depth=(), training=(), amend=(), passes=(), accuracy=(), instruments=(),
                 ruler=()) -> list[tuple]:
    """Every verdict row of every run, as the verdict functions of the studies give them:
    ``[(kind, stem, run cell, claim, statistic, verdict)]`` (``kind``: the study, ``run cell``: the
    first column of the verdict table, a link to the run's page). The verdict table of
    docs/results.md and the closing table (:mod:`studies.claims_table`) are both built from them."""
    R = []
    for stem in amend:
        R += [("amend", stem, f"[{stem}](results/{stem}.md){_done(stem)}", *r)
              for r in amend_claims.verdict_rows(stem, DATA)]
    for stem in accuracy:
        R += [("accuracy", stem, f"[{stem}](results/{stem}.md)", *r) for r in accuracy_claims.verdict_rows(stem, DATA)]
    for stem in instruments:  # protocol sec. 11
        R += [("instruments", stem, f"[{stem}](results/{stem}.md){_done(stem)}", *r)
              for r in instruments_claims.verdict_rows(stem, DATA)]
    for stem in ruler:  # protocol sec. 13.4
        R += [("ruler", stem, f"[{stem}](results/{stem}.md){_done(stem)}", *r) for r in ruler_page.verdict_rows(stem, DATA)]
    for stem in training:
        R += [("training", stem, f"[claims_{stem}](results/claims_{stem}.md)", *r)
              for r in training_claims.verdict_rows(stem, DATA)]
    for stem in passes:
        R += [("pass", stem, f"[{stem}](results/{stem}.md)", *r) for r in pass_training.verdict_rows(stem, DATA)]
    for stem in depth:
        R += [("depth", stem, f"[{stem}](results/{stem}.md)", *r) for r in depth_claims.verdict_rows(stem, DATA)]
    compression = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("compression_*.manifest.json")
                         if not p.name[len("compression_"):].split(".")[0].count("_"))
    for stem in compression:
        cell = f"[claims_{stem}](results/claims_{stem}.md)"
        page = compression_page.build_page(stem)
        row = next(ln for ln in page.splitlines() if "(**pre-registered**)" in ln)
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        R.append(("compression", stem, cell, "3: perpendicular error ranks compression damage better than parallel "
                  f"error, 1-cos and MSE ({cells[0].split(' (')[0]})", f"T = {cells[1]}", cells[-1]))
        amended = [ln for ln in page.split("## Amended reading", 1)[-1].splitlines()
                   if ln.startswith("| attn, per-token mean |")]
        if amended:
            cells = [c.strip() for c in amended[0].strip("|").split(" | ")]
            R.append(("compression", stem, cell, "3 (amended reading, sec. 9.5): perpendicular error ranks "
                      "compression damage better than parallel error", f"rho_perp - rho_par = {cells[1]}", cells[2]))
    for stem in stems:
        page = claims_page.build_page(stem)
        rows = [ln for ln in page.split("\n## Verdicts", 1)[1].split("\n\n", 2)[1].splitlines()[2:]
                if ln.startswith("|")]
        for ln in rows:
            cells = [c.strip() for c in ln.strip("|").split(" | ")]
            R.append(("claims", stem, f"[{stem}](results/{stem}.md){_done(stem)}", cells[0], cells[2], cells[3]))
    return R


def summary_block(rows) -> str:
    """The verdict table of every run, for docs/results.md (between the two markers), from
    :func:`summary_rows`."""
    L = [SUMMARY_START, "", "| run | claim | statistic [95% CI] | verdict |", "|---|---|---|---|"]
    L += [f"| {cell} | {claim} | {stat} | {verdict} |" for _, _, cell, claim, stat, verdict in rows]
    L += ["", SUMMARY_END]
    return "\n".join(L)


def _stems(pattern: str) -> list[str]:
    return sorted(p.name[: -len(".manifest.json")] for p in DATA.glob(pattern))


def claims_pages() -> dict:
    """``{path: text}`` of the claims, depth, training, amend, atlas, pass, accuracy and
    instruments pages, and of ``docs/results.md`` / ``README.md`` with their marker blocks
    (the verdict table, the paper-vs-ours lead) rebuilt; raises :data:`DATA_ERRORS`."""
    amend = _stems("amend_*.manifest.json")
    atlas = _stems("atlas_*.manifest.json")
    accuracy = _stems("accuracy_*.manifest.json")
    instruments = instruments_claims.stems(DATA)

    stems = _stems("claims_*.manifest.json")
    depth = _stems("depth_*.manifest.json")
    training = _stems("training_*.manifest.json")
    passes = [s for s in _stems("pass8m*.manifest.json") if "." not in s]  # pass8m.seeds6: a section of pass8m
    if not stems:
        raise DataError(f"no claims data under {DATA.relative_to(ROOT)}")
    pages = {}
    for stem in stems:
        pages[PAGES / f"{stem}.md"] = claims_page.build_page(stem) + "\n"
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
    for stem in sites_claims.stems(DATA):  # protocol sec. 14; a page only where its data exist
        pages[PAGES / f"{stem}.md"] = sites_claims.build_sites_page(stem, DATA) + "\n"
    for stem in ruler_page.pilot_stems(DATA):  # protocol sec. 13.2 (13.7, 13.9)
        pages[PAGES / f"{stem}.md"] = ruler_page.build_pilot_page(stem, DATA) + "\n"
    for stem in ruler_page.stems(DATA):  # protocol sec. 13; a page only where its data exist
        pages[PAGES / f"{stem}.md"] = ruler_page.build_page(stem, DATA) + "\n"
    for prefix, build in (("strength", sites_more.build_strength_page), ("residatlas", sites_more.build_residatlas_page),
                          ("residrandom", sites_more.build_residrandom_page)):  # protocol sec. 16
        for stem in sites_more.stems(DATA, prefix):
            pages[PAGES / f"{stem}.md"] = build(stem, DATA) + "\n"
    index = PAGES.parent / "results.md"
    if index.is_file():  # the verdict table's rows, and the closing table of every claim the index links
        rows = summary_rows(stems, depth, training, amend, passes, accuracy, instruments,
                           ruler_page.stems(DATA))
        pages[PAGES / claims_table.PAGE] = claims_table.build_page(rows, DATA) + "\n"
        text = index.read_text()
        if SUMMARY_START in text and SUMMARY_END in text:
            head, rest = text.split(SUMMARY_START, 1)
            text = head + summary_block(rows) + rest.split(SUMMARY_END, 1)[1]
        pages[index] = text
    lead = paper_vs_ours.block(DATA)
    for path in (index, ROOT / "README.md"):
        text = pages.get(path) or (path.read_text() if path.is_file() else "")
        if paper_vs_ours.START in text and paper_vs_ours.END in text:
            head, rest = text.split(paper_vs_ours.START, 1)
            pages[path] = head + lead + rest.split(paper_vs_ours.END, 1)[1]
    return pages


#: the page groups, in build order: each a function returning ``{path: text}``
GROUPS = {"compression": lambda: compression_page.build_pages(), "claims": lambda: claims_pages()}


def build_pages(groups=tuple(GROUPS)) -> dict:
    """``{path: text}`` of every page of ``groups`` (default all: compression pages first)."""
    pages: dict = {}
    for g in groups:
        pages |= GROUPS[g]()
    return pages


def build(check: bool = False, groups=tuple(GROUPS)) -> int:
    """Write every page of ``groups`` (default all; atomically), or with ``check`` only compare;
    exit status 0, 1 (a page differs: named, with the command to rebuild) or 2 (bad committed
    data, named)."""
    try:
        pages = build_pages(groups)
    except DATA_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return common.write_pages(pages, check, ROOT, "make results")
