"""The lead table's switch to the fair accuracy suite (protocol sec. 9.7, issue 50), on constructed
data: the lead table, the verdict table's rows and the closing table read ``accuracy_<model>_fair``
where it is committed and ``accuracy_<model>`` where it is not, name the suite they read, and where
the two suites disagree the lead table prints the fair verdict. Statistics are checked against an
independent computation (pandas cell means) written here."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from studies import claims_table as CT
from studies import lead_readings as LR
from studies import paper_vs_ours as pvo
from studies.accuracy import page as A
from studies.common import write_data

SMOL, GEMMA = "smollm2-135m", "gemma-3-270m"
JOINT0 = "value-exclusive-joint skip0 s_par=0"
WINDOWS, CLOZE_PER_WINDOW = 16, 40
SUITE = {"seed": 0, "cloze_per_window": CLOZE_PER_WINDOW, "frequency_bands": 8, "continuation_per_window": 1,
         "context_len": 32, "continuation_len": 16}
FAIR_KEYS = {"hard_distractors": "x", "average": "macro over text x kind", "bootstrap": "window-cluster"}


def _records(seed: int = 0) -> pd.DataFrame:
    """Two texts x (cloze, cloze-hard, continuation), one continuation item per window. Exclude-self
    (joint, skip0) keeps every cloze item and loses half the continuation items: pooled over items it
    is within 1.5 points (the continuation items are 1 in 81), in the macro average it loses about 17
    (2 of 6 cells at 50). Hard diagonal loses 10% of the cloze items and no continuation item."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for text in ("kjv", "prose"):
        for kind, per_window in (("cloze", CLOZE_PER_WINDOW), ("cloze-hard", CLOZE_PER_WINDOW), ("continuation", 1)):
            n = WINDOWS * per_window
            base = torch.ones(n, dtype=torch.long)
            joint, hard = base.clone(), base.clone()
            if kind == "continuation":
                joint[torch.randperm(n, generator=g)[: n // 2]] = 0
            else:
                hard[torch.randperm(n, generator=g)[: n // 10]] = 0
            parts.append(pd.DataFrame({"text": text, "kind": kind, "window": [i // per_window for i in range(n)],
                                       "baseline": base.tolist(), JOINT0: joint.tolist(), LR.HARD: hard.tolist()}))
    rec = pd.concat(parts, ignore_index=True)
    rec.insert(1, "item", range(len(rec)))
    return rec


def _write(data, stem: str, rec: pd.DataFrame, fair: bool) -> None:
    files = {f"{stem}.records.csv": rec.to_csv(index=False, lineterminator="\n").encode(), f"{stem}.items.json": b"[]\n"}
    texts = {t: {"windows": WINDOWS, "cloze_items": int(((rec.text == t) & (rec.kind == "cloze")).sum()),
                 "continuation_items": WINDOWS} for t in ("kjv", "prose")}
    manifest = {"commit": "abc1234", "command": f"python -m studies run claims --stem {stem}",
                "model": {"name": stem, "source_sha256": "0" * 64}, "suite": SUITE | (FAIR_KEYS if fair else {}),
                "texts": texts, "files": {}, "complete": True}
    write_data(data, files, manifest, f"{stem}.manifest.json")


def _macro(rec: pd.DataFrame, lab: str) -> float:
    """Independent: the mean over text x kind cells of each cell's drop in points."""
    return float((100.0 * (rec["baseline"] - rec[lab])).groupby([rec["text"], rec["kind"]]).mean().mean())


def _row(block: str, start: str) -> str:
    return next(ln for ln in block.splitlines() if ln.startswith(start))


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """SmolLM2: both suites committed (the same items, read pooled or fair); Gemma-3: the pooled only."""
    data = tmp_path_factory.mktemp("data")
    rec = _records()
    _write(data, f"accuracy_{SMOL}", rec, fair=False)
    _write(data, f"accuracy_{SMOL}_fair", rec, fair=True)
    _write(data, f"accuracy_{GEMMA}", rec, fair=False)
    return data, rec


def test_the_switch_picks_the_fair_data_when_present_and_names_the_suite(both):
    data, rec = both
    assert A.lead_stem(SMOL, data) == f"accuracy_{SMOL}_fair" and A.lead_stem(GEMMA, data) == f"accuracy_{GEMMA}"
    assert A.lead_stem("other", data) is None and A.lead_run("other", data) is None
    fair, pooled = A.lead_run(SMOL, data), A.lead_run(GEMMA, data)
    assert (fair.suite, pooled.suite) == (A.FAIR, A.POOLED)
    # the fair statistic is the macro average; the pooled one beside it is the item average
    assert fair.drops[JOINT0][0].point == pytest.approx(_macro(rec, JOINT0), abs=1e-9)
    item_mean = float((100.0 * (rec["baseline"] - rec[JOINT0])).mean())
    assert fair.pooled[JOINT0].point == pytest.approx(item_mean, abs=1e-9)
    assert pooled.drops[JOINT0][0].point == pytest.approx(item_mean, abs=1e-9)
    # the two suites disagree on these items: within 1.5 points pooled, not in the macro average
    assert (fair.drops[JOINT0][1], pooled.drops[JOINT0][1]) == ("failed", "held")


def test_where_the_suites_disagree_the_lead_table_shows_the_fair_verdict(both):
    data, rec = both
    block = pvo.block(data)
    full = _row(block, "| exclude-self value removal (s_par = 0)")
    assert "accuracy, joint, all but layer 0, within 1.5 points (sec. 9.4's rule): " \
           f"{SMOL}, fair suite: **failed**, {GEMMA}, pooled suite: **held**" in full
    macro, items = _macro(rec, JOINT0), float((100.0 * (rec["baseline"] - rec[JOINT0])).mean())
    d = A.lead_run(SMOL, data).drops[JOINT0][0]
    assert (f"{SMOL}: per head, all layers not measured; joint, all but layer 0 not measured; accuracy drop, fair "
            f"suite (macro over text x kind, window-cluster) {macro:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] points, "
            f"pooled item average {items:+.2f} [") in full
    assert f"{GEMMA}: per head, all layers not measured; joint, all but layer 0 not measured; accuracy drop, " \
           f"pooled suite (item bootstrap) {items:+.2f} [" in full
    # the note names which model reads which suite, and the pooled suite's counts from its data
    note = _row(block, "Accuracy rows (protocol sec. 9.4's rules)")
    assert f"where it is committed ({SMOL}) and the pooled suite" in note and f"where it is not ({GEMMA})" in note
    n_cloze = int((rec.kind == "cloze").sum())
    assert f"in the pooled suite {n_cloze:,} of {len(rec):,} items are cloze items and {2 * CLOZE_PER_WINDOW + 1} " \
           f"items share a window ({SMOL} and {GEMMA})" in note
    # without the fair data the same model reads the pooled suite, and says so
    (data / f"accuracy_{SMOL}_fair.manifest.json").rename(data / "hidden.json")
    try:
        pooled_only = _row(pvo.block(data), "| exclude-self value removal (s_par = 0)")
    finally:
        (data / "hidden.json").rename(data / f"accuracy_{SMOL}_fair.manifest.json")
    assert f"{SMOL}, pooled suite: **held**, {GEMMA}, pooled suite: **held**" in pooled_only


def test_the_hard_diagonal_comparisons_read_the_fair_data(both):
    data, rec = both
    hard = _row(pvo.block(data), "| hard diagonal removal")
    smol = hard.split(f"{SMOL}: ", 1)[1].split(f"; {GEMMA}: ", 1)[0]
    want = _macro(rec, LR.HARD) - _macro(rec, JOINT0)  # independent: the difference of the two macro drops
    assert f"hard diagonal minus joint exclude-self (the paper's form): accuracy (fair suite) {want:+.2f} [" in smol
    assert f"accuracy (pooled suite) {float((rec[JOINT0] - rec[LR.HARD]).mean() * 100):+.2f} [" in hard
    assert f"at least 3 points worse (sec. 9.4's rule): {SMOL}, fair suite: **" in hard


def test_the_verdict_and_closing_tables_name_the_suite_of_each_row(both):
    data, rec = both
    summary = [("accuracy", s, f"[{s}](results/{s}.md)", *r)
               for s in (f"accuracy_{SMOL}", f"accuracy_{SMOL}_fair", f"accuracy_{GEMMA}")
               for r in A.verdict_rows(s, data)]
    claims = {(s, c): (stat, v) for _, s, _, c, stat, v in summary}
    fair = claims[(f"accuracy_{SMOL}_fair", f"accuracy (sec. 9.7, fair suite): {JOINT0} within 1.5 points of baseline")]
    assert fair[1] == "**failed**" and fair[0].startswith(f"macro average over text x kind, baseline - edited = "
                                                          f"{_macro(rec, JOINT0):+.2f} [")
    assert "pooled item average" in fair[0] and fair[0].endswith("(decides nothing)")
    pooled = claims[(f"accuracy_{SMOL}", f"accuracy (sec. 9.4, pooled suite): {JOINT0} within 1.5 points of baseline")]
    assert pooled[1] == "**held**"
    rows = CT.table_rows(summary, data)
    got = {(r[0].id, r[1]): r for r in rows}
    rule, _, stat, verdict, cell, _ = got[(f"acc (9.7) {JOINT0}", SMOL)]
    assert (stat, verdict, cell) == (*fair, f"[accuracy_{SMOL}_fair](accuracy_{SMOL}_fair.md)")
    assert "the fair suite, which the lead table reads" in rule.claim
    rule, _, stat, verdict, _, _ = got[(f"acc {JOINT0}", SMOL)]
    assert (stat, verdict) == pooled and "(the pooled suite)" in rule.claim
    assert got[(f"acc (9.7) {JOINT0}", GEMMA)][3] == CT.NOT_RUN
