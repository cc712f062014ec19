"""The closing table (docs/results/claims_table.md, :mod:`studies.claims_table`) on constructed data:
a row carries the number, verdict, command and commit of the run it reads; a rule without data is
**not run** with the command that writes them; a verdict row no rule claims stops the build; and
every rule id of the protocol's rule tables has a row."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from studies import claims_table as CT
from studies.claims.data import DataError
from studies.common import sha256_bytes
from studies.paper import ADDRESSES, VERSIONS
from studies.pass_training import seeds6_page
from studies.pass_training.run import SEEDS, VARIANTS
from studies.ruler import page as ruler_page
from studies.ruler.stats import EXCL, HARD, VPARA, rules

ROOT = Path(__file__).resolve().parents[2]
SMOL, GEMMA = "smollm2-135m", "gemma-3-270m"


def _manifest(data: Path, stem: str, files: dict[str, bytes] | None = None, **extra) -> None:
    data.mkdir(parents=True, exist_ok=True)
    for name, b in (files or {}).items():
        (data / name).write_bytes(b)
    m = {"command": f"python -m studies run X --stem {stem}", "commit": "abc1234", "complete": True,
         "files": {name: sha256_bytes(b) for name, b in (files or {}).items()}} | extra
    (data / f"{stem}.manifest.json").write_text(json.dumps(m))


def _row(rows, rule_id: str, model: str):
    got = [r for r in rows if r[0].id == rule_id and r[1] == model]
    assert len(got) == 1, (rule_id, model, len(got))
    return got[0]


def _amend_summary(stem: str) -> list[tuple]:
    """The verdict rows the amend page gives, as :func:`studies.pages.summary_rows` passes them."""
    return [("amend", stem, f"[{stem}](results/{stem}.md)", f"{i}: the claim", f"stat of {i} = +0.{k}00 [+0.{k}01, "
             f"+0.{k}02]", v) for k, (i, v) in enumerate((("A1p", "**failed**"), ("A1h", "**not decided**"),
                                                           ("A3h", "**held**"), ("A3r", "**held**")), start=1)]


def test_a_row_reads_number_verdict_command_and_versions_from_its_run(tmp_path):
    stem = f"amend_{SMOL}"
    _manifest(tmp_path, stem, commits=["abc1234", "def5678"])
    rows = CT.table_rows(_amend_summary(stem), tmp_path)
    rule, _, stat, verdict, cell, command = _row(rows, "A1p", SMOL)
    assert (stat, verdict) == ("stat of A1p = +0.100 [+0.101, +0.102]", "**failed**")
    assert cell == f"[{stem}](amend_{SMOL}.md)"
    assert command == f"`python -m studies run X --stem {stem}` at `abc1234` (the run's other commits: `def5678`)"
    assert _row(rows, "A1h", SMOL)[3] == "**not decided**" and _row(rows, "A3r", SMOL)[3] == "**held**"
    # the versions column is studies.paper.ADDRESSES, the lead table's constants
    page = CT.build_page(_amend_summary(stem), tmp_path)
    line = next(ln for ln in page.splitlines() if ln.startswith(f"| A3h | 9.2 | {SMOL} |"))
    assert " / ".join(f"`{c}`" for c in ADDRESSES["A3h"]) in line and "+0.300 [+0.301, +0.302]" in line


def test_missing_data_is_not_run_with_the_command_that_writes_it(tmp_path):
    _manifest(tmp_path, f"amend_{SMOL}")
    rows = CT.table_rows(_amend_summary(f"amend_{SMOL}"), tmp_path)
    _, _, stat, verdict, cell, command = _row(rows, "A1p", GEMMA)  # no amend_gemma-3-270m.* here
    assert (stat, verdict, cell) == ("-", CT.NOT_RUN, f"`amend_{GEMMA}.*`")
    assert command == f"`python -m studies run claims --model {GEMMA} --settings amend --windows 32 --batch-size 8 " \
                      "--threads 1`"
    for rule_id, model, wants in (("V1 (sec. 16.5)", GEMMA, "--settings residrandom"),
                                  ("atlas resid-mlp", SMOL, "--settings residatlas"),
                                  ("acc (9.7) hard-diag skip0", SMOL, "--settings accuracy --tag fair"),
                                  ("V1 (sec. 15)", "pass8m", "run-seeds6"),
                                  ("L4", GEMMA, "ruler-probe --model gemma-3-270m")):
        _, _, _, verdict, _, command = _row(rows, rule_id, model)
        assert verdict == CT.NOT_RUN and wants in command, (rule_id, command)
    page = CT.build_page(_amend_summary(f"amend_{SMOL}"), tmp_path)
    assert f"Rows: {len(rows)}; held 2, failed 1, not decided 1, no rule 0, not run {len(rows) - 4}." in page


def _ruler_records(seed: int = 0) -> pd.DataFrame:
    """Items of three tasks at four lengths: exclude-self 0.5 keeps every item, V-Para 0.5 loses a
    third, hard diagonal removal loses nine in ten (so L2 and L3 hold, L1 holds)."""
    g = torch.Generator().manual_seed(seed)
    drops = {EXCL[0]: 0.2, EXCL[0.5]: 0.0, VPARA[0]: 0.5, VPARA[0.5]: 0.35, HARD: 0.9}
    rows = []
    for n in (256, 512, 1024, 2048):
        for h in range(12):
            for t in ("needle-single", "needle-multi", "common-words"):
                b, u = int(torch.rand(1, generator=g) < 0.9), float(torch.rand(1, generator=g))
                rows.append({"length": n, "haystack": h, "task": t, "setting": "baseline", "correct": b})
                rows += [{"length": n, "haystack": h, "task": t, "setting": s, "correct": int(b and u >= d)}
                         for s, d in drops.items()]
    return pd.DataFrame(rows)


def test_ruler_rows_read_rules_from_the_records_and_the_cpu_design_stands_in(tmp_path):
    rec = _ruler_records()
    rungs = {t: {"rung": 1, "reached_floor": True} for t in ("needle-multi", "common-words")}
    stem = f"ruler-cpu_{GEMMA}"  # only sec. 13.10's design committed: read in place of ruler_<model>
    _manifest(tmp_path, stem, {f"{stem}.records.csv": rec.to_csv(index=False).encode()}, rungs=rungs,
              design={"lengths": [256, 512, 1024, 2048]})

    def summary():  # the verdict table's rows, as studies.pages.summary_rows passes them
        return [("ruler", stem, f"[{stem}](results/{stem}.md)", *r) for r in ruler_page.verdict_rows(stem, tmp_path)]

    rows = CT.table_rows(summary(), tmp_path)
    want = rules(rec, ["needle-single", "needle-multi", "common-words"])
    for rid in ("L1", "L2", "L3", "L4"):
        _, _, stat, verdict, cell, command = _row(rows, rid, GEMMA)
        what, f = ruler_page.RULER_STATS[rid]
        assert stat.startswith(f"{what} = {want[rid].point:{f}} [{want[rid].lo:{f}}, {want[rid].hi:{f}}]")
        assert verdict == f"**{want[rid].verdict}**" and cell == f"[{stem}]({stem}.md)" and "`abc1234`" in command
    assert _row(rows, "L2", GEMMA)[3] == _row(rows, "L3", GEMMA)[3] == "**held**"
    assert _row(rows, "L1", SMOL)[3] == CT.NOT_RUN
    # an incomplete run decides nothing
    _manifest(tmp_path, stem, {f"{stem}.records.csv": rec.to_csv(index=False).encode()}, rungs=rungs, complete=False,
              design={"lengths": [256, 512, 1024, 2048]})
    assert _row(CT.table_rows(summary(), tmp_path), "L2", GEMMA)[3] == "not decided (run incomplete)"


def test_six_seed_rows_are_the_sections_table(tmp_path):
    """Sec. 15's rows as the pass8m page's six-seed table prints them (partial data: seed 3 has two arms)."""
    from studies import common as studies_common

    final10 = pd.DataFrame([{"variant": v, "seed": s, "path": "own", "final_val_loss": 4.4 + 0.01 * s + 0.003 * k * s}
                            for k, v in enumerate(VARIANTS) for s in SEEDS])
    curves10 = pd.DataFrame([{"variant": v, "seed": s, "step": 100, "val_loss": 6.0} for v in VARIANTS for s in SEEDS])
    files = {"pass8m.seeds6.final.csv": b"variant,seed,lr,final_val_loss,cpu_s\nbaseline,3,0.003,4.47,9.0\n"
             b"vpara,3,0.003,4.46,9.1\n", "pass8m.seeds6.curves.csv": b"variant,seed,lr,step,tokens,train_loss,val_loss\n",
             "pass8m.seeds6.lr.csv": b"variant,seed,lr,max_steps,final_val_loss\n"}
    studies_common.write_data(tmp_path, files, {"command": "c", "commit": "abc1234", "started": "s", "torch": "t",
                                                "task_commits": [], "cpu_hours": 1.0, "complete": False,
                                                "missing": ["own-attn-para-s3"], "files": {}},
                              "pass8m.seeds6.manifest.json")
    base = {"config": {"lr": 0.003}}
    rows = seeds6_page.verdict_rows("pass8m", tmp_path, final10, curves10, base)
    lines = seeds6_page.section("pass8m", tmp_path, final10, curves10, base)
    assert [r[0] for r in rows] == [c[2] for c in seeds6_page.COMPARISONS]
    for label, stat, verdict in rows:
        cells = next(ln for ln in lines if ln.startswith(f"| {label} |")).strip("|").split(" | ")
        assert stat.endswith(f" = {cells[1].strip()} nats/token") and verdict == cells[-1].strip()
        assert verdict == "not decided (seeds 3, 4, 5 missing)"
    assert seeds6_page.verdict_rows("pass8m", tmp_path / "none", final10, curves10, base) is None


def test_a_verdict_row_no_rule_claims_stops_the_build(tmp_path):
    stem = f"amend_{SMOL}"
    _manifest(tmp_path, stem)
    summary = [*_amend_summary(stem), ("amend", stem, "", "A9x: a rule added later", "x = +1 [+0, +2]", "**held**")]
    with pytest.raises(DataError, match=r"amend_smollm2-135m: verdict row 'A9x: a rule added later' has no row"):
        CT.table_rows(summary, tmp_path)


def _protocol_ids() -> list[tuple[str, str]]:
    """``(section, id)`` of every row of the protocol's rule tables (header ``| id | ...``), and the
    ids its prose states a rule for (sec. 7's D1 / D2, sec. 15's V1)."""
    section, out, in_ids = "", [], False
    for ln in (ROOT / "docs" / "results" / "protocol.md").read_text().splitlines():
        if m := re.match(r"#{2,3} (\d+(?:\.\d+)?)[. ]", ln):
            section = m.group(1)
        if ln.startswith("| id |"):
            in_ids = True
        elif in_ids and ln.startswith("|") and not ln.startswith("|---"):
            out.append((section, ln.split("|")[1].strip()))
        elif not ln.startswith("|"):
            in_ids = False
    return out + [("7", "D1"), ("7", "D2"), ("15", "V1")]


def test_every_protocol_rule_id_has_a_row():
    got = _protocol_ids()
    assert {"A1", "A1p", "M1", "R2g", "L4", "V1"} <= {i for _, i in got}  # the parser reads the tables
    ids = {(r.section, r.id) for r in CT.RULES}
    missing = [(sec, i) for sec, i in got
               if not any(rid in (i, f"{i} (sec. {sec})") and rsec.split(".")[0] == sec.split(".")[0]
                          for rsec, rid in ids)]
    assert not missing, f"protocol rules without a row in studies/claims_table.py RULES: {missing}"


def test_rules_are_unique_and_address_only_versions_read():
    keys = [(r.id, m) for r in CT.RULES for m in r.models]
    assert len(keys) == len(set(keys))
    for r in CT.RULES:
        assert r.source in CT.SOURCES and (not r.addresses or set(ADDRESSES[r.addresses]) <= set(VERSIONS)), r.id


def test_the_lead_table_reads_the_versions_it_addresses_from_their_one_home():
    """studies/paper_vs_ours.py names no addressed commit itself: every ``_addresses(...)`` /
    ``_ticks(...)`` argument comes from :data:`studies.paper.ADDRESSES` (or ``EVERY``), not a literal."""
    import ast

    tree = ast.parse((ROOT / "studies" / "paper_vs_ours.py").read_text())
    bad = [f"line {n.lineno}" for n in ast.walk(tree)
           if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_addresses"
           and any(isinstance(a, ast.Constant) for a in n.args)]
    assert not bad, f"literal commits passed to _addresses in studies/paper_vs_ours.py: {bad}"
