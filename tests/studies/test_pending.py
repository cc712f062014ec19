"""``python -m studies pending`` (:mod:`studies.pending`) on constructed data: every source of the
closing table without data is listed with the closing table's own plan, an incomplete run with
its manifest's command and ``--resume``, a complete run not at all, and sec. 15's tasks are
counted from the kept records."""

from __future__ import annotations

import json
from pathlib import Path

from studies import claims_table as CT
from studies import pending as P
from studies.pass_training.seeds6 import lr_tasks, seed_tasks

GEMMA = "gemma-3-270m"


def _pairs() -> list[tuple[str, str]]:
    return [(name, m) for name in CT.SOURCES for m in dict.fromkeys(m for r in CT.RULES if r.source == name
                                                                     for m in r.models)]


def _manifest(data: Path, stem: str, **fields) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / f"{stem}.manifest.json").write_text(json.dumps({"commit": "abc1234", **fields}))


def test_without_data_every_source_is_pending_with_its_plan(tmp_path):
    rows = P.pending(tmp_path)
    assert len(rows) == len(_pairs())
    by_stem = {stem: (state, cmd) for stem, state, cmd in rows}
    state, cmd = by_stem[f"residatlas_{GEMMA}"]
    assert state == "not run" and cmd == CT.SOURCES["residatlas"].plan.format(model=GEMMA)
    # RULER's plan carries its note (the CPU design a machine without a GPU runs)
    assert "--design cpu" in by_stem[f"ruler_{GEMMA}"][1]


def test_an_incomplete_run_is_resumed_with_its_own_command_and_a_complete_one_is_not_listed(tmp_path):
    cmd = f"python -m studies run claims --model {GEMMA} --settings residatlas --windows 16"
    _manifest(tmp_path, f"residatlas_{GEMMA}", command=cmd, complete=False, texts={"kjv": {}, "prose": {}})
    _manifest(tmp_path, "residatlas_smollm2-135m", command=cmd, complete=True, texts={"kjv": {}})
    rows = {stem: (state, c) for stem, state, c in P.pending(tmp_path)}
    assert rows[f"residatlas_{GEMMA}"] == ("incomplete (holds: kjv, prose)", cmd + " --resume")
    assert "residatlas_smollm2-135m" not in rows
    assert len(rows) == len(_pairs()) - 1
    # a command that already resumes is kept as it is; a runner without --resume gets none
    assert P._resume(cmd + " --resume") == cmd + " --resume"
    assert P._resume("python -m studies run pass-training run") == "python -m studies run pass-training run"
    # a run of some lengths that finished them: resumed without its selection (as written it would
    # do nothing); a selection with a length not finished is kept
    ruler = "python -m studies run ruler-probe --model smollm2-135m --design cpu --lengths 512 --scorer shared-prefix"
    assert P._resume(ruler, ["len256", "len512"]) == (
        "python -m studies run ruler-probe --model smollm2-135m --design cpu --scorer shared-prefix --resume")
    assert P._resume(ruler.replace("512", "512 1024"), ["len256", "len512"]) == ruler.replace("512", "512 1024") + " --resume"
    assert P._resume(cmd + " --texts kjv", ["kjv"]) == cmd + " --resume"
    _manifest(tmp_path, f"residatlas_{GEMMA}", command=cmd, complete=False, texts={"kjv": {}},
              partial={"prose": {"setting_seconds": {"baseline": 1.0}}})
    assert dict((s, st) for s, st, _ in P.pending(tmp_path))[f"residatlas_{GEMMA}"] == (
        "incomplete (holds: kjv; prose in part)")


def test_the_six_seed_extension_counts_its_kept_task_records(tmp_path):
    wanted = lr_tasks() + seed_tasks()
    (tmp_path / P.TASKS).mkdir(parents=True)
    for t in wanted[:2]:
        (tmp_path / P.TASKS / f"{t}.json").write_text("{}")
    state = {stem: s for stem, s, _ in P.pending(tmp_path)}["pass8m.seeds6"]
    assert state.startswith(f"not collected: 2 of {len(wanted)} tasks kept")
    assert wanted[2] in state and wanted[0] not in state.split("missing: ")[1]


def test_the_command_line_prints_each_step_on_its_own_line(tmp_path, capsys):
    assert P.main(tmp_path) == 0
    out = capsys.readouterr().out
    assert "    python -m studies run pass-training collect-seeds6\n" in out
    assert out.rstrip().endswith("then `python -m studies build`")


def test_the_rate_check_adds_vparas_own_rate_runs_once_decided_away_from_the_shared_rate(tmp_path):
    from studies.pass_training.run import LR_CANDIDATES
    from studies.pass_training.seeds6 import LR_VARIANT, rate_tasks

    (tmp_path / P.TASKS).mkdir(parents=True)
    shared = LR_CANDIDATES[1]
    (tmp_path / P.TASKS / "lr.json").write_text(json.dumps({"lr": shared}))
    # the largest rate wins: V-Para's own rate differs from the shared one
    for k, lr in enumerate(LR_CANDIDATES):
        (tmp_path / P.TASKS / f"lr-{LR_VARIANT}-{lr:g}.json").write_text(json.dumps({"final_val_loss": 6.0 - k}))
    wanted = len(lr_tasks()) + len(seed_tasks()) + len(rate_tasks(LR_CANDIDATES[-1], shared))
    assert len(rate_tasks(LR_CANDIDATES[-1], shared)) == 3
    state = {stem: s for stem, s, _ in P.pending(tmp_path)}["pass8m.seeds6"]
    assert state.startswith(f"not collected: {len(LR_CANDIDATES)} of {wanted} tasks kept")
    assert rate_tasks(LR_CANDIDATES[-1], shared)[0] in state
    # the shared rate winning adds none
    for lr in LR_CANDIDATES:
        (tmp_path / P.TASKS / f"lr-{LR_VARIANT}-{lr:g}.json").write_text(json.dumps({"final_val_loss": abs(lr - shared)}))
    state = {stem: s for stem, s, _ in P.pending(tmp_path)}["pass8m.seeds6"]
    assert f"of {len(lr_tasks()) + len(seed_tasks())} tasks kept" in state


def test_a_six_seed_collection_in_part_names_the_kept_records_it_has_not_read(tmp_path):
    wanted = lr_tasks() + seed_tasks()
    (tmp_path / P.TASKS).mkdir(parents=True)
    for t in wanted[:3]:
        (tmp_path / P.TASKS / f"{t}.json").write_text("{}")
    # collected when two tasks were kept; a third landed afterwards
    _manifest(tmp_path, "pass8m.seeds6", command="python -m studies run pass-training run-seeds6 --jobs 1",
              complete=False, missing=wanted[2:])
    rows = {stem: (s, c) for stem, s, c in P.pending(tmp_path)}
    state, cmd = rows["pass8m.seeds6"]
    assert state.startswith(f"collected in part: 3 of {len(wanted)} tasks kept")
    assert state.endswith(f"kept, not collected yet: {wanted[2]}")
    assert cmd == CT.SOURCES["seeds6"].plan and cmd.endswith("collect-seeds6")
    # every kept record collected: nothing named as stale
    _manifest(tmp_path, "pass8m.seeds6", command="x", complete=False, missing=wanted[3:])
    assert "not collected yet" not in {stem: s for stem, s, _ in P.pending(tmp_path)}["pass8m.seeds6"]
