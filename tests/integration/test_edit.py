"""METHOD.md sec. 4 facts, pinned on real TransformerLens models."""

import pytest
import torch

import tl_directional as tld
from tl_directional.model.inputs import pad_sequences

from ._families import ALL, CAUSAL

TEXTS = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]


def _batch(model, side=None):
    b = tld.prepare_inputs(model, TEXTS)
    if side is None:
        return b
    seqs = [row[m.bool()].tolist() for row, m in zip(b.tokens, b.attention_mask, strict=True)]
    return pad_sequences(seqs, pad_id=0, padding_side=side)


def _run(model, batch, *edits):
    with tld.apply_edits(model, *edits):
        return model(batch.tokens, attention_mask=batch.attention_mask)


def _capture(model, batch, names, *edits):
    """Run with ``edits`` and record ``names`` *after* the edits."""
    store = {}

    def keep(name):
        def hook(t, hook):
            store[name] = t.detach().clone()
            return t
        return hook

    hooks = tld.edit_hooks(model, *edits) + [(n, keep(n)) for n in names]
    model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=hooks)
    return store


def _edits_for(family):
    edits = [
        tld.ValueScale(), tld.ValueScale(mode="exclusive"), tld.ResidualScale("attn"),
        tld.ResidualScale("mlp"), tld.EffectiveDiagonal(1.0),
        tld.ValueScale(1.0, 1.0, positions=[1, 2], heads=[0]),
        tld.ResidualScale("attn", positions=[3]),
    ]
    if family != "bert":
        edits.append(tld.ResidualScale("block"))
    else:  # pattern fires after z on the bert bridge: pattern-based edits are refused
        edits = [e for e in edits if not isinstance(e, tld.EffectiveDiagonal)
                 and not (isinstance(e, tld.ValueScale) and (e.mode == "exclusive" or e.positions))]
    return edits


