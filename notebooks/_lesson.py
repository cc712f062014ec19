"""Helpers for the lesson notebooks: checking a reader's answer to an exercise.

``check_answer(answer, expected)`` raises ``AssertionError`` with a hint when the answer is wrong
and prints a short confirmation when it is right, so a check cell fails visibly under nbclient.
Numbers are compared with a relative and absolute tolerance; sequences element by element;
anything else (strings, ints, tuples of labels) by equality.

``check_exercise(solutions, n, answer, globals())`` checks exercise ``n`` of a lesson against
the lesson's solutions file (``notebooks/solutions/<stem>_solutions.py``, loaded with
``load_solutions(stem)``).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Sequence
from pathlib import Path


def _close(a, b, rtol: float, atol: float) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=atol)
    if hasattr(a, "tolist"):
        a = a.tolist()
    if hasattr(b, "tolist"):
        b = b.tolist()
    if isinstance(a, Sequence) and isinstance(b, Sequence) and not isinstance(a, str) and not isinstance(b, str):
        return len(a) == len(b) and all(_close(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    return a == b


def check_answer(answer, expected, *, name: str = "answer", rtol: float = 1e-3, atol: float = 1e-6,
                 hint: str = "") -> None:
    """Assert that ``answer`` matches ``expected`` (numbers within ``rtol`` / ``atol``)."""
    if answer is None or answer is Ellipsis:
        raise AssertionError(f"{name}: not answered yet (replace the ... with your computation)")
    if not _close(answer, expected, rtol, atol):
        raise AssertionError(f"{name}: {answer!r} is not right." + (f" Hint: {hint}" if hint else ""))
    print(f"{name}: correct ({answer!r})")


# ---------------------------------------------------------------------------------------------
# Exercises with solutions kept in a separate file
# ---------------------------------------------------------------------------------------------

SOLVE_ENV = "TLD_LESSON_SOLVE"
"""Environment variable: ``1`` fills every unanswered exercise with its solution (what CI does,
so the executed notebook also proves each exercise can be solved and its check passes)."""

_SOLUTIONS_DIR = Path(__file__).resolve().parent / "solutions"


def load_solutions(stem: str):
    """The module ``notebooks/solutions/<stem>_solutions.py`` (file names start with a digit, so
    it is loaded by path, not imported by name)."""
    path = _SOLUTIONS_DIR / f"{stem}_solutions.py"
    spec = importlib.util.spec_from_file_location(f"_lesson_solutions_{stem}", path)
    if spec is None or not path.exists():
        raise FileNotFoundError(f"no solutions file {path.name} in {_SOLUTIONS_DIR.name}/")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_exercise(solutions, number: int, answer, namespace: dict) -> None:
    """Check the reader's ``answer`` to exercise ``number`` of a lesson.

    ``solutions`` is the lesson's solutions module: ``expected_<n>(namespace)`` computes the
    right answer from the notebook's variables (by a route other than the one the exercise
    asks for, where there is one), ``solve_<n>(namespace)`` is the worked solution, and
    ``CHECKS[n]`` holds the keyword arguments of :func:`check_answer` (``rtol``, ``hint``...).
    With ``TLD_LESSON_SOLVE=1`` an unanswered exercise (``...``) takes the worked solution.
    """
    if (answer is None or answer is Ellipsis) and os.environ.get(SOLVE_ENV) == "1":
        answer = getattr(solutions, f"solve_{number}")(namespace)
        print(f"exercise {number}: filled in from the solutions file ({SOLVE_ENV}=1)")
    expected = getattr(solutions, f"expected_{number}")(namespace)
    options = dict(getattr(solutions, "CHECKS", {}).get(number, {}))
    check_answer(answer, expected, name=f"exercise {number}", **options)
