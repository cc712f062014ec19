"""Protocol sec. 13's scorer on constructed token ids and log-likelihoods: the continuation's ids
read lm-eval's way, a tie at the top is wrong, and the pilot's rung rule (sec. 13.2); the
shared-prefix scorer (sec. 13.8) against each candidate's own forward and the batched path on
tiny models of three families, unedited and under the six edits."""

from __future__ import annotations

import pytest
import torch

from studies.ruler.run import ruler_settings
from studies.ruler.score import (
    PILOT_FLOOR,
    chosen,
    continuation_ids,
    is_correct,
    item_requests,
    pick_rungs,
    shared_prefix_loglikelihoods,
    shared_prefix_supported,
)
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.evaluate.suites.accuracy import loglikelihoods
from tl_directional.model.sites import resolve_sites


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


def _requests(model, n_ctx: int = 40):
    """One item's shape: a shared context (BOS then seeded ids) and four continuations of 1-3
    ids, two of them sharing their first id."""
    g = torch.Generator().manual_seed(0)
    d_vocab = model.cfg.d_vocab
    ctx = [0, *torch.randint(1, d_vocab, (n_ctx - 1,), generator=g).tolist()]
    conts = [torch.randint(1, d_vocab, (n,), generator=g).tolist() for n in (1, 3, 2, 3)]
    conts[3][0] = conts[1][0]
    return [(ctx, c) for c in conts]


@pytest.mark.legacy
@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_shared_prefix_scores_equal_the_batched_path_under_every_edit(tiny_model, family):
    # sec. 13.8: the prompt run once into a KV cache gives the log-likelihoods of sec. 13.6's four
    # full forwards (learned positions, RoPE with GQA, Gemma-3's 6-token sliding window), unedited
    # and under the six edits (the hooks act on both forwards); differences are float32 round-off
    model = tiny_model(family)
    reqs = _requests(model)
    cfg = model.cfg
    with torch.no_grad():
        # independent of both paths: each candidate's own full forward, log-softmax in float64
        plain = []
        for ctx, cont in reqs:
            lp = torch.log_softmax(model(torch.tensor([ctx + cont[:-1]]))[0, len(ctx) - 1:].double(), -1)
            plain.append(float(lp[torch.arange(len(cont)), torch.tensor(cont)].sum()))
        tol = roundoff_tolerance(torch.float32, max(map(abs, plain)), cfg.d_model * cfg.n_layers * len(reqs[0][0]))
        got = shared_prefix_loglikelihoods(model, reqs)
        assert got.dtype == torch.float64 and max(abs(a - b) for a, b in zip(got.tolist(), plain, strict=True)) <= tol
        for label, *_, make in ruler_settings(model, resolve_sites(model, warn=False)):
            with make():
                want = loglikelihoods(model, reqs, batch_size=4)
                got = shared_prefix_loglikelihoods(model, reqs)
            assert (got - want).abs().max().item() <= tol, label
            acts = (want - torch.tensor(plain, dtype=torch.float64)).abs().max().item()
            assert acts > 50 * tol, label  # the edit acts, far beyond the tolerance


@pytest.mark.legacy
def test_shared_prefix_refuses_requests_without_one_context(tiny_model):
    model = tiny_model("gpt2")
    reqs = _requests(model)
    with pytest.raises(ValueError, match=r"contexts of lengths \[40, 39, 40, 40\]: they must share one context"):
        shared_prefix_loglikelihoods(model, [reqs[0], (reqs[1][0][1:], reqs[1][1]), *reqs[2:]])


@pytest.mark.bridge
def test_shared_prefix_refuses_the_bridge(tiny_model):
    # TransformerLens 4.3's bridge gives wrong logits from its KV cache (kv_cache_matches)
    model = tiny_model("llama")
    assert not shared_prefix_supported(model)
    with pytest.raises(ValueError, match=r"model is a TransformerBridge: .*HookedTransformer \(the legacy lane"):
        shared_prefix_loglikelihoods(model, _requests(model))
