"""Nothing is left on the model after an edit context (issue 36): its ``__dict__``, every
submodule's ``__dict__`` and hook registries, and its logits are exactly as before, after a
normal exit and after the body raised."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld

from .test_edit import TEXTS

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_forward_hooks_with_kwargs",
              "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


def _state(model) -> dict:
    """The model's own ``__dict__`` (every name and the object it holds, by identity), and per
    submodule the names in its ``__dict__`` and the contents of its hook registries (mutated in
    place). A submodule's values are not compared by identity: TransformerBridge keeps
    per-forward caches there (``_pattern``, ``attention_mask_4d``) that every forward replaces,
    edited or not."""
    out = {"": ({k: id(v) for k, v in model.__dict__.items()},)}
    for name, module in model.named_modules():
        d = module.__dict__
        out[name or "<model>"] = (sorted(d), {k: list(d[k]) for k in HOOK_DICTS if k in d})
    return out


def _diff(a: tuple, b: tuple) -> str:
    if isinstance(a[0], dict):  # the model's own __dict__: names -> ids
        added, gone = sorted(set(b[0]) - set(a[0])), sorted(set(a[0]) - set(b[0]))
        replaced = sorted(k for k in set(a[0]) & set(b[0]) if a[0][k] != b[0][k])
        return f"added {added}, removed {gone}, replaced {replaced}"
    added, gone = sorted(set(b[0]) - set(a[0])), sorted(set(a[0]) - set(b[0]))
    hooks = {k: (a[1][k], b[1].get(k)) for k in a[1] if a[1][k] != b[1].get(k)}
    return f"added {added}, removed {gone}, hooks {hooks}"


EDITS = [
    tld.ValueScale(0.0),
    tld.ValueScale(0.5, mode="exclusive"),
    tld.ResidualScale("attn", 0.0, 2.0),
    tld.DiagonalRemoval(layers=[0]),
    tld.EffectiveDiagonal(0.5),
]


@pytest.mark.parametrize("raising", [False, True], ids=["normal", "raising"])
def test_apply_edits_leaves_the_model_exactly_as_it_was(tiny_model, raising):
    model = tiny_model("gpt2", fresh=True)
    batch = tld.prepare_inputs(model, TEXTS)
    with torch.no_grad():
        before_logits = model(batch.tokens, attention_mask=batch.attention_mask)
    before = _state(model)
    assert "forward" not in model.__dict__

    class Boom(Exception):
        pass

    with torch.no_grad():
        if raising:
            with pytest.raises(Boom), tld.apply_edits(model, *EDITS):
                edited = model(batch.tokens, attention_mask=batch.attention_mask)
                raise Boom
        else:
            with tld.apply_edits(model, *EDITS):
                edited = model(batch.tokens, attention_mask=batch.attention_mask)
        after_logits = model(batch.tokens, attention_mask=batch.attention_mask)

    assert not torch.equal(edited, before_logits)  # the edits did act inside the block
    after = _state(model)
    changed = {name: _diff(before[name], after[name]) for name in before if before[name] != after[name]}
    assert not changed, f"modules whose instance attributes or hooks changed: {changed}"
    assert "forward" not in model.__dict__
    assert torch.equal(after_logits, before_logits)


def test_an_instance_forward_set_before_the_context_survives_it(tiny_model):
    """What the user set on the instance is theirs: the context neither drops nor replaces it."""
    model = tiny_model("gpt2", fresh=True)
    batch = tld.prepare_inputs(model, TEXTS)
    own = type(model).forward.__get__(model)
    model.__dict__["forward"] = own
    try:
        with torch.no_grad(), tld.apply_edits(model, tld.ValueScale(0.0)):
            model(batch.tokens, attention_mask=batch.attention_mask)
        assert model.__dict__["forward"] is own
    finally:
        del model.__dict__["forward"]
