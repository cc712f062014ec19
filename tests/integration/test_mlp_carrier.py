"""MLP-internal carrier edits (``MLPCarrierScale``, METHOD.md sec. 4 "MLP carrier") on tiny seeded
models: a plain MLP (GPT-2, NeoX: ``h = phi(W_in x)``) and a gated one (Llama:
``h = phi(W_gate x) * (W_in x)``), against an independent implementation written here.

The reference reads the MLP's input, carrier and output at TransformerLens's familiar hook names
(``mlp.hook_in`` on the bridge, ``ln2.hook_normalized`` times the RMSNorm gain on the legacy lane;
``mlp.hook_post``; ``hook_mlp_out``) and edits them with an explicit loop over the width-d blocks
in float64; the library's result must match it to float32 round-off in the logits."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.core.carrier import CarrierShapeError
from tl_directional.edit import EDIT_SPACES, edits_for_space
from tl_directional.evaluate.sweeps import find_safe_scale, grid, sweep
from tl_directional.model.load import build_tiny_hf_model, load_model, tl_lane
from tl_directional.model.mlp_carrier import CarrierUnavailableError, carrier_site, down_weight

from ._families import CAUSAL, EXTRA, LOADABLE

TEXTS = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]


@pytest.fixture(scope="module")
def odd_llama(tmp_path_factory):
    """A gated tiny Llama whose d_mlp = 80 is not a multiple of d_model = 32 (blocks 32, 32, 16)."""
    return load_model(build_tiny_hf_model("llama", tmp_path_factory.mktemp("odd-llama"), seed=1, d_mlp=80)).eval()


def _x_hook(model, L):
    if tl_lane() == "bridge":
        return f"blocks.{L}.mlp.hook_in", None
    ln = model.blocks[L].ln2
    return f"blocks.{L}.ln2.hook_normalized", (ln.w if type(ln).__name__ == "RMSNorm" else None)


def _blocks(t, d):
    """[..., d_mlp] -> list of zero-padded width-d float64 blocks and their real widths."""
    out = []
    for start in range(0, t.shape[-1], d):
        stop = min(start + d, t.shape[-1])
        b = torch.zeros(*t.shape[:-1], d, dtype=torch.float64)
        b[..., : stop - start] = t[..., start:stop].double()
        out.append((start, stop, b))
    return out


def _proj(u, r):
    return (u * r).sum(-1, keepdim=True) / (r * r).sum(-1, keepdim=True) * r


def _reference_hooks(model, site, s_par, s_perp, layers):
    d = model.cfg.d_model
    store: dict = {}
    hooks = []
    for L in range(model.cfg.n_layers):
        if layers is not None and L not in layers:
            continue
        x_name, gain = _x_hook(model, L)

        def grab_x(t, hook, L=L, gain=gain):  # noqa: ARG001
            store[("x", L)] = (t if gain is None else t * gain).detach().double()

        def grab_h(t, hook, L=L):  # noqa: ARG001
            store[("h", L)] = t.detach().double()

        def edit_h(h, hook, L=L):  # noqa: ARG001
            x = store.pop(("x", L))
            new = h.double().clone()
            for start, stop, hg in _blocks(h, d):
                par = _proj(hg, x)
                new[..., start:stop] = (s_par * par + s_perp * (hg - par))[..., : stop - start]
            return new.to(h.dtype)

        def edit_out(y, hook, L=L):  # noqa: ARG001
            h = store.pop(("h", L))
            w = model.blocks[L].mlp.W_out.detach().double()
            new = y.double()
            for start, stop, hg in _blocks(h, d):
                yg = h[..., start:stop] @ w[start:stop]
                par = _proj(yg, hg)
                new = new + (s_par - 1.0) * par + (s_perp - 1.0) * (yg - par)
            return new.to(y.dtype)

        if site == "input":
            hooks += [(x_name, grab_x), (f"blocks.{L}.mlp.hook_post", edit_h)]
        else:
            hooks += [(f"blocks.{L}.mlp.hook_post", grab_h), (f"blocks.{L}.hook_mlp_out", edit_out)]
    return hooks


def _run(model, *edits, hooks=()):
    batch = tld.prepare_inputs(model, TEXTS)
    with torch.no_grad():
        if hooks:
            return model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=list(hooks))
        with tld.apply_edits(model, *edits):
            return model(batch.tokens, attention_mask=batch.attention_mask)


@pytest.mark.parametrize("family", CAUSAL)
def test_the_down_projection_is_what_the_reference_assumes(tiny_model, family):
    """h @ W_out (+ b_out) is the MLP output at hook_mlp_out: the reference's block contributions
    y_g = W_out[I_g]^T h_g sum to the real output."""
    model = tiny_model(family)
    batch = tld.prepare_inputs(model, TEXTS)
    names = {"blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out"}
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                    names_filter=lambda n: n in names)
    b = getattr(model.blocks[1].mlp, "b_out", None)
    want = cache["blocks.1.mlp.hook_post"] @ down_weight(model, 1) + (0 if b is None else b)
    torch.testing.assert_close(want, cache["blocks.1.hook_mlp_out"], rtol=1e-5, atol=1e-5)
    site = carrier_site(model, 1)
    assert site.gated == (family == "llama") and site.d_mlp == 4 * model.cfg.d_model


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("site", ["input", "block"])
def test_scale_one_is_bit_exact(tiny_model, family, site):
    model = tiny_model(family)
    base = _run(model)
    assert torch.equal(_run(model, tld.MLPCarrierScale(1.0, 1.0, site=site)), base)
    assert torch.equal(_run(model, *edits_for_space(f"mlp-carrier-{site}", 1.0, 1.0)), base)


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("site", ["input", "block"])
@pytest.mark.parametrize("s_par,s_perp,layers", [(0.0, 1.0, None), (1.0, 0.0, [1]), (0.5, 2.0, [0])])
def test_equals_an_independent_implementation(tiny_model, family, site, s_par, s_perp, layers):
    model = tiny_model(family)
    got = _run(model, tld.MLPCarrierScale(s_par, s_perp, site=site, layers=layers))
    ref = _run(model, hooks=_reference_hooks(model, site, s_par, s_perp, layers))
    assert (got - _run(model)).abs().max() > 1e-3  # the edit does something
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("site", ["input", "block"])
def test_d_mlp_not_a_multiple_pads_or_refuses(odd_llama, site):
    model = odd_llama
    got = _run(model, tld.MLPCarrierScale(0.0, 1.0, site=site))
    ref = _run(model, hooks=_reference_hooks(model, site, 0.0, 1.0, None))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(_run(model, tld.MLPCarrierScale(1.0, 1.0, site=site)), _run(model))
    with pytest.raises(CarrierShapeError, match=r"d_mlp=80 is not a multiple of d_model=32.*remainder='pad'"):
        tld.MLPCarrierScale(0.0, site=site, remainder="error").fwd_hooks(model)


def test_gradients_reach_the_scales_and_the_weights(tiny_model):
    model = tiny_model("llama", fresh=True)
    batch = tld.prepare_inputs(model, TEXTS)
    for site in ("input", "block"):
        model.zero_grad()
        s = torch.full((model.cfg.n_layers,), 0.5, requires_grad=True)
        with tld.apply_edits(model, tld.MLPCarrierScale(s_par=s, site=site)):
            loss = model(batch.tokens, attention_mask=batch.attention_mask).float().logsumexp(-1).mean()
        loss.backward()
        assert s.grad is not None and bool((s.grad != 0).all()) and bool(torch.isfinite(s.grad).all())
        w = down_weight(model, 0)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
        assert w.requires_grad


def test_positions_scope_the_edit(tiny_model):
    model = tiny_model("gpt2")
    base = _run(model)
    got = _run(model, tld.MLPCarrierScale(0.0, site="input", positions=[3]))
    assert torch.equal(got[:, :3], base[:, :3])  # causal: earlier positions see no change
    assert (got[:, 3] - base[:, 3]).abs().max() > 1e-4


def test_registered_spaces_run_in_sweep_and_safe_scale(tiny_model):
    model = tiny_model("llama")
    assert {"mlp-carrier-input", "mlp-carrier-block"} <= set(EDIT_SPACES)
    settings = grid("mlp-carrier-input,mlp-carrier-block", s_par=[0.0, 0.5, 1.0])
    one = sweep(model, TEXTS, settings, batch_size=2, progress=False)
    stacked = sweep(model, TEXTS, settings, batch_size=2, progress=False, stack=3)
    ident = one[(one["s_par"] == 1.0) & (one["label"] != "baseline")]
    assert len(ident) == 2 and (ident["delta_loss"] == 0.0).all()
    assert (one[one["s_par"] == 0.0]["delta_loss"].abs() > 0).all()
    torch.testing.assert_close(torch.tensor(one["delta_loss"].to_numpy()),
                               torch.tensor(stacked["delta_loss"].to_numpy()), rtol=1e-4, atol=1e-5)
    (res,) = find_safe_scale(model, TEXTS, "mlp-carrier-block", budget=0.05, grid_points=3, refine_steps=1)
    assert res.interval[0] <= 1.0 <= res.interval[1]


def test_bad_arguments_name_the_fix(tiny_model):
    with pytest.raises(ValueError, match=r"site must be one of \('input', 'block'\).*got 'output'"):
        tld.MLPCarrierScale(0.0, site="output")
    with pytest.raises(ValueError, match=r"remainder must be one of \('pad', 'error'\)"):
        tld.MLPCarrierScale(0.0, remainder="drop")
    with pytest.raises(ValueError, match="eps must be a finite float >= 0"):
        tld.MLPCarrierScale(0.0, eps=float("nan"))
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match="residual-space edits act on the whole update; drop the head axis"):
        tld.MLPCarrierScale(torch.zeros(model.cfg.n_layers, model.cfg.n_heads)).fwd_hooks(model)
    with pytest.raises(ValueError, match="heads must be None"):
        edits_for_space("mlp-carrier-input", 0.0, heads=[0])


@pytest.mark.skipif("mixtral" not in LOADABLE, reason="no tiny Mixtral on this lane")
def test_mixture_of_experts_is_refused(tiny_model_dir):
    model = load_model(tiny_model_dir("mixtral")).eval()
    with pytest.raises(CarrierUnavailableError, match="mixture-of-experts MLP.*ResidualScale\\('mlp'\\)"):
        tld.MLPCarrierScale(0.0).fwd_hooks(model)
    with pytest.raises(CarrierUnavailableError, match="mixture-of-experts MLP"):
        tld.profile(model, TEXTS, carrier=True, progress=False)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_carrier_profile_equals_a_loop_over_the_cache(tiny_model, family):
    from tl_directional.measure.carrier import carrier_profile

    model = tiny_model(family)
    d = model.cfg.d_model
    table = carrier_profile(model, TEXTS, exclude_first_token=True)
    batch = tld.prepare_inputs(model, TEXTS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    mask = batch.attention_mask.bool()
    mask &= ~tld.first_token_mask(batch.attention_mask)
    for L in range(model.cfg.n_layers):
        x_name, gain = _x_hook(model, L)
        x = cache[x_name] if gain is None else cache[x_name] * gain
        x, h = x[mask].detach().double(), cache[f"blocks.{L}.mlp.hook_post"][mask].detach().double()
        w = model.blocks[L].mlp.W_out.detach().double()
        par_in = tot_in = par_blk = tot_blk = 0.0
        for start, stop, hg in _blocks(h, d):
            par_in += float((_proj(hg, x) ** 2).sum())
            tot_in += float((hg ** 2).sum())
            yg = h[:, start:stop] @ w[start:stop]
            par_blk += float((_proj(yg, hg) ** 2).sum())
            tot_blk += float((yg ** 2).sum())
        row = table[table["layer"] == L].iloc[0]
        assert row["carrier_tokens"] == int(mask.sum()) and row["carrier_blocks"] == 4
        assert row["carrier_input_par_share"] == pytest.approx(par_in / tot_in, rel=1e-4)
        assert row["carrier_block_par_share"] == pytest.approx(par_blk / tot_blk, rel=1e-4)
        assert row["carrier_input_energy_ratio"] == pytest.approx((par_in / (tot_in - par_in)) ** 0.5, rel=1e-4)


def test_profile_carries_the_carrier_columns_on_the_mlp_rows(tiny_model):
    from tl_directional.measure.carrier import CARRIER_COLUMNS, carrier_profile

    model = tiny_model("llama")
    prof = tld.profile(model, TEXTS, carrier=True, progress=False)
    mlp = prof.residual[prof.residual["component"] == "mlp"].sort_values("layer")
    other = prof.residual[prof.residual["component"] != "mlp"]
    want = carrier_profile(model, TEXTS).sort_values("layer")
    for col in CARRIER_COLUMNS:
        assert mlp[col].to_numpy().tolist() == pytest.approx(want[col].to_numpy().tolist(), rel=1e-6)
        assert other[col].isna().all()
    assert ((mlp["carrier_input_par_share"] > 0) & (mlp["carrier_input_par_share"] < 1)).all()
    assert "carrier_input_par_share" not in tld.profile(model, TEXTS, progress=False).residual


@pytest.mark.parametrize("site", ["input", "block"])
def test_training_variant_trains_with_the_carrier_edit(tmp_path, tok_dir, data, site):
    from tests.integration._training import cfg
    from tl_directional import training as T

    (e,) = T.variant_edits(f"carrier-{site}-para")
    assert type(e) is tld.MLPCarrierScale and (e.s_par, e.s_perp, e.site, e.layers) == (0.0, 1.0, site, None)
    tr = T.Trainer(cfg(tok_dir, variant=f"carrier-{site}-para"), tmp_path / site, data=data)
    tr.model.train()
    with tr.model.hooks(fwd_hooks=tr.hooks):
        loss = tr.model(tr.batch(0), return_type="loss")
    with torch.no_grad():
        plain = tr.model(tr.batch(0), return_type="loss")
    assert torch.isfinite(loss) and loss.item() != plain.item()  # the edit is on during training
    loss.backward()
    assert all(p.grad is not None for _, p in tr.named_params)


def test_cli_sweep_and_view_take_the_carrier_spaces(tiny_model_dir, tmp_path):
    import pandas as pd

    from tests.integration.test_habits import _cli
    from tl_directional.views import sweep_curves

    text = tmp_path / "t.txt"
    text.write_text(" ".join(TEXTS * 4))
    rc, err = _cli("sweep", "--model", tiny_model_dir("gpt2"), "--text", text, "--space",
                   "mlp-carrier-input,mlp-carrier-block", "--s-par=0,0.5", "--out", tmp_path / "o", "--quiet",
                   "--max-sequences", "2", "--seq-len", "32")
    assert rc == 0, err
    table = pd.read_csv(tmp_path / "o" / "sweep.csv")
    assert {"mlp-carrier-input", "mlp-carrier-block"} <= set(table["space"])
    assert (table["status"] == "ok").all()
    assert sweep_curves(table) is not None


@pytest.mark.parametrize("site", ["input", "block"])
def test_position_scoping_during_cached_generation(tiny_model, lane, site):
    # as in test_edit.py: TL 4.3 bridges give wrong cached logits for GPT-2 / Llama, so NeoX there
    model = tiny_model("neox" if lane == "bridge" else "gpt2")
    prompt = tld.prepare_inputs(model, TEXTS[:1]).tokens
    p = prompt.shape[1] + 2  # a generated position: seen alone, at slice index 0, when cached

    def generate(use_cache, *edits):
        with tld.apply_edits(model, *edits):
            return model.generate(prompt, max_new_tokens=6, do_sample=False, use_past_kv_cache=use_cache,
                                  stop_at_eos=False, verbose=False)

    edit = tld.MLPCarrierScale(-3.0, 4.0, site=site, positions=[p])
    assert torch.equal(generate(True, edit), generate(False, edit))
    plain, edited = generate(False), generate(False, edit)
    assert torch.equal(plain[:, : p + 1], edited[:, : p + 1])  # nothing before p changes
    assert not torch.equal(plain, edited)


MOE = ("mixtral", "qwen3_moe", "gpt_oss")


@pytest.mark.parametrize("family", [f for f in EXTRA if f not in MOE])
def test_every_dense_family_reads_its_carrier_right(tiny_model_dir, family):
    """On every other loadable family: the hook points the edit uses are the MLP's (x @ W_in gives
    the up projection's output, h @ W_out + b the down projection's output), scale 1 is bit-exact,
    and parallel removal at the input site leaves each edited block orthogonal to x."""
    model = load_model(tiny_model_dir(family)).eval()
    d = model.cfg.d_model
    batch = tld.prepare_inputs(model, TEXTS)
    L = 1
    site = carrier_site(model, L)
    mlp = model.blocks[L].mlp
    up = f"blocks.{L}.mlp.in.hook_out" if tl_lane() == "bridge" else \
        f"blocks.{L}.mlp.hook_pre{'_linear' if site.gated else ''}"
    names = {site.input_hook, site.carrier_hook, site.output_hook, up}
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                    names_filter=lambda n: n in names)
    x = cache[site.input_hook] * (1 if site.input_scale is None else site.input_scale.detach())
    b_in, b_out = getattr(mlp, "b_in", None), getattr(mlp, "b_out", None)
    w_in = mlp.W_in.detach()
    if w_in.shape[1] == cache[up].shape[-1]:  # (a fused gate-up weight has no separate W_in to check)
        torch.testing.assert_close(x @ w_in + (0 if b_in is None else b_in.detach()), cache[up], rtol=1e-4, atol=1e-4)
    if site.output_hook is not None:
        want = cache[site.carrier_hook] @ down_weight(model, L).detach() + (0 if b_out is None else b_out.detach())
        torch.testing.assert_close(want, cache[site.output_hook], rtol=1e-4, atol=1e-4)
    base = _run(model)
    for s in ("input", "block"):
        if s == "block" and site.output_hook is None:
            continue
        assert torch.equal(_run(model, tld.MLPCarrierScale(1.0, 1.0, site=s)), base)
    got: dict = {}
    hooks = tld.MLPCarrierScale(0.0, 1.0, site="input", layers=[L]).fwd_hooks(model)
    hooks.append((site.carrier_hook, lambda t, hook: got.setdefault("h", t.detach())))
    with torch.no_grad():
        model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=hooks)
    h = got["h"].double()
    full = (h.shape[-1] // d) * d  # the whole blocks (a padded last block is not orthogonal by design)
    dots = (h[..., :full].unflatten(-1, (-1, d)) * x.double().unsqueeze(-2)).sum(-1)
    scale = h.norm(dim=-1, keepdim=True) * x.double().norm(dim=-1, keepdim=True)
    assert float((dots.abs() / scale).max()) < 1e-5
