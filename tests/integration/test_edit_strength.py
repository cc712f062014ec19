"""``edit_strength`` (the applied strength of an edit, per token and edited layer) against an
independent measurement written here: the branch output ``y`` of layer ``L`` is read at
``hook_attn_out`` / ``hook_mlp_out`` in a forward pass with the edit on every edited layer *but*
``L`` (so the layer's input is the edited pass's), ``y~`` in the pass with every edited layer,
and the three ratios are formed with ``torch.linalg.vector_norm``. In float64, so equality is
checked far below float32 round-off. Families: GPT-2 (output bias) and Llama (grouped KV heads)."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld

TEXTS = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]


def _out(model, batch, hook_name, edit):
    store = {}

    def grab(t, hook):  # noqa: ARG001
        store["t"] = t.detach().double()

    with torch.no_grad(), tld.apply_edits(model, *([edit] if edit is not None else [])):
        model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=[(hook_name, grab)])
    return store["t"]


def _edits(component, layers):
    if component == "mlp":
        return tld.ResidualScale("mlp", s_par=0.0, layers=layers)
    return {"value": tld.ValueScale(s_par=0.0, mode="exclusive", joint=True, layers=layers),
            "pattern": tld.DiagonalRemoval(layers=layers),
            "resid": tld.ResidualScale("attn", s_par=0.0, layers=layers)}[component]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["value", "pattern", "resid", "mlp"])
def test_strength_equals_an_independent_measurement(float64_model, family, kind):
    model = float64_model(family)
    batch = tld.prepare_inputs(model, TEXTS)
    component = "mlp" if kind == "mlp" else "attn"
    hook = f"blocks.1.hook_{component}_out"
    y = _out(model, batch, hook, _edits(kind, [0]))  # layer 1 unedited, its input edited by layer 0
    y_new = _out(model, batch, hook, _edits(kind, [0, 1]))
    with torch.no_grad():
        got = tld.edit_strength(model, batch.tokens, _edits(kind, [0, 1]), component=component,
                                attention_mask=batch.attention_mask)
    assert got.layers == [0, 1] and got.norm.shape == (*batch.tokens.shape[:1], 2, batch.tokens.shape[1])
    real = batch.attention_mask.bool()
    base = torch.linalg.vector_norm(y, dim=-1)
    norm = torch.linalg.vector_norm(y_new - y, dim=-1) / base
    retained = torch.linalg.vector_norm(y_new, dim=-1) / base
    assert float(norm[real].max()) > 1e-3  # the edit does something there
    torch.testing.assert_close(got.norm[:, 1][real], norm[real], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.energy[:, 1][real], norm[real] ** 2, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.retained[:, 1][real], retained[real], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.base_sq[:, 1][real], base[real] ** 2, rtol=1e-9, atol=1e-12)


def test_strength_means_and_refusals(float64_model):
    model = float64_model("gpt2")
    batch = tld.prepare_inputs(model, TEXTS[:1])
    with torch.no_grad():
        s = tld.edit_strength(model, batch.tokens, tld.ResidualScale("attn", s_par=0.0))
        noop = tld.edit_strength(model, batch.tokens, tld.ResidualScale("attn", s_par=1.0))
    m = s.mean()
    assert m["count"] == s.norm.numel() and 0 < m["norm"] < 1 and 0 < m["retained"] <= 1 + 1e-12
    assert m["pooled_norm"] == pytest.approx(float((s.diff_sq.sum() / s.base_sq.sum()).sqrt()))
    assert noop.mean()["norm"] == 0.0 and noop.mean()["retained"] == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="component must be 'attn' or 'mlp'.*'block'"):
        tld.edit_strength(model, batch.tokens, tld.ResidualScale("attn", s_par=0.0), component="block")
    with pytest.raises(ValueError, match="change no mlp branch output"):
        tld.edit_strength(model, batch.tokens, tld.ValueScale(s_par=0.0), component="mlp")
    with pytest.raises(ValueError, match="both in residual space.*one space at a time"):
        tld.edit_strength(model, batch.tokens, tld.ValueScale(s_par=0.0), tld.ResidualScale("attn", s_par=0.0))
