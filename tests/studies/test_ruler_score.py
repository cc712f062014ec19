"""Protocol sec. 13's scorer on constructed token ids and log-likelihoods: the continuation's ids
read lm-eval's way, a tie at the top is wrong, and the pilot's rung rule (sec. 13.2)."""

from __future__ import annotations

import pytest

from studies.ruler.score import (
    PILOT_FLOOR,
    chosen,
    continuation_ids,
    is_correct,
    item_requests,
    pick_rungs,
)


def chars(s: str) -> list[int]:  # one id per character: no merges across the boundary
    return [ord(c) for c in s]


def merging(s: str) -> list[int]:  # "r: 1" would merge ":" and " " into one id (999)
    out, i = [], 0
    while i < len(s):
        if s[i:i + 2] == ": ":
            out.append(999)
            i += 2
        else:
            out.append(ord(s[i]))
            i += 1
    return out


def test_continuation_is_the_whole_less_the_prompt():
    assert continuation_ids(chars, "Answer:", "42") == [ord(" "), ord("4"), ord("2")]
    # a merge across the boundary: the prompt's ids are no prefix of the whole, so the candidate
    # is encoded alone (with its space)
    assert merging("Answer: 42")[:6] != merging("Answer:")
    assert continuation_ids(merging, "Answer:", "42") == [ord(" "), ord("4"), ord("2")]


def test_item_requests_share_the_context_with_bos():
    reqs = item_requests(chars, 1, "Q\nAnswer:", ["a", "bb", "c", "d"])
    ctx = (1, *chars("Q\nAnswer:"))
    assert [r[0] for r in reqs] == [ctx] * 4
    assert [r[1] for r in reqs] == [tuple(chars(" a")), tuple(chars(" bb")), tuple(chars(" c")), tuple(chars(" d"))]
    assert item_requests(chars, None, "Q", ["a"] * 4)[0][0] == tuple(chars("Q"))


def test_the_unique_top_wins_and_a_tie_is_wrong():
    assert chosen([-3.0, -1.0, -2.0, -5.0]) == 1
    assert is_correct([-3.0, -1.0, -2.0, -5.0], 1)
    assert not is_correct([-3.0, -1.0, -2.0, -5.0], 0)
    # the answer tied with a distractor at the top: wrong, whichever index the answer has
    assert chosen([-1.0, -1.0, -2.0, -5.0]) == -1
    assert not is_correct([-1.0, -1.0, -2.0, -5.0], 0) and not is_correct([-1.0, -1.0, -2.0, -5.0], 1)
    # a tie below the top does not matter
    assert is_correct([-0.5, -1.0, -1.0, -5.0], 0)


LADDERS = {"needle-multi": (4, 8, 16), "variable-tracking": (1, 2, 4), "common-words": (12, 8, 6)}


def test_pilot_takes_the_hardest_rung_at_the_floor_else_the_easiest():
    acc = {"needle-multi": {4: 0.9, 8: PILOT_FLOOR, 16: 0.5},
           "variable-tracking": {1: 0.3, 2: 0.2, 4: 0.1},
           "common-words": {12: 0.8, 8: 0.7, 6: 0.65}}
    got = pick_rungs(acc, LADDERS)
    assert got == {"needle-multi": {"rung": 8, "pilot_accuracy": PILOT_FLOOR, "reached_floor": True},
                   "variable-tracking": {"rung": 1, "pilot_accuracy": 0.3, "reached_floor": False},
                   "common-words": {"rung": 6, "pilot_accuracy": 0.65, "reached_floor": True}}


def test_pilot_refuses_an_unscored_rung():
    with pytest.raises(ValueError, match=r"accuracy\['common-words'\] lacks rungs \[6\]"):
        pick_rungs({"needle-multi": {4: 1, 8: 1, 16: 1}, "variable-tracking": {1: 1, 2: 1, 4: 1},
                    "common-words": {12: 1, 8: 1}}, LADDERS)


def test_pilot_skips_a_rung_that_does_not_fit_the_shortest_length():
    acc = {"needle-multi": {4: 0.9, 8: 0.8, 16: 0.7}, "variable-tracking": {1: 0.9, 2: 0.8, 4: 0.7},
           "common-words": {12: 0.2, 8: 0.9, 6: 0.1}}
    fits = {"needle-multi": {4: True, 8: True, 16: False}, "variable-tracking": {1: True, 2: True, 4: True},
            "common-words": {12: True, 8: True, 6: True}}
    got = pick_rungs(acc, LADDERS, fits)
    assert {t: v["rung"] for t, v in got.items()} == {"needle-multi": 8, "variable-tracking": 4, "common-words": 8}
    with pytest.raises(ValueError, match=r"the easiest rung 4 must fit"):
        pick_rungs(acc, LADDERS, fits | {"needle-multi": {4: False, 8: True, 16: True}})
