"""``reference=`` on the analysis verbs (issue 48): profile, split_logit_attribution,
split_logit_lens and ResidualScale split against a ``[d]`` direction, a ``[k, d]`` subspace
(k = 3) and a per-layer set, each checked against a projection written here from
``run_with_cache`` activations and ``torch.linalg`` (no library split code), on tiny float64
GPT-2, Llama-GQA and Gemma-3 models; the default reference gives today's output exactly; every
bad reference is one clear error naming the argument.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_directional as tld
from tests.integration._families import LOADABLE
from tl_directional.model.reference import resolve_reference
from tl_directional.model.weights import final_norm_weight

FAMILIES = tuple(f for f in ("gpt2", "llama", "gemma3") if f in LOADABLE)
KINDS = ("direction", "subspace", "per_layer")
BATCH, POS = 2, 7


def _tokens(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, int(model.cfg.d_vocab), (BATCH, POS), generator=g)


def _reference(model, kind, seed=1):
    """``(reference, per_layer, projector)``: the reference as a user passes it and a function
    ``(u, layer) -> u_par`` written with torch.linalg (float64)."""
    g = torch.Generator().manual_seed(seed)
    d, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    if kind == "direction":
        r = torch.randn(d, generator=g, dtype=torch.float64)
        return r, None, lambda u, L: (torch.linalg.vecdot(u, r) / r.dot(r)).unsqueeze(-1) * r
    if kind == "per_layer":
        rows = torch.randn(n_layers, d, generator=g, dtype=torch.float64)
        return rows, True, lambda u, L: (torch.linalg.vecdot(u, rows[L]) / rows[L].dot(rows[L])).unsqueeze(-1) * rows[L]
    rows = torch.randn(3, d, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(rows.T)  # [d, 3], orthonormal columns spanning the rows
    return rows, False, lambda u, L: (u @ q) @ q.T


def _units(family, L):
    """(component, update hook, stream hook) of layer L, written out (METHOD.md sec. 2)."""
    return [("attn", f"blocks.{L}.hook_attn_out", f"blocks.{L}.hook_resid_pre"),
            ("mlp", f"blocks.{L}.hook_mlp_out", f"blocks.{L}.hook_resid_mid")]


# -- the default is today's output, bit for bit ------------------------------------------------

def test_default_reference_is_todays_output_bit_for_bit(tiny_model):
    model = tiny_model("gpt2")
    tokens = _tokens(model)
    a = tld.profile(model, tokens, progress=False, per_token=True)
    for ref in (None, "input"):
        b = tld.profile(model, tokens, progress=False, per_token=True, reference=ref)
        for name in ("residual", "value", "tokens", "value_tokens"):
            pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    answer = tokens[:, -1]
    dla = tld.split_logit_attribution(model, tokens[:, :-1], answer)
    pd.testing.assert_frame_equal(dla, tld.split_logit_attribution(model, tokens[:, :-1], answer, reference=None),
                                  check_exact=True)
    lens = tld.split_logit_lens(model, tokens, targets=answer)
    lens2 = tld.split_logit_lens(model, tokens, targets=answer, reference="input")
    for name in ("lens_logits", "parallel_if_first", "parallel_if_last", "step_full"):
        assert torch.equal(getattr(lens, name), getattr(lens2, name)), name
    assert lens2.reference == "stream" and lens2.random_energy_share == 1 / model.cfg.d_model
    clean, corrupted = _pair(model)
    _, t1 = tld.directional_patch(model, clean, corrupted, lambda lg: _metric(lg).sum())
    _, t2 = tld.directional_patch(model, clean, corrupted, lambda lg: _metric(lg).sum(), reference=None)
    pd.testing.assert_frame_equal(t1, t2, check_exact=True)
    for verb, kw in ((tld.attribution_patch, {}), (tld.path_patch, {"sender": ("attn", 0)})):
        r1 = verb(model, clean, corrupted, _metric, **kw)
        r2 = verb(model, clean, corrupted, _metric, reference="input", **kw)
        assert r1.random_share == r2.random_share
        for node in r1.values:
            for part in r1.values[node]:
                assert np.array_equal(r1.values[node][part], r2.values[node][part], equal_nan=True), (node, part)
            assert np.array_equal(r1.par_frac[node], r2.par_frac[node], equal_nan=True), node


def test_direction_object_equals_its_tensor_bit_for_bit(tiny_model):
    model = tiny_model("gpt2")
    tokens = _tokens(model)
    r = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    store = {}

    def run(ref):
        hooks = tld.edit_hooks(model, tld.ResidualScale("attn", 0.0, 2.0, reference=ref))
        hooks.append(("blocks.1.hook_attn_out", lambda t, hook: store.__setitem__(ref is r, t.clone())))
        model.run_with_hooks(tokens, fwd_hooks=hooks)

    run(r)
    run(tld.Direction(r, weights_processed=False))
    assert torch.equal(store[True], store[False])


# -- every verb equals an independent projection ----------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_profile_against_projection(float64_model, family, kind):
    model = float64_model(family)
    tokens = _tokens(model)
    ref, per_layer, project = _reference(model, kind)
    p = tld.profile(model, tokens, progress=False, per_token=True, exclude_first_token=False,
                    components=["attn", "mlp"], reference=ref, per_layer=per_layer)
    k = 3 if kind == "subspace" else 1
    assert (p.residual["random_energy_share"] == k / model.cfg.d_model).all()
    assert p.metadata["random_energy_share"] == k / model.cfg.d_model
    _, cache = model.run_with_cache(tokens)
    from_cache = tld.Profile.from_cache(model, cache, exclude_first_token=False, components=["attn", "mlp"],
                                        reference=ref, per_layer=per_layer)
    pd.testing.assert_frame_equal(from_cache.residual, p.residual, check_exact=False, rtol=1e-12, atol=1e-12)
    for L in range(model.cfg.n_layers):
        for comp, update, _ in _units(family, L):
            u = cache[update].double()
            par = project(u, L)
            frac = (par.norm(dim=-1) / u.norm(dim=-1)).reshape(-1)
            rows = p.tokens[(p.tokens.layer == L) & (p.tokens.component == comp)]
            rows = rows.sort_values(["sequence", "position"])
            assert torch.allclose(torch.as_tensor(rows.par_frac.to_numpy().copy()), frac, atol=1e-10, rtol=0), (L, comp)
            energy = ((par**2).sum() / ((u - par) ** 2).sum()).sqrt()
            row = p.residual[(p.residual.layer == L) & (p.residual.component == comp)]
            assert abs(float(row.energy_ratio.iloc[0]) - float(energy)) <= 1e-10 * float(energy), (L, comp)


def _dla_direction(model, cache, tokens_answer, tokens_wrong, pos):
    """Per sequence, the vector ``delta`` with ``dla(v) = v . delta`` (final norm linearised at the
    run's scale, its gain applied, centred for LayerNorm), written out."""
    w_u = model.W_U.double()
    logit_dir = (w_u[:, tokens_answer] - w_u[:, tokens_wrong]).T  # [batch, d_model]
    gain = final_norm_weight(model)
    if gain is not None:
        logit_dir = logit_dir * gain.double()
    if str(model.cfg.normalization_type).startswith("LN"):
        logit_dir = logit_dir - logit_dir.mean(-1, keepdim=True)
    scale = cache["ln_final.hook_scale"][torch.arange(BATCH), pos].double()  # [batch, 1]
    return logit_dir / scale


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_split_logit_attribution_against_projection(float64_model, family, kind):
    model = float64_model(family)
    tokens = _tokens(model)
    answer, wrong = tokens[:, 1], tokens[:, 2]
    ref, per_layer, project = _reference(model, kind)
    table = tld.split_logit_attribution(model, tokens, answer, incorrect_tokens=wrong, reference=ref,
                                        per_layer=per_layer)
    _, cache = model.run_with_cache(tokens)
    delta = _dla_direction(model, cache, answer, wrong, POS - 1)
    for L in range(model.cfg.n_layers):
        for comp, update, _ in _units(family, L):
            u = cache[update][:, -1].double()
            par = project(u, L)
            rows = table[(table.layer == L) & (table.unit == comp)].sort_values("sequence")
            expected = torch.linalg.vecdot(par, delta)
            assert torch.allclose(torch.as_tensor(rows.dla_par.to_numpy().copy()), expected, atol=1e-9, rtol=1e-9)
            total = torch.linalg.vecdot(u, delta)
            assert torch.allclose(torch.as_tensor(rows.dla.to_numpy().copy()), total, atol=1e-9, rtol=1e-9)
    assert (table["random_energy_share"] == (3 if kind == "subspace" else 1) / model.cfg.d_model).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_split_logit_lens_against_projection(float64_model, family, kind):
    model = float64_model(family)
    tokens = _tokens(model)
    target = tokens[:, 3]
    ref, per_layer, project = _reference(model, kind)
    res = tld.split_logit_lens(model, tokens, targets=target, reference=ref, per_layer=per_layer)
    _, cache = model.run_with_cache(tokens)

    def f(x):  # the lens: the model's own final norm and unembedding, written out
        with torch.no_grad():
            logits = model.ln_final(x) @ model.W_U + model.b_U
        return logits.gather(-1, target.view(-1, 1, 1).expand(-1, x.shape[1], 1)).squeeze(-1).double()

    for L in range(model.cfg.n_layers):
        for c, (_, update, stream) in enumerate(_units(family, L)):
            x, u = cache[stream], cache[update]
            par = project(u, L)
            assert torch.allclose(res.parallel_if_first[L, c], f(x + par) - f(x), atol=1e-9, rtol=0), (L, c)
            assert torch.allclose(res.parallel_if_last[L, c], f(x + u) - f(x + u - par), atol=1e-9, rtol=0), (L, c)
    assert res.random_energy_share == (3 if kind == "subspace" else 1) / model.cfg.d_model


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_residual_scale_against_projection(float64_model, family, kind):
    model = float64_model(family)
    tokens = _tokens(model)
    ref, per_layer, project = _reference(model, kind)
    layer = int(model.cfg.n_layers) - 1
    name = f"blocks.{layer}.hook_attn_out"
    _, cache = model.run_with_cache(tokens, names_filter=[name])
    store = {}
    edit = tld.ResidualScale("attn", 0.0, 2.0, layers=[layer], reference=ref, per_layer=per_layer)
    hooks = tld.edit_hooks(model, edit) + [(name, lambda t, hook: store.__setitem__("out", t.clone()))]
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    u = cache[name]
    par = project(u, layer)
    assert torch.allclose(store["out"], 2.0 * (u - par), atol=1e-10, rtol=0)


def _pair(model):
    clean, corrupted = _tokens(model, 0), _tokens(model, 1)
    corrupted[:, :2] = clean[:, :2]  # a shared prefix, as in a real pair
    return clean, corrupted


def _metric(logits):
    return logits[:, -1, 5] - logits[:, -1, 7]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_directional_patch_against_projection(float64_model, family, kind):
    model = float64_model(family)
    clean, corrupted = _pair(model)
    ref, per_layer, project = _reference(model, kind)
    layer = int(model.cfg.n_layers) - 1
    name = f"blocks.{layer}.hook_attn_out"
    _, table = tld.directional_patch(model, clean, corrupted, lambda lg: _metric(lg).sum(), components=["attn"],
                                     layers=[layer], which=("par", "perp"), reference=ref, per_layer=per_layer)
    _, cache = model.run_with_cache(clean, names_filter=[name])
    u_c = cache[name]
    for which in ("par", "perp"):
        def patch(t, hook, which=which):  # P u_c + (I - P) u_x, or P u_x + (I - P) u_c
            moved = project(u_c - t, layer)
            return t + moved if which == "par" else u_c - moved
        with torch.no_grad():
            expected = float(_metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])).sum())
        assert abs(float(table[f"metric_{which}"].iloc[0]) - expected) <= 1e-9 * (1 + abs(expected)), which


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_attribution_patch_against_projection(float64_model, family, kind):
    model = float64_model(family)
    clean, corrupted = _pair(model)
    ref, per_layer, project = _reference(model, kind)
    res = tld.attribution_patch(model, clean, corrupted, _metric, node_types=["attn", "mlp"], reference=ref,
                                per_layer=per_layer)
    names = [f"blocks.{L}.hook_{c}_out" for L in range(model.cfg.n_layers) for c in ("attn", "mlp")]
    _, cache = model.run_with_cache(clean, names_filter=names)
    acts = {}

    def keep(name):
        def hook(t, hook):
            t.retain_grad()
            acts[name] = t
            return t
        return hook

    model.zero_grad(set_to_none=True)
    _metric(model.run_with_hooks(corrupted, fwd_hooks=[(n, keep(n)) for n in names])).sum().backward()
    model.zero_grad(set_to_none=True)
    for L in range(model.cfg.n_layers):
        for comp in ("attn", "mlp"):
            name = f"blocks.{L}.hook_{comp}_out"
            delta = (cache[name] - acts[name]).detach()
            par = torch.linalg.vecdot(project(delta, L), acts[name].grad)  # [batch, pos]
            got = torch.as_tensor(res.values[comp]["par"][:, L])
            assert torch.allclose(got, par, atol=1e-9, rtol=1e-7), (L, comp)
    k = 3 if kind == "subspace" else 1
    assert res.random_share["attn"] == tld.random_subspace_share(int(model.cfg.d_model), k)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_path_patch_sender_difference_against_projection(float64_model, family, kind):
    """The sender's (attn, layer 0) clean-minus-corrupted difference, split against the reference,
    delivered to the logits only: the final stream plus ``P delta`` (par) or ``delta - P delta``."""
    model = float64_model(family)
    clean, corrupted = _pair(model)
    ref, per_layer, project = _reference(model, kind)
    res = tld.path_patch(model, clean, corrupted, _metric, sender=("attn", 0), receivers="logits",
                         parts=("par", "perp"), reference=ref, per_layer=per_layer)
    name, final = "blocks.0.hook_attn_out", f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    _, c_cache = model.run_with_cache(clean, names_filter=[name])
    with torch.no_grad():
        logits, x_cache = model.run_with_cache(corrupted, names_filter=[name])
        base = _metric(logits)
        delta = c_cache[name] - x_cache[name]
        for part in ("par", "perp"):
            moved = project(delta, 0) if part == "par" else delta - project(delta, 0)
            patched = _metric(model.run_with_hooks(corrupted, fwd_hooks=[(final, lambda t, hook, m=moved: t + m)]))
            got = torch.as_tensor(res.values["logits"][part])
            assert torch.allclose(got, patched - base, atol=1e-9, rtol=1e-7), part


