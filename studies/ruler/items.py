"""Protocol sec. 13's items: four RULER-style tasks as four-way choices, generated offline from
a seed, filler lines of the bundled held-out texts and a token counter (the model's tokenizer in
the runs, any ``str -> int`` in the tests). A pure function of its arguments: the same seed,
texts and counter give the same items, byte for byte.

Each item's prompt is ``context + "\\n" + question + "\\nAnswer:"``; a candidate is scored as the
continuation ``" " + candidate`` (sec. 13.1). One haystack per (length, index) hosts one item of
every task; the three filler tasks share its filler lines, and the haystack is the bootstrap's
cluster (sec. 13.3).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TASKS = ("needle-single", "needle-multi", "variable-tracking", "common-words")
LENGTHS = (256, 512, 1024, 2048)
#: sec. 13.2's difficulty ladders, easiest first (needle-single has none)
LADDERS = {"needle-multi": (4, 8, 16), "variable-tracking": (1, 2, 4), "common-words": (12, 8, 6)}
#: the prompt may fall short of its target length by at most this many tokens (sec. 13.1)
SLACK = 16
N_CHAINS = 4

Counter = Callable[[str], int]


@dataclass(frozen=True)
class Item:
    """One four-way item: ``prompt`` ends with ``"Answer:"``; ``choices[answer]`` is right."""

    task: str
    length: int
    haystack: int
    difficulty: int
    prompt: str
    choices: tuple[str, str, str, str]
    answer: int


def filler_lines(texts: Sequence[str]) -> list[str]:
    """Non-empty lines of the texts, in order, each stripped (a haystack is a run of them)."""
    return [ln.strip() for t in texts for ln in t.splitlines() if ln.strip()]


def vocabulary(lines: Sequence[str]) -> list[str]:
    """Distinct lower-case alphabetic words of 5-10 letters, in first-seen order (keys, list words)."""
    seen: dict[str, None] = {}
    for ln in lines:
        for w in re.findall(r"\b[A-Za-z]{5,10}\b", ln):
            seen.setdefault(w.lower(), None)
    return list(seen)


def _number(rng: random.Random, avoid: set[str]) -> str:
    while (n := str(rng.randrange(10**6, 10**7))) in avoid:
        pass
    avoid.add(n)
    return n


def _with_answer(rng: random.Random, answer: str, distractors: list[str]) -> tuple[tuple[str, ...], int]:
    choices = [answer, *distractors]
    rng.shuffle(choices)
    return tuple(choices), choices.index(answer)


def _fill(lines, start: int, inserts: list[str], question: str, length: int, count: Counter,
          rng: random.Random) -> str:
    """The prompt: filler lines from ``start`` with ``inserts`` at drawn depths (their order kept),
    grown line by line while the whole prompt stays within ``length`` tokens."""
    tail = "\n" + question + "\nAnswer:"
    body: list[str] = []
    i = start
    while True:
        cand = lines[i % len(lines)]
        if count("\n".join([*body, cand, *inserts]) + tail) > length:
            break
        body.append(cand)
        i += 1
    def words_that_fit(line: str) -> None:
        part: list[str] = []  # the line's words, in order, each that still fits
        for w in line.split():  # (a long word, a path of many tokens, is passed over, not the end)
            if count("\n".join([*body, " ".join([*part, w]), *inserts]) + tail) > length:
                continue
            part.append(w)
        if part:
            body.append(" ".join(part))

    words_that_fit(cand)
    # a passed-over long word can leave the prompt more than SLACK short: the next lines' words
    # then fill it, each line its own (a prompt already within SLACK is unchanged)
    for j in range(i + 1, i + 1 + len(lines)):
        if count("\n".join([*body, *inserts]) + tail) >= length - SLACK:
            break
        words_that_fit(lines[j % len(lines)])
    depths = sorted(rng.randrange(len(body) + 1) for _ in inserts)
    for k, (d, s) in enumerate(zip(depths, inserts, strict=True)):
        body.insert(d + k, s)
    return "\n".join(body) + tail


def _needles(rng, vocab, lines, start, length, count, k: int, task: str, h: int) -> Item:
    avoid: set[str] = set()
    keys = rng.sample(vocab, k)
    values = [_number(rng, avoid) for _ in keys]
    say = [f"One of the special magic numbers for {key} is: {v}." for key, v in zip(keys, values, strict=True)]
    q = f"Question: What is the special magic number for {keys[0]} mentioned in the text?"
    rng.shuffle(say)
    prompt = _fill(lines, start, say, q, length, count, rng)
    wrong = values[1:4] if k > 1 else [_number(rng, avoid) for _ in range(3)]
    choices, answer = _with_answer(rng, values[0], wrong)
    return Item(task, length, h, k, prompt, choices, answer)


def _chains(rng, vocab, lines, start, length, count, hops: int, h: int) -> Item:
    avoid: set[str] = set()
    names = [w.upper() for w in rng.sample(vocab, N_CHAINS * (hops + 1))]
    chains = [names[c * (hops + 1):(c + 1) * (hops + 1)] for c in range(N_CHAINS)]
    starts = [_number(rng, avoid) for _ in chains]
    steps = [[f"VAR {ch[0]} = {v}."] + [f"VAR {ch[j]} = VAR {ch[j - 1]}." for j in range(1, hops + 1)]
             for ch, v in zip(chains, starts, strict=True)]
    # interleave the chains, each chain's statements in order
    order = [c for c in range(N_CHAINS) for _ in range(hops + 1)]
    rng.shuffle(order)
    pos = [0] * N_CHAINS
    say = []
    for c in order:
        say.append(steps[c][pos[c]])
        pos[c] += 1
    q = f"Question: What is the value of VAR {chains[0][-1]}?"
    prompt = _fill(lines, start, say, q, length, count, rng)
    choices, answer = _with_answer(rng, starts[0], starts[1:])
    return Item("variable-tracking", length, h, hops, prompt, choices, answer)


def _common_words(rng, vocab, length, count, f: int, h: int) -> Item:
    top, *rare = rng.sample(vocab, 4)
    words = [top] * f + [w for w in rare for _ in range(max(2, f // 2))]
    rest = [w for w in vocab if w not in (top, *rare)]
    rng.shuffle(rest)
    q = "Question: Which word occurs most often in the numbered list above?"

    def prompt(ws):
        return "\n".join(f"{i + 1}. {w}" for i, w in enumerate(ws)) + "\n" + q + "\nAnswer:"

    shuffled = list(words)
    rng.shuffle(shuffled)
    for w in rest:  # grow the list with once-only words at drawn places while it fits
        trial = list(shuffled)
        trial.insert(rng.randrange(len(trial) + 1), w)
        if count(prompt(trial)) > length:
            break
        shuffled = trial
    choices, answer = _with_answer(rng, top, rare)
    return Item("common-words", length, h, f, prompt(shuffled), choices, answer)


def make_items(texts: Sequence[str], count: Counter, seed: int, haystacks: int,
               lengths: Sequence[int] = LENGTHS, difficulty: dict[str, int] | None = None,
               check: bool = True) -> list[Item]:
    """``haystacks`` haystacks per length, one item of every task in each (:data:`TASKS` order),
    from ``random.Random(seed)``; ``difficulty`` picks a rung of :data:`LADDERS` per task (default
    the easiest). Every prompt is at most its length and within :data:`SLACK` of it by ``count``
    (``check=False``: not checked, for a caller that checks the items it asks about, such as the
    pilot's fit rule).

    Raises:
        ValueError: a difficulty off its ladder, texts too short to fill the lengths, or a rung
            whose statements alone exceed a length.
    """
    chosen = {t: ladder[0] for t, ladder in LADDERS.items()} | (difficulty or {})
    bad = {t: d for t, d in chosen.items() if d not in LADDERS.get(t, ())}
    if bad:
        raise ValueError(f"difficulty={bad}: each must be a rung of {LADDERS}; pick one per task")
    lines = filler_lines(texts)
    vocab = vocabulary(lines)
    if len(vocab) < 200 or count("\n".join(lines)) < 2 * max(lengths):
        raise ValueError(f"texts give {len(vocab)} words and {count(chr(10).join(lines))} tokens: need at "
                         f"least 200 words and twice the longest length ({max(lengths)}); pass the bundled texts")
    rng = random.Random(seed)
    items = []
    for length in lengths:
        for h in range(haystacks):
            start = rng.randrange(len(lines))
            items += [
                _needles(rng, vocab, lines, start, length, count, 1, "needle-single", h),
                _needles(rng, vocab, lines, start, length, count, chosen["needle-multi"], "needle-multi", h),
                _chains(rng, vocab, lines, start, length, count, chosen["variable-tracking"], h),
                _common_words(rng, vocab, length, count, chosen["common-words"], h),
            ]
    if not check:
        return items
    long = [(i.task, i.difficulty, i.length, i.haystack) for i in items if count(i.prompt) > i.length]
    if long:  # the inserted statements alone overrun the length (a hard rung at a short length)
        raise ValueError(f"{len(long)} prompts exceed their length (first: task, difficulty, length, haystack = "
                         f"{long[0]}): the rung's statements do not fit; pick an easier rung or a longer length")
    short = [(i.task, i.length, i.haystack) for i in items if count(i.prompt) < i.length - SLACK]
    if short:
        raise ValueError(f"{len(short)} prompts fall more than {SLACK} tokens short of their length "
                         f"(first {short[0]}): the filler lines are too long for this counter")
    return items
