"""Helpers for the lesson notebooks: checking a reader's answer to an exercise.

``check_answer(answer, expected)`` raises ``AssertionError`` with a hint when the answer is wrong
and prints a short confirmation when it is right, so a check cell fails visibly under nbclient.
Numbers are compared with a relative and absolute tolerance; sequences element by element;
anything else (strings, ints, tuples of labels) by equality.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
