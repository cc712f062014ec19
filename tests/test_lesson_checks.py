"""notebooks/_lesson.check_answer: passes a right answer, fails a wrong or missing one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "_lesson", Path(__file__).resolve().parent.parent / "notebooks" / "_lesson.py")
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