@pytest.mark.parametrize("family", ALL)
def test_identity_at_scale_one_is_bit_exact(tiny_model, family):
    model = tiny_model(family)
    batch = _batch(model)
    base = model(batch.tokens, attention_mask=batch.attention_mask)
    for edit in _edits_for(family):
        out = _run(model, batch, edit)
        assert torch.equal(out, base), edit


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("s_par", [0.0, 0.5, 2.0, -1.0])
def test_vpara_equals_effective_diagonal(tiny_model, family, s_par):
    model = tiny_model(family)
    batch = _batch(model)
    a = _run(model, batch, tld.ValueScale(s_par, 1.0, mode="full"))
    b = _run(model, batch, tld.EffectiveDiagonal(s_par))
    base = model(batch.tokens, attention_mask=batch.attention_mask)
    assert (a - base).abs().max() > 1e-3  # the edit does something
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_vpara_removal_makes_beta_zero_and_diagonal_minus_gamma(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    L = 1
    names = [f"blocks.{L}.attn.hook_v", f"blocks.{L}.attn.hook_z", f"blocks.{L}.attn.hook_pattern"]
    clean = _capture(model, batch, names)
    edited = _capture(model, batch, names, tld.ValueScale(0.0, layers=[L]))
    v, z = edited[names[0]], edited[names[1]]
    beta = tld.decompose(z, v).alpha
    assert beta.abs().max() < 1e-5
    # effective-diagonal form: the new diagonal is -gamma_t, possibly negative, not renormalised
    pat = _capture(model, batch, [names[2]], tld.EffectiveDiagonal(0.0, layers=[L]))[names[2]]
    cv, cz, cp = clean[names[0]], clean[names[1]], clean[names[2]]
    a_tt = cp.diagonal(dim1=-2, dim2=-1).transpose(1, 2)
    gamma = tld.decompose(cz - a_tt.unsqueeze(-1) * cv, cv).alpha
    new_diag = pat.diagonal(dim1=-2, dim2=-1).transpose(1, 2)
    mask = batch.attention_mask.bool()
    assert torch.allclose(new_diag[mask], -gamma[mask], atol=1e-5)
    assert (new_diag[mask] < 0).any()  # not a probability row


def test_hard_diagonal_removal_renormalises_and_is_not_vpara(tiny_model):
    model = tiny_model("llama")
    batch = _batch(model)
    name = "blocks.0.attn.hook_pattern"
    pat = _capture(model, batch, [name], tld.DiagonalRemoval(layers=[0]))[name]
    mask = batch.attention_mask.bool()
    diag = pat.diagonal(dim1=-2, dim2=-1).transpose(1, 2)[mask]  # [tokens, heads]
    row_sum = pat.sum(-1).transpose(1, 2)[mask]
    first = tld.first_token_mask(batch.attention_mask)[mask]
    assert torch.allclose(row_sum, torch.ones_like(row_sum), atol=1e-5)
    assert (diag[~first] == 0).all()
    assert torch.allclose(diag[first], torch.ones_like(diag[first]))  # nothing to renormalise onto
    hard = _run(model, batch, tld.DiagonalRemoval())
    vpara = _run(model, batch, tld.ValueScale(0.0))
    assert (hard - vpara).abs().max() > 1e-3


@pytest.mark.parametrize("side", ["left", "right"])
def test_rows_without_off_diagonal_mass(tiny_model, side):
    model = tiny_model("gpt2")
    batch = _batch(model, side)
    first = tld.first_token_mask(batch.attention_mask)
    if side == "left":
        assert not first[:, 0].all()  # the first real token is not at position 0
    name = "blocks.0.attn.hook_z"
    clean = _capture(model, batch, [name])[name]
    removed = _capture(model, batch, [name], tld.ValueScale(0.0, layers=[0]))[name]
    hard = _capture(model, batch, [name], tld.DiagonalRemoval(layers=[0]))[name]
    # V-Para removal deletes the head output where o_t = v_t ...
    assert removed[first].abs().max() < 1e-6 and clean[first].abs().max() > 1e-3
    # ... hard removal leaves such rows unchanged
    assert torch.equal(hard[first], clean[first])


def test_bos_can_be_spared_with_a_position_mask(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model, "left")
    spare = ~tld.first_token_mask(batch.attention_mask)
    name = "blocks.0.attn.hook_z"
    clean = _capture(model, batch, [name])[name]
    edited = _capture(model, batch, [name], tld.ValueScale(0.0, layers=[0], positions=spare))[name]
    first = ~spare
    assert torch.equal(edited[first], clean[first])


@pytest.mark.parametrize("family", CAUSAL)
def test_gradients_flow_through_every_edit(tiny_model, family):
    model = tiny_model(family, fresh=True)
    batch = _batch(model)
    for edit in [tld.ValueScale(0.0), tld.ValueScale(0.5, 2.0, mode="exclusive"), tld.ResidualScale("attn", 0.0),
                 tld.ResidualScale("mlp", 0.5, 1.5), tld.ResidualScale("block", 0.0), tld.DiagonalRemoval(),
                 tld.EffectiveDiagonal(0.0)]:
        model.zero_grad(set_to_none=True)
        with tld.apply_edits(model, edit):
            loss = model(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
        loss.backward()
        w_v = model.blocks[0].attn.W_V
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads), edit
        assert any(g.abs().sum() > 0 for g in grads), edit
        del w_v


def test_learned_scale_receives_gradient(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    s = torch.tensor([0.3, 0.7], requires_grad=True)  # per layer
    with tld.apply_edits(model, tld.ValueScale(s)):
        loss = model(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
    loss.backward()
    assert s.grad is not None and (s.grad != 0).all()


def test_gqa_heads_use_their_kv_head(tiny_model):
    model = tiny_model("llama")
    batch = _batch(model)
    names = ["blocks.1.attn.hook_v", "blocks.1.attn.hook_z"]
    clean = _capture(model, batch, names)
    edited = _capture(model, batch, names, tld.ValueScale(0.0, layers=[1], heads=[3]))
    z0, z1, v = clean[names[1]], edited[names[1]], clean[names[0]]
    assert v.shape[2] == 2 and z0.shape[2] == 4
    assert torch.equal(z1[:, :, :3], z0[:, :, :3])  # other heads untouched
    expected = tld.decompose(z0[:, :, 3], v[:, :, 1]).perp  # kv(3) = 3 // 2 = 1
    assert torch.allclose(z1[:, :, 3], expected.float(), atol=1e-6)


def test_layer_scope_and_per_layer_tensor_agree(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    a = _run(model, batch, tld.ValueScale(0.0, layers=[1]))
    b = _run(model, batch, tld.ValueScale(torch.tensor([1.0, 0.0])))
    assert torch.equal(a, b)
    per_head = torch.ones(2, 4)
    per_head[1, 2] = 0.0
    c = _run(model, batch, tld.ValueScale(per_head))
    d = _run(model, batch, tld.ValueScale(0.0, layers=1, heads=[2]))
    assert torch.equal(c, d)


def test_per_batch_row_scales_stack_settings(tiny_model):
    model = tiny_model("neox")
    one = tld.prepare_inputs(model, TEXTS[:1])
    two = tld.TokenBatch(one.tokens.repeat(3, 1), one.attention_mask.repeat(3, 1))
    stacked = _run(model, two, tld.ResidualScale("attn", s_par=tld.scales([1.0, 0.0, 2.0], "batch")))
    for row, s in enumerate([1.0, 0.0, 2.0]):
        single = _run(model, one, tld.ResidualScale("attn", s_par=s))
        assert torch.allclose(stacked[row], single[0], atol=1e-5)


def test_position_scope_leaves_earlier_positions_alone(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    base = model(batch.tokens, attention_mask=batch.attention_mask)
    out = _run(model, batch, tld.ResidualScale("mlp", 0.0, positions=[4]))
    assert torch.equal(out[:, :4], base[:, :4])
    assert (out[:, 4] - base[:, 4]).abs().max() > 1e-4


def test_edits_compose_in_order_on_the_live_stream(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    twice = _run(model, batch, tld.ResidualScale("attn", 0.5), tld.ResidualScale("attn", 0.5))
    once = _run(model, batch, tld.ResidualScale("attn", 0.25))
    assert torch.allclose(twice, once, atol=1e-5)
    # removal then any parallel scaling: nothing parallel is left to scale
    a = _run(model, batch, tld.ResidualScale("mlp", 0.0), tld.ResidualScale("mlp", 3.0))
    b = _run(model, batch, tld.ResidualScale("mlp", 0.0))
    assert torch.allclose(a, b, atol=1e-5)


def test_user_reference_direction(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    name = "blocks.0.hook_attn_out"
    out = _capture(model, batch, [name], tld.ResidualScale("attn", 0.0, layers=[0], reference=direction))[name]
    assert (out @ direction).abs().max() < 1e-4


def test_apply_edits_removes_hooks_even_on_error(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    base = model(batch.tokens, attention_mask=batch.attention_mask)
    with pytest.raises(RuntimeError, match="boom"):
        with tld.apply_edits(model, tld.ValueScale(0.0)):
            raise RuntimeError("boom")
    assert torch.equal(model(batch.tokens, attention_mask=batch.attention_mask), base)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_fwd_hooks_slot_into_run_with_hooks(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    a = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,
                             fwd_hooks=tld.ValueScale(0.0).fwd_hooks(model))
    b = _run(model, batch, tld.ValueScale(0.0))
    assert torch.equal(a, b)


def _generate(model, tokens, use_cache, *edits):
    with tld.apply_edits(model, *edits):
        return model.generate(tokens, max_new_tokens=6, do_sample=False, use_past_kv_cache=use_cache,
                              stop_at_eos=False, verbose=False)


def test_position_scoping_during_cached_generation(tiny_model, lane):
    # TL 4.3 bridges give wrong cached logits for GPT-2 / Llama (see the xfail below): use NeoX there.
    model = tiny_model("neox" if lane == "bridge" else "gpt2")
    prompt = tld.prepare_inputs(model, TEXTS[:1]).tokens
    p = prompt.shape[1] + 2  # a generated position: seen alone, at slice index 0, when cached
    for edit in [tld.ValueScale(-3.0, 4.0, positions=[p]), tld.ResidualScale("attn", -2.0, 3.0, positions=[p]),
                 tld.ValueScale(0.0, 3.0, mode="exclusive", positions=[p]), tld.DiagonalRemoval(positions=[p])]:
        cached = _generate(model, prompt, True, edit)
        uncached = _generate(model, prompt, False, edit)
        assert torch.equal(cached, uncached), edit
    plain = _generate(model, prompt, False)
    edited = _generate(model, prompt, False, tld.ValueScale(-3.0, 4.0, positions=[p]))
    assert torch.equal(plain[:, : p + 1], edited[:, : p + 1])  # nothing before p changes


def test_effective_diagonal_refuses_cached_generation(tiny_model, lane):
    model = tiny_model("neox" if lane == "bridge" else "gpt2")
    prompt = tld.prepare_inputs(model, TEXTS[:1]).tokens
    with pytest.raises(RuntimeError, match="Use ValueScale"):
        _generate(model, prompt, True, tld.EffectiveDiagonal(0.0))


@pytest.mark.xfail(strict=True, reason="upstream: TL 4.3 bridge KV-cached generate gives wrong logits for GPT-2")
def test_upstream_bridge_cached_generation_bug(tiny_model, lane):
    if lane != "bridge":
        pytest.xfail("bridge-only upstream bug")  # keeps strictness meaningful on the legacy lane
    model = tiny_model("gpt2")
    prompt = tld.prepare_inputs(model, TEXTS[:1]).tokens
    # one cached step must give the logits of the full forward (it does on NeoX, see below)
    logits_full = model(torch.cat([prompt, prompt[:, -1:]], dim=1))[:, -1]
    _, past = model(prompt, return_type="logits_and_cache")
    logits_step = model(prompt[:, -1:], past_key_values=past)[:, -1]
    assert torch.allclose(logits_full, logits_step, atol=1e-4)


def test_edit_argument_errors(tiny_model):
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match="component must be one of"):
        tld.ResidualScale("attention")
    with pytest.raises(ValueError, match="layers has layer 7, out of range for a model with 2 layers"):
        tld.ValueScale(0.0, layers=[7]).fwd_hooks(model)
    with pytest.raises(ValueError, match=r"s_par has shape \(3,\)"):
        tld.ValueScale(torch.tensor([0.0, 1.0, 2.0])).fwd_hooks(model)
    with pytest.raises(ValueError, match="s_perp has non-finite values"):
        tld.ResidualScale("attn", s_perp=float("nan")).fwd_hooks(model)
    with pytest.raises(ValueError, match="head axis"):
        tld.ResidualScale("attn", s_par=torch.ones(2, 4)).fwd_hooks(model)
    with pytest.raises(ValueError, match="heads has 9"):
        tld.ValueScale(0.0, heads=[9]).fwd_hooks(model)
    with pytest.raises(ValueError, match="mode must be"):
        tld.ValueScale(0.0, mode="self")
    with pytest.raises(TypeError, match=r"edits\[0\] is a str"):
        tld.edit_hooks(model, "ValueScale")
    with pytest.raises(ValueError, match="dims must name"):
        tld.scales([1.0, 2.0], "row")
    with pytest.raises(ValueError, match="reference has size 5"):
        tld.ResidualScale("attn", reference=torch.ones(5)).fwd_hooks(model)
    batch = _batch(model)
    with pytest.raises(ValueError, match="s_par has 3 batch rows but the forward pass has batch 2"):
        _run(model, batch, tld.ValueScale(tld.scales([0.0, 1.0, 2.0], "batch")))


@pytest.mark.parametrize("edit", [
    tld.DiagonalRemoval(positions=[500]), tld.DiagonalRemoval(positions=[-500]),
    tld.DiagonalRemoval(positions=slice(500, None)), tld.ResidualScale("attn", 0.0, positions=[0, 500]),
    tld.ValueScale(s_par=0.0, positions=[500])])
def test_out_of_range_positions_raise_at_the_call(tiny_model, edit):
    """Issue 23 item 3: an edit scope outside the sequence is an error, not a silent no-op."""
    model = tiny_model("gpt2")
    batch = _batch(model)
    n = batch.tokens.shape[1]
    with pytest.raises(ValueError, match=rf"positions=.*500.*0\.\.{n - 1} \(or -{n}\.\.-1 from the end; "
                                         rf"sequence length {n}\); pick positions inside them"):
        _run(model, batch, edit)


def test_non_integer_positions_raise(tiny_model):
    model = tiny_model("gpt2")
    batch = _batch(model)
    with pytest.raises(TypeError, match=r"positions must be .*got \[1\.5\] \(entry 1\.5 is not an int\); pass whole"):
        _run(model, batch, tld.ValueScale(s_par=0.0, positions=[1.5]))
    # in range, negative and numpy/tensor ints keep working
    _run(model, batch, tld.ValueScale(s_par=0.0, positions=torch.tensor([1, -1])))


def test_negative_positions_count_from_each_rows_last_real_token(tiny_model):
    """Issue 23 item 2: with right padding, positions=[-1] edits each row's last real token,
    not row 0's pad column."""
    model = tiny_model("gpt2")
    batch = tld.prepare_inputs(model, ["short", "a much longer text here"])  # right padding
    lengths = batch.attention_mask.sum(-1).tolist()
    n = batch.tokens.shape[1]
    assert lengths[0] < n == lengths[1]
    name = tld.resolve_sites(model).unit("attn", 0).update_hook
    plain = _capture(model, batch, [name])[name]
    edited = _capture(model, batch, [name], tld.ResidualScale("attn", s_par=0.0, layers=[0], positions=[-1]))[name]
    changed = (edited - plain).abs().amax(-1) > 1e-6  # [batch, pos]
    expected = torch.zeros_like(changed)
    expected[0, lengths[0] - 1] = expected[1, n - 1] = True
    assert torch.equal(changed, expected)
    # without a mask the model sees every token as real: counted from the end, as before
    store = {}
    hooks = tld.edit_hooks(model, tld.ResidualScale("attn", s_par=0.0, layers=[0], positions=[-1]))
    model.run_with_hooks(batch.tokens, fwd_hooks=hooks + [(name, lambda t, hook: store.setdefault("x", t.clone()))])
    _, nomask = model.run_with_cache(batch.tokens, names_filter=[name])
    moved = (store["x"] - nomask[name]).abs().amax(-1) > 1e-6
    assert moved[:, -1].all() and not moved[:, :-1].any()


