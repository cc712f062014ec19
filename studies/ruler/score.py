"""Protocol sec. 13's scorer and pilot rule, as pure functions of token ids and log-likelihoods.

An item (:class:`studies.ruler.items.Item`) is a four-way choice read by likelihood (sec. 13.1):
each candidate is the continuation ``" " + candidate`` of the prompt, scored by the summed
log-likelihood of its tokens given the prompt (lm-eval's ``loglikelihood``; the forwards are
:func:`tl_directional.evaluate.suites.accuracy.loglikelihoods`); the highest wins and a tie at the
top counts as wrong. No generation and no exact-match parsing: the multi-key and common-words
answers are candidates like any other, so "exact match" is choosing the right one of the four.

The pilot rule (sec. 13.2) picks one rung of each task's ladder from the unedited model's pilot
accuracies: the hardest rung at or above :data:`PILOT_FLOOR`, else the easiest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

#: sec. 13.2: a rung is kept when the pilot's baseline accuracy reaches this fraction
PILOT_FLOOR = 0.60
#: sec. 13.2: a task on its easiest rung gets no verdict if the main baseline's lower bound at
#: 512 tokens is below chance (0.25) plus 10 points
VERDICT_FLOOR = 0.35

Encode = Callable[[str], list[int]]


def continuation_ids(encode: Encode, prompt: str, candidate: str) -> list[int]:
    """The token ids of ``" " + candidate`` after ``prompt``, lm-eval's way: the whole
    ``prompt + " " + candidate`` encoded, less the prompt's own ids, where the prompt's encoding is
    a prefix of the whole one (a merge across the boundary would make it not); otherwise
    ``" " + candidate`` encoded alone. ``encode`` maps text to ids without special tokens."""
    ctx, whole = encode(prompt), encode(prompt + " " + candidate)
    if whole[: len(ctx)] == ctx and len(whole) > len(ctx):
        return whole[len(ctx):]
    return encode(" " + candidate)


def item_requests(encode: Encode, bos: int | None, prompt: str,
                  choices: Sequence[str]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The four ``(context, continuation)`` id pairs of one item, in choice order: the context is
    ``bos`` (when not None, as the model's forward sees text) then the prompt's ids."""
    ctx = ([bos] if bos is not None else []) + encode(prompt)
    return [(tuple(ctx), tuple(continuation_ids(encode, prompt, c))) for c in choices]


def chosen(lls: Sequence[float]) -> int:
    """The index of the unique highest log-likelihood, or -1 when the top is tied (sec. 13.1: a
    tie counts as wrong, so it matches no answer)."""
    top = max(lls)
    best = [k for k, v in enumerate(lls) if v == top]
    return best[0] if len(best) == 1 else -1


def is_correct(lls: Sequence[float], answer: int) -> bool:
    """Whether the item's four log-likelihoods pick ``answer`` (a tie at the top is wrong)."""
    return chosen(lls) == answer


def pick_rungs(accuracy: Mapping[str, Mapping[int, float]], ladders: Mapping[str, Sequence[int]],
               fits: Mapping[str, Mapping[int, bool]] | None = None) -> dict[str, dict]:
    """Sec. 13.2's choice per task with a ladder: ``{task: {"rung": d, "pilot_accuracy": a,
    "reached_floor": bool}}``, the hardest rung (last of the ladder, which runs easiest first)
    whose pilot accuracy is at least :data:`PILOT_FLOOR`, else the easiest rung. With ``fits``
    (sec. 13.6: whether a rung's items fit the main run's shortest length), only fitting rungs
    are candidates.

    Raises:
        ValueError: a task of ``ladders`` without a pilot accuracy for every rung, or whose
            easiest rung does not fit.
    """
    out = {}
    for task, ladder in ladders.items():
        acc = accuracy.get(task, {})
        missing = [d for d in ladder if d not in acc]
        if missing:
            raise ValueError(f"accuracy[{task!r}] lacks rungs {missing} of {list(ladder)}: score every rung "
                             f"on the pilot before picking")
        fit = [d for d in ladder if fits is None or fits[task][d]]
        if not fit or fit[0] != ladder[0]:
            raise ValueError(f"fits[{task!r}] = {dict(fits[task])}: the easiest rung {ladder[0]} must fit the "
                             f"shortest length; use longer lengths")
        ok = [d for d in fit if acc[d] >= PILOT_FLOOR]
        rung = ok[-1] if ok else ladder[0]
        out[task] = {"rung": rung, "pilot_accuracy": acc[rung], "reached_floor": bool(ok)}
    return out
