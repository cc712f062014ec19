"""split_logit_lens takes its input the TransformerLens 4.3 ``logit_lens`` way (issue 48):

* texts: one text (or texts of one length) is exactly the ``model.to_tokens`` call; texts of
  unequal lengths are exactly the token call on the texts right-padded by hand here with a mask
  built from their lengths (each text tokenised by ``to_tokens``);
* ``cache=``: a ``run_with_cache`` cache (or a dict of its tensors) gives the uncached call's
  result bit for bit, and runs no forward;
* ``positions=``: the full result at the selected positions (within float32 round-off: the
  unembedding's matrix product rounds by the number of rows), with the selected indices recorded;
* every bad input: one ``LensInputError`` naming the argument, the valid range and the fix.
"""

from __future__ import annotations

import pytest
import torch

from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.evaluate.lens import LensInputError, split_logit_lens

GEN = torch.Generator().manual_seed(48)
TOKENS = torch.randint(1, 500, (2, 7), generator=GEN)
TARGETS = torch.randint(1, 500, (2, 7), generator=GEN)
TEXTS = ["hello world", "hi"]
FIELDS = ("lens_logits", "full", "parallel_if_first", "parallel_if_last", "step_full")


def _same(a, b) -> None:
    """Every tensor of two results equal bit for bit (NaN where the other has NaN)."""
    for name in (*FIELDS, "targets", "positions"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=0, rtol=0, equal_nan=True,
                                   msg=name)


def test_texts_are_the_to_tokens_call(tiny_model):
    model = tiny_model("gpt2")
    one = split_logit_lens(model, TEXTS[0], targets=" w")
    _same(one, split_logit_lens(model, model.to_tokens(TEXTS[0]), targets=" w"))
    # unequal lengths: each text by to_tokens (BOS prepended by default), right-padded, mask by length
    rows = [model.to_tokens(t)[0].tolist() for t in TEXTS]
    assert rows[0][0] == model.tokenizer.bos_token_id and len(rows[0]) > len(rows[1])
    width = max(len(r) for r in rows)
    padded = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    got = split_logit_lens(model, TEXTS, targets=[" w", 7])
    _same(got, split_logit_lens(model, padded, targets=[" w", 7], attention_mask=mask))
    assert torch.isnan(got.lens_logits[:, 1, len(rows[1]):]).all()
    assert not torch.isnan(got.lens_logits[:, 1, :len(rows[1])]).any()


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_a_cache_gives_the_uncached_result_without_a_forward(tiny_model, monkeypatch, family):
    model = tiny_model(family)
    plain = split_logit_lens(model, TOKENS, targets=TARGETS)
    last = split_logit_lens(model, TOKENS, targets=TARGETS[:, -1], positions=-1)
    _, cache = model.run_with_cache(TOKENS)
    as_dict = {name: cache[name] for name in cache.keys()}

    def no_forward(*args, **kwargs):
        raise AssertionError("the cached lens ran the model")

    monkeypatch.setattr(model, "run_with_hooks", no_forward)
    monkeypatch.setattr(model, "forward", no_forward)
    _same(split_logit_lens(model, cache=cache, targets=TARGETS), plain)
    _same(split_logit_lens(model, TOKENS, cache=as_dict, targets=TARGETS), plain)
    _same(split_logit_lens(model, cache=cache, targets=TARGETS[:, -1], positions=-1), last)


@pytest.mark.parametrize(
    ("positions", "index"),
    [(-1, [6]), ([0, -2], [0, 5]), (slice(2, None), [2, 3, 4, 5, 6]), ((1, 6, 2), [1, 3, 5]),
     (torch.tensor([3, 3, 0]), [3, 3, 0])],
)
def test_positions_are_the_full_result_at_those_positions(tiny_model, positions, index):
    model = tiny_model("llama")
    full = split_logit_lens(model, TOKENS, targets=TARGETS)
    got = split_logit_lens(model, TOKENS, targets=TARGETS[:, index], positions=positions)
    assert got.positions.tolist() == index
    assert torch.equal(got.targets, TARGETS[:, index])
    limit = roundoff_tolerance(torch.float32, float(full.lens_logits.abs().max()), int(model.cfg.d_model))
    for name in FIELDS:
        gap = float((getattr(got, name) - getattr(full, name)[..., index]).abs().max())
        assert gap <= limit, (name, gap, limit)
    frame = got.to_frame()
    assert sorted(set(frame["position"])) == sorted(set(index))
    assert got.shares(position=-1)["final_logit"] == float(got.lens_logits[-1, 0, -1])


def _cache_of(model, **kwargs):
    return model.run_with_cache(TOKENS, **kwargs)[1]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda m: dict(tokens=TEXTS, cache=_cache_of(m)), "tokens must be None or the [batch, pos] token tensor"),
        (lambda m: dict(tokens=TEXTS, attention_mask=torch.ones(2, 3)), "attention_mask is built here for texts"),
        (lambda m: dict(tokens=["hi", ""]), "tokens[1] is an empty string"),
        (lambda m: dict(tokens=["hi", 3]), "tokens[1] is int, not a string"),
        (lambda m: dict(tokens="a b " * 200), "more than the model's context n_ctx=128"),
        (lambda m: dict(tokens=None), "tokens is None and no cache was given"),
        (lambda m: dict(cache=_cache_of(m, names_filter=lambda n: n.endswith("hook_resid_pre"))),
         "cache lacks 7 of the 9 hooks the lens reads: ['blocks.0.hook_attn_out'"),
        (lambda m: dict(tokens=TOKENS[:1], cache=_cache_of(m)), "expected [batch, pos, d_model]=[1, 7, 32]"),
        (lambda m: dict(cache=TOKENS), "cache must be an ActivationCache or a mapping"),
        (lambda m: dict(cache={k: v.clone().fill_(float("nan")) if k.endswith("attn_out") else v
                              for k, v in _cache_of(m).items()}),
         "cache['blocks.0.hook_attn_out'] holds NaN or inf at 448 real-token entries"),
        (lambda m: dict(tokens=TOKENS, positions=7), "[7] outside the 7 positions of tokens"),
        (lambda m: dict(tokens=TOKENS, positions=[0, -8]), "[-8] outside the 7 positions"),
        (lambda m: dict(tokens=TOKENS, positions=slice(5, 2)), "selects none of the 7 positions"),
        (lambda m: dict(tokens=TOKENS, positions=True), "is not a position selection"),
        (lambda m: dict(tokens=TOKENS, positions=torch.tensor([0.5])), "positions must be integer indices"),
        (lambda m: dict(tokens=TOKENS, positions=-1, targets=TARGETS),
         "[batch, pos]=[2, 1] tensor (pos = the 1 selected positions, as TransformerLens aligns them: pass "
         "targets[:, positions]"),
    ],
)
def test_bad_inputs_name_the_argument_and_the_fix(tiny_model, call, needle):
    model = tiny_model("gpt2")
    kwargs = {"targets": 7, **call(model)}
    with pytest.raises(LensInputError) as info:
        split_logit_lens(model, **kwargs)
    assert needle in str(info.value)
    if "cache lacks" in needle:  # the fix: a names_filter keeping every kind the lens reads
        assert "'hook_attn_out', 'hook_mlp_out', 'hook_resid_mid', 'hook_resid_post'" in str(info.value)
