"""The paper's value-space edit form: one split per token over the concatenated heads
(``ValueScale(joint=True)``, METHOD.md sec. 4), against an independent implementation written
here with plain torch, on every causal tiny family (GPT-2, Llama with grouped KV heads, ...).

The reference re-derives the edit from the hook tensors alone: the own value of query head ``h``
is KV head ``h // (n_heads // n_kv_heads)``'s, the cross aggregate is ``z - A_tt v`` (exclusive),
and the projection is ``(y . r / r . r) r`` over the ``n_heads * d_head`` concatenation, in
float64. The library's result must match it to float32 round-off in the logits."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.model.sites import resolve_sites

from ._families import CAUSAL

TEXTS = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]


def _reference_hooks(model, mode: str, s_par: float, s_perp: float, layers):
    sites = resolve_sites(model, warn=False)
    store: dict = {}
    hooks = []
    for vs in sites.value:
        if layers is not None and vs.layer not in layers:
            continue

        def grab_v(t, hook, L=vs.layer):  # noqa: ARG001
            store[("v", L)] = t.detach()

        def grab_a(t, hook, L=vs.layer):  # noqa: ARG001
            store[("a", L)] = t.detach()

        def edit_z(z, hook, L=vs.layer):  # noqa: ARG001
            v, pattern = store.pop(("v", L)), store.pop(("a", L))
            n_heads, group = z.shape[2], z.shape[2] // v.shape[2]
            v = v.repeat_interleave(group, dim=2).double()  # [b, q, heads, d]
            z64 = z.double()
            y = z64
            if mode == "exclusive":
                n = z.shape[1]
                a_tt = pattern.double()[:, :, torch.arange(n), torch.arange(n)]  # [b, heads, q]
                y = z64 - a_tt.transpose(1, 2).unsqueeze(-1) * v
            yf, rf = y.flatten(2), v.flatten(2)
            coef = (yf * rf).sum(-1, keepdim=True) / (rf * rf).sum(-1, keepdim=True)
            par = coef * rf
            new = z64.flatten(2) + (s_par - 1.0) * par + (s_perp - 1.0) * (yf - par)
            assert n_heads * z.shape[3] == new.shape[-1]
            return new.view_as(z).to(z.dtype)

        hooks += [(vs.v_hook, grab_v), (vs.pattern_hook, grab_a), (vs.z_hook, edit_z)]
    return hooks


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("mode,s_par,s_perp,layers", [
    ("exclusive", 0.0, 1.0, None),
    ("exclusive", 0.5, 1.0, [1]),
    ("full", 0.0, 1.0, None),
    ("full", 2.0, 0.5, [0]),
])
def test_joint_edit_equals_an_independent_implementation(tiny_model, family, mode, s_par, s_perp, layers):
    model = tiny_model(family)
    batch = tld.prepare_inputs(model, TEXTS)
    with torch.no_grad():
        ref = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,
                                   fwd_hooks=_reference_hooks(model, mode, s_par, s_perp, layers))
        with tld.apply_edits(model, tld.ValueScale(s_par, s_perp, mode=mode, layers=layers, joint=True)):
            got = model(batch.tokens, attention_mask=batch.attention_mask)
        base = model(batch.tokens, attention_mask=batch.attention_mask)
    assert (got - base).abs().max() > 1e-3  # the edit does something
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", CAUSAL)
def test_joint_edit_is_bit_exact_at_scale_one_and_differs_from_per_head(tiny_model, family):
    model = tiny_model(family)
    batch = tld.prepare_inputs(model, TEXTS)
    with torch.no_grad():
        base = model(batch.tokens, attention_mask=batch.attention_mask)
        for mode in ("full", "exclusive"):
            with tld.apply_edits(model, tld.ValueScale(1.0, 1.0, mode=mode, joint=True)):
                assert torch.equal(model(batch.tokens, attention_mask=batch.attention_mask), base)
        with tld.apply_edits(model, tld.ValueScale(0.0, mode="exclusive", joint=True)):
            joint = model(batch.tokens, attention_mask=batch.attention_mask)
        with tld.apply_edits(model, tld.ValueScale(0.0, mode="exclusive")):
            per_head = model(batch.tokens, attention_mask=batch.attention_mask)
    assert (joint - per_head).abs().max() > 1e-3


def test_joint_edit_gradients_reach_a_learned_scale(tiny_model):
    model = tiny_model("llama", fresh=True)
    batch = tld.prepare_inputs(model, TEXTS)
    s = torch.full((model.cfg.n_layers,), 0.5, requires_grad=True)
    with tld.apply_edits(model, tld.ValueScale(s, mode="exclusive", joint=True)):
        loss = model(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
    loss.backward()
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


def test_joint_edit_refuses_head_scopes_and_per_head_scales(tiny_model):
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match=r"heads=\[0\] with joint=True.*heads=None"):
        tld.ValueScale(0.0, joint=True, heads=[0])
    with pytest.raises(TypeError, match="joint"):
        tld.ValueScale(0.0, joint="yes")
    per_head = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    with pytest.raises((ValueError, TypeError), match="s_par"):
        tld.ValueScale(per_head, joint=True).fwd_hooks(model)


def test_joint_spaces_are_sweep_spaces(tiny_model):
    model = tiny_model("gpt2")
    table = tld.sweep(model, TEXTS, tld.grid(["value-joint", "value-exclusive-joint"], s_par=[0.0, 1.0]),
                      progress=False)
    rows = table.set_index("label") if "label" in table else table
    assert len(rows) >= 4
