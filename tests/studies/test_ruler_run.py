"""Protocol sec. 13's runner: the pilot's items and fit rule on a cheap counter, the pilot's
accuracies from constructed records, and end to end on the bundled default model (one haystack at
one short length, a pilot manifest written here): every item scored under the baseline and the
six edits, the scores the scorer's reading of the stored log-likelihoods, and a resumed run that
keeps the finished length bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from studies.ruler import page
from studies.ruler.cli import main
from studies.ruler.items import LADDERS
from studies.ruler.run import (
    CPU,
    MAIN,
    PILOT,
    SETTINGS,
    RulerRun,
    cached_items,
    pilot_accuracy,
    pilot_items,
    rung_fits,
)

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [(ROOT / "tl_directional/data" / f).read_text() for f in ("kjv_heldout.txt", "prose_heldout.txt")]


def words(s: str) -> int:
    return len(s.split())


def test_pilot_items_hold_every_rung_and_one_needle_single():
    items = pilot_items(TEXTS, words, dict(PILOT, haystacks=2))
    got = {}
    for it in items:
        got.setdefault(it.task, set()).add(it.difficulty)
    assert got == {"needle-single": {1}, **{t: set(ladder) for t, ladder in LADDERS.items()}}
    assert len(items) == 2 * (1 + 3 * 3) and {it.length for it in items} == {512}


def test_a_rung_that_cannot_be_generated_at_the_shortest_length_does_not_fit():
    # 16 needles of about 11 words overrun 128 words; the easiest rungs fit
    fits = rung_fits(TEXTS, words, dict(PILOT, haystacks=2), 128)
    assert fits["needle-multi"] == {4: True, 8: True, 16: False}
    assert all(by[LADDERS[t][0]] for t, by in fits.items())


def test_pilot_accuracy_reads_the_baseline_rows_only():
    rows = [{"task": "needle-multi", "difficulty": 4, "setting": "baseline", "correct": c} for c in (1, 1, 0, 1)]
    rows += [{"task": "needle-multi", "difficulty": 8, "setting": "baseline", "correct": 0}]
    rows += [{"task": "needle-multi", "difficulty": 8, "setting": "hard-diag skip0", "correct": 1}]
    assert pilot_accuracy(rows) == {"needle-multi": {4: 0.75, 8: 0.0}}


pytestmark = pytest.mark.usefixtures("restore_grad_mode")  # tests/studies/conftest.py


def test_cached_items_are_kept_by_their_inputs_and_rebuilt_when_altered(tmp_path):
    made = []

    def make(n=2):
        made.append(n)
        return pilot_items(TEXTS, words, dict(PILOT, haystacks=n))

    key = {"seed": 1, "tokenizer": "abc"}
    first, hit = cached_items(tmp_path, key, make)
    assert not hit and len(made) == 1
    again, hit = cached_items(tmp_path, key, make)
    assert hit and again == first and len(made) == 1  # equal Items, choices tuples included
    other, hit = cached_items(tmp_path, key | {"tokenizer": "abd"}, lambda: make(1))
    assert not hit and len(other) < len(first) and len(list(tmp_path.iterdir())) == 2
    # an altered file (an item's answer changed) no longer matches its sha256: rebuilt
    path = next(p for p in tmp_path.iterdir() if p.read_text().count('"answer"') == len(first))
    body = json.loads(path.read_text())
    body["items"][0]["answer"] = (body["items"][0]["answer"] + 1) % 4
    path.write_text(json.dumps(body))
    rebuilt, hit = cached_items(tmp_path, key, make)
    assert not hit and rebuilt == first and len(made) == 3
    path.write_text("{not json")
    assert cached_items(tmp_path, key, make) == (first, False)


@pytest.mark.slow
def test_main_run_scores_every_setting_and_resumes(tmp_path, capsys):
    rungs = {t: {"rung": ladder[0]} for t, ladder in LADDERS.items()}
    (tmp_path / "ruler-pilot_default.manifest.json").write_text(json.dumps({"complete": True, "rungs": rungs}))
    # the bundled model's context is 256 tokens: two short lengths, one haystack each
    args = ["--model", "default", "--haystacks", "1", "--smoke-lengths", "236", "244", "--allow-dirty",
            "--data-dir", str(tmp_path), "--items-cache", str(tmp_path / "items")]
    assert main([*args, "--lengths", "236"]) == 0
    assert "items cache" not in capsys.readouterr().out and len(list((tmp_path / "items").iterdir())) == 1
    stem = "ruler_default"
    first = pd.read_csv(tmp_path / f"{stem}.records.csv")
    m = json.loads((tmp_path / f"{stem}.manifest.json").read_text())
    assert not m["complete"] and list(m["texts"]) == ["len236"]
    assert m["rungs"] == rungs
    assert [s["label"] for s in m["settings"]] == list(SETTINGS)
    assert main([*args, "--resume"]) == 0  # the same items (resume checks their sha256), from the cache
    assert "items read from the items cache" in capsys.readouterr().out
    rec = pd.read_csv(tmp_path / f"{stem}.records.csv")
    m = json.loads((tmp_path / f"{stem}.manifest.json").read_text())
    assert m["complete"] and len(rec) == 2 * 4 * (1 + len(SETTINGS))
    pd.testing.assert_frame_equal(rec[rec.length == 236].reset_index(drop=True), first, check_exact=True)
    # each row's choice is the unique top of its four log-likelihoods, right when it is the answer
    lls = rec[["ll0", "ll1", "ll2", "ll3"]].to_numpy()
    top = lls.argmax(1)
    unique = (lls == lls.max(1, keepdims=True)).sum(1) == 1
    assert (rec["chosen"].to_numpy() == [t if u else -1 for t, u in zip(top, unique, strict=True)]).all()
    assert (rec["correct"] == (rec["chosen"] == rec["answer"]).astype(int)).all()
    # an edit changes the log-likelihoods (the hooks act), the baseline rows are the unedited ones
    base = rec[rec.setting == "baseline"][["ll0"]].to_numpy()
    hard = rec[rec.setting == "hard-diag skip0"][["ll0"]].to_numpy()
    assert not (base == hard).all()


class _Stop(Exception):
    pass


@pytest.mark.slow
def test_a_length_stopped_between_settings_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    # a long length outlives a session: the runner writes after each setting, --resume keeps the
    # finished settings, and the result is the straight run's, row for row
    rungs = {t: {"rung": ladder[0]} for t, ladder in LADDERS.items()}
    for d in ("straight", "stopped"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "ruler-pilot_default.manifest.json").write_text(json.dumps({"complete": True, "rungs": rungs}))
    args = ["--model", "default", "--haystacks", "1", "--smoke-lengths", "236", "--allow-dirty", "--items-cache", "none"]
    assert main([*args, "--data-dir", str(tmp_path / "straight")]) == 0
    straight = pd.read_csv(tmp_path / "straight" / "ruler_default.records.csv")

    calls, real = [], RulerRun.checkpoint

    def stop_after_two(self, text, progress):
        real(self, text, progress)
        calls.append(dict(progress["setting_seconds"]))
        if len(calls) == 2:
            raise _Stop

    monkeypatch.setattr(RulerRun, "checkpoint", stop_after_two)
    with pytest.raises(_Stop):
        main([*args, "--data-dir", str(tmp_path / "stopped")])
    m = json.loads((tmp_path / "stopped" / "ruler_default.manifest.json").read_text())
    assert not m["complete"] and m["texts"] == {}
    assert list(m["partial"]["len236"]["setting_seconds"]) == ["baseline", SETTINGS[0]]
    part = pd.read_csv(tmp_path / "stopped" / "ruler_default.records.csv")
    assert list(part["setting"].drop_duplicates()) == ["baseline", SETTINGS[0]] and len(part) == 2 * 4
    # the page reads finished lengths only (this data as if committed)
    (tmp_path / "read").mkdir()
    (tmp_path / "read" / "ruler_default.records.csv").write_bytes(
        (tmp_path / "stopped" / "ruler_default.records.csv").read_bytes())
    (tmp_path / "read" / "ruler_default.manifest.json").write_text(json.dumps(m | {"commit": "abc1234"}))
    assert len(page.load("ruler_default", tmp_path / "read")[1]) == 0

    monkeypatch.setattr(RulerRun, "checkpoint", real)
    calls.clear()
    assert main([*args, "--data-dir", str(tmp_path / "stopped"), "--resume"]) == 0
    m = json.loads((tmp_path / "stopped" / "ruler_default.manifest.json").read_text())
    assert m["complete"] and "partial" not in m and list(m["texts"]) == ["len236"]
    assert list(m["texts"]["len236"]["setting_seconds"]) == ["baseline", *SETTINGS]
    resumed = pd.read_csv(tmp_path / "stopped" / "ruler_default.records.csv")
    pd.testing.assert_frame_equal(resumed, straight, check_exact=True)


def test_the_cpu_design_scores_the_first_haystacks_of_each_length():
    # sec. 13.10: the main design's items, of which the first scored[length] haystacks are scored
    assert CPU["seed"] == MAIN["seed"] and CPU["haystacks"] == MAIN["haystacks"] and CPU["lengths"] == MAIN["lengths"]
    items = pilot_items(TEXTS, words, dict(MAIN, haystacks=3, lengths=[256, 512]))
    run = SimpleNamespace(design=dict(CPU, scored={"256": 3, "512": 1}),
                          items={"len256": [i for i in items if i.length == 256],
                                 "len512": [i for i in items if i.length == 512]})
    assert RulerRun.windows(run, "len256", "") == run.items["len256"]
    assert {i.haystack for i in RulerRun.windows(run, "len512", "")} == {0}
    assert len(RulerRun.windows(run, "len512", "")) == len(run.items["len512"]) // 3


def test_the_items_cache_is_refused_on_the_pilot_whose_items_it_does_not_keep(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", "default", "--pilot", "--items-cache", "/tmp/x"])
    assert e.value.code == 2 and "--items-cache /tmp/x" in capsys.readouterr().err
