"""The pass8m runs' CPU ledger: a run resumed by several processes reports their summed CPU
time, and a run that had work on disk before any ledger is marked partial (its figure a lower
bound) rather than reported as complete."""

from __future__ import annotations

import json
import time

from studies.pass_training import page as pass_page
from studies.pass_training import run as pass_run


def _burn(seconds: float) -> None:
    t = time.process_time()
    while time.process_time() - t < seconds:
        sum(i * i for i in range(1000))


def test_cpu_time_adds_up_over_resumed_processes(tmp_path):
    work, path = tmp_path / "run", tmp_path / "cpu" / "own-vpara-s0.json"
    with pass_run.CpuLedger(path, work) as first:
        work.mkdir()
        (work / "checkpoint").write_text("x")  # the run leaves work behind
        _burn(0.05)
    one = json.loads(path.read_text())
    assert one["processes"] == 1 and one["complete"] is True and one["cpu_s"] >= 0.05
    assert abs(one["cpu_s"] - first.total()) < 0.05
    with pass_run.CpuLedger(path, work) as second:  # a resumed process starts from the first's total
        _burn(0.05)
    two = json.loads(path.read_text())
    assert two["processes"] == 2 and two["complete"] is True
    assert two["cpu_s"] >= one["cpu_s"] + 0.05 and second.total() >= two["cpu_s"] - 1e-9


def test_a_run_begun_before_the_ledger_is_partial(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    (work / "checkpoint-400").mkdir()
    with pass_run.CpuLedger(tmp_path / "cpu.json", work) as ledger:
        pass
    assert ledger.complete is False and json.loads((tmp_path / "cpu.json").read_text())["complete"] is False


def test_the_thread_keeps_the_file_current_while_the_run_works(tmp_path):
    path = tmp_path / "cpu.json"
    with pass_run.CpuLedger(path, tmp_path / "run", every=0.01):
        start = json.loads(path.read_text())["cpu_s"]  # written on entry
        mid, t0 = start, time.process_time()
        while mid < start + 0.02 and time.process_time() - t0 < 5.0:
            _burn(0.02)
            mid = json.loads(path.read_text())["cpu_s"]  # only the thread writes before __exit__
    assert start < 0.01 and mid >= start + 0.02


def test_the_page_says_when_the_total_is_a_lower_bound():
    assert pass_page.cpu_caveat({"cpu_partial_runs": []}, 14) == ""
    assert "3 of 14 runs" in pass_page.cpu_caveat({"cpu_partial_runs": ["a", "b", "c"]}, 14)
    assert "lower bound" in pass_page.cpu_caveat({}, 14)
