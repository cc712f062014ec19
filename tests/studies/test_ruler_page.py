"""Protocol sec. 13's pages (:mod:`studies.ruler.page`) on constructed records shaped as the runner
writes them: the main page's numbers are the records' (plain groupby means) and
:mod:`studies.ruler.stats`'s rules, the verdict rows and the closing table read the same rows, a
partial run decides no rule and names the lengths it lacks, and the pilot pages show the committed
decision of secs. 13.7 / 13.9."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from studies import claims_table as CT
from studies.claims.data import DataError
from studies.common import sha256_bytes
from studies.ruler import page as P
from studies.ruler.run import CPU, SETTINGS
from studies.ruler.stats import EXCL, HARD, VPARA, rules

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs/results/data"
MODEL = "gemma-3-270m"
TASKS = ("needle-single", "needle-multi", "variable-tracking", "common-words")
RUNGS = {"needle-multi": {"rung": 8, "pilot_accuracy": 0.6, "reached_floor": True},
         "variable-tracking": {"rung": 1, "pilot_accuracy": 0.4, "reached_floor": False},
         "common-words": {"rung": 6, "pilot_accuracy": 0.6, "reached_floor": True}}


def _records(lengths=(256, 512, 1024, 2048), haystacks: int = 8, seed: int = 0) -> pd.DataFrame:
    """The runner's columns; variable tracking never right (below sec. 13.2's floor), the other tasks
    right 90% of the time unedited; exclude-self 0.5 loses nothing, V-Para 0.5 a third, hard nine in ten."""
    g = torch.Generator().manual_seed(seed)
    loss = {EXCL[0]: 0.2, EXCL[0.5]: 0.0, VPARA[0]: 0.5, VPARA[0.5]: 0.35, HARD: 0.9, SETTINGS[-1]: 0.1}
    rows = []
    for n in lengths:
        for h in range(haystacks):
            for t in TASKS:
                b = 0 if t == "variable-tracking" else int(torch.rand(1, generator=g) < 0.9)
                u = float(torch.rand(1, generator=g))
                for s, d in (("baseline", 0.0), *loss.items()):
                    c = int(b and u >= d)
                    rows.append({"length": n, "haystack": h, "task": t, "difficulty": 1, "answer": 0, "setting": s,
                                 "ll0": -1.0, "ll1": -2.0, "ll2": -3.0, "ll3": -4.0, "chosen": 0 if c else 1,
                                 "correct": c})
    return pd.DataFrame(rows)


def _commit(data: Path, stem: str, rec: pd.DataFrame, complete: bool = True) -> None:
    data.mkdir(parents=True, exist_ok=True)
    body = rec.to_csv(index=False).encode()
    (data / f"{stem}.records.csv").write_bytes(body)
    have = sorted(set(rec["length"]))
    m = {"command": f"python -m studies run ruler-probe --model {MODEL} --design cpu", "commit": "abc1234",
         "date": "2026-12-07 00:00 UTC", "design": CPU, "scorer": "shared-prefix", "rungs": RUNGS,
         "texts": {f"len{n}": {"commit": "abc1234"} for n in have}, "complete": complete,
         "items_sha256": {f"len{n}": f"{n:064d}" for n in CPU["lengths"]},
         "files": {f"{stem}.records.csv": sha256_bytes(body)}}
    (data / f"{stem}.manifest.json").write_text(json.dumps(m))


def _line(page: str, start: str) -> str:
    got = [ln for ln in page.splitlines() if ln.startswith(start)]
    assert len(got) == 1, (start, got)
    return got[0]


def test_the_page_reads_its_numbers_from_the_records_and_the_rules(tmp_path):
    stem = f"ruler-cpu_{MODEL}"
    rec = _records()
    _commit(tmp_path, stem, rec)
    page = P.build_page(stem, tmp_path)
    assert "`abc1234`" in page and "shared-prefix" in page and f"`{512:064d}`" in page
    # the unedited accuracy per task and length: the records' plain mean
    base = rec[rec.setting == "baseline"].groupby(["task", "length"])["correct"].mean() * 100
    row = _line(page, "| common-words | `f = 6` |")
    for n in CPU["lengths"]:
        assert f"| {base['common-words', n]:.1f} [" in row and f"| {base['common-words', n] - 25:+.1f}" in row
    # variable tracking is below sec. 13.2's floor: shown, left out of the rules' items
    assert "lower bound 0.0 < 35, **reported without a verdict**" in page
    pooled = ["needle-single", "needle-multi", "common-words"]
    want = rules(rec, pooled)
    for rid, (what, f) in P.RULER_STATS.items():
        st = want[rid]
        assert _line(page, f"| {rid} |").endswith(
            f"| {what} | {st.point:{f}} [{st.lo:{f}}, {st.hi:{f}}] | **{st.verdict}** |")
    assert want["L2"].verdict == want["L3"].verdict == "held"
    # the drop table: the records' mean drop per length for hard diagonal removal (pooled items)
    acc = rec[rec.task.isin(pooled)].groupby(["setting", "length"])["correct"].mean().unstack() * 100
    drop = acc.loc["baseline"] - acc.loc[HARD]
    hard = page.split("### pooled")[1].split("###")[0]
    cells = _line(hard, f"| {HARD} |").strip("|").split(" | ")[1:]
    assert [float(c.split(" [")[0]) for c in cells[:4]] == [round(v, 1) for v in drop.to_numpy()]
    assert float(cells[4].split(" [")[0]) == pytest.approx(drop.mean(), abs=0.051)
    # the verdict rows, and the closing table reading them unchanged
    rows = P.verdict_rows(stem, tmp_path)
    summary = [("ruler", stem, f"[{stem}](results/{stem}.md)", *r) for r in rows]
    table = CT.table_rows(summary, tmp_path)
    for (claim, stat, verdict), rid in zip(rows, P.RULER_STATS, strict=True):
        assert claim.startswith(f"{rid} (sec. 13.4): ") and verdict == f"**{want[rid].verdict}**"
        got = [r for r in table if r[0].id == rid and r[1] == MODEL]
        assert [(g[2], g[3], g[4]) for g in got] == [(stat, verdict, f"[{stem}]({stem}.md)")]


def test_the_spearman_reading_pairs_each_setting_with_its_nats_delta(tmp_path):
    stem = f"ruler-cpu_{MODEL}"
    rec = _records(haystacks=4)
    _commit(tmp_path, stem, rec)
    assert ": not read, `amend_gemma-3-270m.*` is not committed." in P.build_page(stem, tmp_path)
    for p in DATA.glob(f"amend_{MODEL}.*"):  # sec. 9.2's committed run beside the probe's
        (tmp_path / p.name).write_bytes(p.read_bytes())
    nats = P.nats_deltas(MODEL, tmp_path)
    assert set(SETTINGS) <= set(nats)
    pooled = rec[rec.task.isin(["needle-single", "needle-multi", "common-words"])]
    acc = pooled.groupby(["setting", "length"])["correct"].mean().unstack() * 100
    drop = (acc.loc["baseline"] - acc.loc[list(SETTINGS)]).mean(axis=1)
    ranks = pd.DataFrame({"drop": drop, "nats": [nats[s] for s in SETTINGS]}).rank(method="average")
    rho = float(np.corrcoef(ranks["drop"], ranks["nats"])[0, 1])
    page = P.build_page(stem, tmp_path)
    line = page.split("### pooled")[1].split("###")[0].strip().splitlines()[-1]
    assert line.startswith("Spearman's rho with the nats deltas: 256 ") and line.endswith(f", mean {rho:+.2f}.")



def test_a_task_every_setting_drops_alike_has_no_rank_correlation(tmp_path):
    """Variable tracking is never right here, so every setting's drop is 0: Spearman's rho is
    undefined and the page says so instead of printing nan."""
    stem = f"ruler-cpu_{MODEL}"
    _commit(tmp_path, stem, _records(haystacks=4))
    for p in DATA.glob(f"amend_{MODEL}.*"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    page = P.build_page(stem, tmp_path)
    line = page.split("### variable-tracking")[1].split("###")[0].strip().splitlines()[-1]
    assert line == ("Spearman's rho with the nats deltas: "
                    + ", ".join(f"{n:,} undefined (every drop equal)" for n in (256, 512, 1024, 2048))
                    + ", mean undefined (every drop equal).")
    assert "nan" not in page

def test_a_partial_run_decides_no_rule_and_names_what_it_lacks(tmp_path):
    stem = f"ruler-cpu_{MODEL}"
    _commit(tmp_path, stem, _records(lengths=(256, 512), haystacks=6), complete=False)
    page = P.build_page(stem, tmp_path)
    assert "**Partial run**: lengths 256, 512 tokens are in, 1,024, 2,048 are not." in page
    assert "(not scored yet)" in page and "**incomplete**" in page
    for rid in P.RULER_STATS:
        assert _line(page, f"| {rid} |").endswith("| not decided (run incomplete: 1,024, 2,048 tokens not in) |")
    rows = P.verdict_rows(stem, tmp_path)
    assert all(v == "not decided (run incomplete: 1,024, 2,048 tokens not in)" for _, _, v in rows)
    assert all(s.endswith("; lengths 256, 512 only)") for _, s, _ in rows)
    # without 512 tokens sec. 13.2's entry test cannot be read: not decided, left out of the pool
    _commit(tmp_path, stem, _records(lengths=(256,), haystacks=4), complete=False)
    page = P.build_page(stem, tmp_path)
    assert "- variable-tracking: not decided: its test reads 512 tokens, not in this run yet" in page
    assert "## The length trend" not in page and _line(page, "| L4 |").split(" | ")[-2] == "-"


@pytest.mark.parametrize(("model", "sec", "accs"), [
    ("smollm2-135m", "13.7", ("70% / 70% / 60%", "20% / 10% / 10%", "70% / 60% / 60%")),
    ("gemma-3-270m", "13.9", ("50% / 60% / 90%", "40% / 10% / 20%", "80% / 50% / 60%"))])
def test_the_pilot_pages_show_the_committed_decision(model, sec, accs):
    page = P.build_pilot_page(f"ruler-pilot_{model}", DATA)
    assert f"Sec. {sec} of the [protocol](protocol.md)" in page
    for knob, rung, acc in (("k", 8, accs[0]), ("h", 1, accs[1]), ("f", 6, accs[2])):
        row = next(ln for ln in page.splitlines() if f"(**`{knob} = {rung}`**" in ln or f"**`{knob} = {rung}`**" in ln)
        assert f"| {acc} |" in row
    assert "no rung reached 60%" in _line(page, "| variable-tracking (h) |")
    assert _line(page, "| needle-multi (k) |").split(" | ")[4] == "yes / yes / **no**"


def test_a_pilot_whose_manifest_disagrees_with_its_records_stops_the_build(tmp_path):
    stem = "ruler-pilot_smollm2-135m"
    for suffix in (".records.csv", ".manifest.json"):
        (tmp_path / f"{stem}{suffix}").write_bytes((DATA / f"{stem}{suffix}").read_bytes())
    m = json.loads((tmp_path / f"{stem}.manifest.json").read_text())
    m["rungs"]["common-words"]["rung"] = 12
    (tmp_path / f"{stem}.manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="differ from its records"):
        P.build_pilot_page(stem, tmp_path)


def test_the_provenance_list_says_how_far_each_length_is_scored():
    # finished, stopped between settings (the runner's checkpoint: listed, not read), not started
    manifest = {"texts": {"len256": {}}, "settings": [{"label": "a"}, {"label": "b"}],
                "partial": {"len512": {"setting_seconds": {"baseline": 1.0, "a": 2.0}}}}
    assert P.scored_note("len256", manifest) == ""
    assert P.scored_note("len512", manifest) == " (in part, not read: 2 of 3 settings, baseline, a)"
    assert P.scored_note("len1024", manifest) == " (not scored yet)"
