"""notebooks/_lesson.check_answer: passes a right answer, fails a wrong or missing one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "_lesson", Path(__file__).resolve().parents[2] / "notebooks" / "_lesson.py")
_lesson = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lesson)
check_answer = _lesson.check_answer


def test_right_answers_pass(capsys):
    check_answer(1.0005, 1.0, rtol=1e-3)
    check_answer(torch.tensor([1.0, 2.0]), [1.0, 2.0])
    check_answer((3, "L2H1"), (3, "L2H1"))
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, expected", [(1.01, 1.0), ([1.0, 2.5], [1.0, 2.0]), ([1.0], [1.0, 2.0]),
                                             ("L2H0", "L2H1"), (True, 2)])
def test_wrong_answers_fail(wrong, expected):
    with pytest.raises(AssertionError, match="not right"):
        check_answer(wrong, expected)


@pytest.mark.parametrize("missing", [None, ...])
def test_missing_answer_fails(missing):
    with pytest.raises(AssertionError, match="not answered"):
        check_answer(missing, 1.0)


def _solutions(tmp_path, monkeypatch):
    (tmp_path / "99_solutions.py").write_text(
        "CHECKS = {1: {'hint': 'add them'}}\n"
        "def solve_1(ns):\n    return ns['a'] + ns['b']\n"
        "def expected_1(ns):\n    return sum((ns['a'], ns['b']))\n")
    monkeypatch.setattr(_lesson, "_SOLUTIONS_DIR", tmp_path)
    return _lesson.load_solutions("99")


def test_check_exercise_right_wrong_and_missing(tmp_path, monkeypatch, capsys):
    sol = _solutions(tmp_path, monkeypatch)
    monkeypatch.delenv(_lesson.SOLVE_ENV, raising=False)
    _lesson.check_exercise(sol, 1, 5.0, {"a": 2.0, "b": 3.0})
    assert "exercise 1: correct" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="not right. Hint: add them"):
        _lesson.check_exercise(sol, 1, 6.0, {"a": 2.0, "b": 3.0})
    with pytest.raises(AssertionError, match="not answered"):
        _lesson.check_exercise(sol, 1, ..., {"a": 2.0, "b": 3.0})


def test_check_exercise_fills_from_solutions_only_when_asked(tmp_path, monkeypatch, capsys):
    sol = _solutions(tmp_path, monkeypatch)
    monkeypatch.setenv(_lesson.SOLVE_ENV, "1")
    _lesson.check_exercise(sol, 1, ..., {"a": 2.0, "b": 3.0})
    out = capsys.readouterr().out
    assert "filled in from the solutions file" in out and "exercise 1: correct" in out
    with pytest.raises(AssertionError, match="not right"):  # a given wrong answer is never replaced
        _lesson.check_exercise(sol, 1, 1.0, {"a": 2.0, "b": 3.0})


def test_load_solutions_missing_file(tmp_path, monkeypatch):
    monkeypatch.setattr(_lesson, "_SOLUTIONS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="no solutions file"):
        _lesson.load_solutions("98")


@pytest.mark.parametrize("stem", ["01", "02", "03", "04", "05", "06", "07"])
def test_lesson_solution_files_load(stem):
    sol = _lesson.load_solutions(stem)
    numbers = sorted(int(n.split("_")[1]) for n in dir(sol) if n.startswith("solve_"))
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 3
    assert all(hasattr(sol, f"expected_{n}") for n in numbers)
