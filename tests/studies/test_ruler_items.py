"""Protocol sec. 13's items: seeded and reproducible, each prompt at its length, and every answer
right by an independent reading of the prompt (regexes here, not the generator's code)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from studies.ruler.items import LADDERS, SLACK, TASKS, make_items

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [(ROOT / "tl_directional/data" / f).read_text() for f in ("kjv_heldout.txt", "prose_heldout.txt")]


def words(s: str) -> int:  # a cheap token counter; the runs pass the model's tokenizer
    return len(s.split())


@pytest.fixture(scope="module")
def items():
    return make_items(TEXTS, words, seed=0, haystacks=2, lengths=(256, 1024),
                      difficulty={"needle-multi": 8, "variable-tracking": 2})


def test_seeded_reproducible_and_one_item_per_task_per_haystack(items):
    again = make_items(TEXTS, words, seed=0, haystacks=2, lengths=(256, 1024),
                       difficulty={"needle-multi": 8, "variable-tracking": 2})
    assert again == items
    other = make_items(TEXTS, words, seed=1, haystacks=2, lengths=(256, 1024),
                       difficulty={"needle-multi": 8, "variable-tracking": 2})
    assert [i.prompt for i in other] != [i.prompt for i in items]
    assert [(i.length, i.haystack, i.task) for i in items] == [
        (n, h, t) for n in (256, 1024) for h in range(2) for t in TASKS]
    for i in items:
        assert i.length - SLACK <= words(i.prompt) <= i.length and i.prompt.endswith("\nAnswer:")
        assert len(set(i.choices)) == 4 and 0 <= i.answer < 4


def test_every_answer_is_right_by_an_independent_reading(items):
    answers = Counter()
    for i in items:
        right, wrong = i.choices[i.answer], [c for k, c in enumerate(i.choices) if k != i.answer]
        answers[i.answer] += 1
        if i.task.startswith("needle"):
            key = re.search(r"number for (\w+) mentioned", i.prompt).group(1)
            found = dict(re.findall(r"magic numbers for (\w+) is: (\d{7})\.", i.prompt))
            assert len(found) == (1 if i.task == "needle-single" else 8) == i.difficulty
            assert found[key] == right
            inside = set(found.values())
            assert all((c in inside) == (i.task == "needle-multi") for c in wrong)
        elif i.task == "variable-tracking":
            value = {}
            for name, rhs in re.findall(r"^VAR (\w+) = (VAR \w+|\d{7})\.$", i.prompt, re.M):
                value[name] = value[rhs[4:]] if rhs.startswith("VAR ") else rhs  # in order: resolvable
            asked = re.search(r"value of VAR (\w+)\?", i.prompt).group(1)
            assert value[asked] == right and len(value) == 4 * 3  # four chains of two hops
            assert set(wrong) <= set(value.values())
        else:
            listed = Counter(re.findall(r"^\d+\. (\w+)$", i.prompt, re.M))
            assert listed.most_common(1)[0][0] == right
            assert all(2 <= listed[c] < listed[right] for c in wrong)
    assert min(answers.values()) >= 1  # the right choice is not always in one place


def test_a_bad_difficulty_or_short_texts_are_refused():
    with pytest.raises(ValueError, match=r"difficulty=\{'needle-multi': 5\}: each must be a rung"):
        make_items(TEXTS, words, 0, 1, (256,), {"needle-multi": 5})
    with pytest.raises(ValueError, match="need at least 200 words"):
        make_items(["one two three"], words, 0, 1, (256,))
    assert LADDERS["needle-multi"][0] == 4  # the default is the easiest rung (sec. 13.2)


def test_a_rung_whose_statements_overrun_the_length_is_refused():
    # 16 needles of about 11 words each cannot fit 128 words: refused, not silently overlong
    with pytest.raises(ValueError, match=r"prompts exceed their length .*'needle-multi', 16, 128"):
        make_items(TEXTS, words, seed=0, haystacks=1, lengths=(128,), difficulty={"needle-multi": 16})


def test_a_long_last_word_does_not_leave_the_prompt_short():
    # every filler line ends in a path that costs 30 "tokens": the line that does not fit whole is
    # cut before its path, and the next lines' words fill the rest to within SLACK (once refused)
    vocab = [f"{a}{b}{c}word" for a in "abcdefg" for b in "hijklmn" for c in "opqrs"]
    lines = [" ".join(vocab[(7 * k + j) % len(vocab)] for j in range(12)) + " /usr/share/doc/x/" for k in range(60)]

    def paths(s: str) -> int:
        return sum(30 if "/" in w else 1 for w in s.split())

    got = make_items(["\n".join(lines)], paths, seed=0, haystacks=3, lengths=(128, 256))
    assert all(i.length - SLACK <= paths(i.prompt) <= i.length for i in got)