# -- every bad reference is one clear error ---------------------------------------------------

def test_bad_references_are_one_clear_error_each(tiny_model):
    model = tiny_model("gpt2")
    d, n_layers, d_head = int(model.cfg.d_model), int(model.cfg.n_layers), int(model.cfg.d_head)
    g = torch.Generator().manual_seed(0)
    good = torch.randn(d, generator=g)
    nan = good.clone()
    nan[3] = float("nan")
    cases = [
        (torch.randn(d_head, generator=g), {}, rf"reference has width {d_head} but the space it splits has width {d}"),
        (torch.zeros(n_layers + 1, d), {}, r"reference has zero row\(s\) \[0, 1"),
        (nan, {}, r"reference has NaN or inf entries in row\(s\) \[0\]"),
        (torch.stack([good, 2 * good, -good]), {}, r"spans a subspace of rank 1, below its 3 rows"),
        (torch.randn(n_layers, d, generator=g), {}, r"is both a per-layer set .* pass per_layer=True"),
        (torch.randn(n_layers + 1, d, generator=g), {"per_layer": True},
         rf"reference with per_layer=True must be \[n_layers={n_layers}"),
        (tld.Direction(torch.randn(d_head, generator=g), space="value"), {},
         r"reference is a Direction in 'value' space .* this verb splits 'resid' vectors"),
        (tld.Direction(good, weights_processed=True), {},
         r"taken from a model with processed .*issue #642.*Load this model the same way"),
        ("stream", {}, r"reference must be None or 'input'"),
    ]
    for ref, kw, message in cases:
        with pytest.raises(tld.SubspaceError, match=message):
            resolve_reference(model, ref, **kw)
    tokens = _tokens(model)
    # the verbs raise the resolver's error before running anything
    with pytest.raises(tld.SubspaceError, match="reference has zero row"):
        tld.profile(model, tokens, progress=False, reference=torch.zeros(d))
    with pytest.raises(tld.SubspaceError, match="rank 1"):
        tld.split_logit_attribution(model, tokens, tokens[:, 0], reference=torch.stack([good, good, good]))
    with pytest.raises(tld.SubspaceError, match="both a per-layer set"):
        tld.split_logit_lens(model, tokens, targets=tokens[:, 0], reference=torch.randn(n_layers, d))
    with pytest.raises(tld.SubspaceError, match="issue #642"):
        tld.edit_hooks(model, tld.ResidualScale("mlp", 0.0, reference=tld.Direction(good, weights_processed=True)))
    with pytest.raises(tld.SubspaceError, match="drop_cosine=True measures against the stream"):
        tld.profile(model, tokens, progress=False, reference=good, drop_cosine=True)
    with pytest.raises(tld.PathPatchError, match="space='value' splits it against the head's own value"):
        tld.path_patch(model, tokens, tokens, lambda lg: lg[:, -1, 0].sum(), sender=("head", 0, 0),
                       space="value", reference=good)
    with pytest.raises(tld.SubspaceError, match="reference has width"):
        tld.directional_patch(model, tokens, tokens, lambda lg: lg[:, -1, 0].sum(), reference=torch.ones(d + 1))
    with pytest.raises(tld.SubspaceError, match="reference has NaN"):
        tld.attribution_patch(model, tokens, tokens, lambda lg: lg[:, -1, 0], reference=nan)
    with pytest.raises(tld.StackSplitError, match="Direction in 'value' space"):
        _, cache = model.run_with_cache(tokens)
        tld.split_decompose_resid(cache, reference=tld.Direction(torch.randn(d_head), space="value"))


def test_plain_transformers_lane_refuses_what_it_cannot_resolve(tiny_hf_model):
    hf = tiny_hf_model("gpt2")
    d = int(hf.config.hidden_size)
    for ref in (torch.randn(3, d), tld.Direction(torch.randn(d))):
        with pytest.raises(ValueError, match="is resolved against a TransformerLens model; on the plain-transformers"):
            tld.hf.install_edits(hf, tld.ResidualScale("attn", 0.0, reference=ref))
