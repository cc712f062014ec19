"""Every registered model family (``tl_directional.model.families``, one file each) through the
checks the original families pass across the suite, on the installed lane.

``EXTRA`` (tests/integration/_families.py) is every causal family that loads on this lane beyond GPT-2,
Llama and GPT-NeoX (which test_sites / test_measure / test_edit / test_habits cover): gemma3,
qwen2, qwen3, qwen3_moe (bridge), mistral, mixtral, gemma, gemma2, olmo2 (bridge), phi3, phi,
gptj, gpt_neo, opt, bloom. Logits against plain ``transformers`` (with and without padding) are
checked for every family in tests/integration/test_models.py. ``REFUSED`` families must fail to load with
an error naming what is missing.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional.model.families import REGISTRY
from tl_directional.model.inputs import pad_sequences
from tl_directional.model.lanes import lane_named
from tl_directional.model.sites import PARALLEL, SEQUENTIAL
from tl_directional.model.structure import SANDWICH_NOTE

from ._families import EXTRA, REFUSED
from .test_edit import _batch, _edits_for, _run
from .test_habits import PROMPT, _manual_greedy
from .test_measure import TEXTS

#: Layouts whose norm follows W_O: the sec. 3 factorization is NaN there, with the note.
NO_FACTORIZATION = ("sandwich", "post-sublayer")


def _pattern_edits_refused(family: str, lane: str) -> bool:
    """Bridge GPT-J / GPT-Neo / OPT (like bridge BERT): hook_pattern fires after hook_z."""
    return lane == "bridge" and REGISTRY[family].bridge_pattern_after_z


def _edits(family: str, lane: str) -> list:
    if _pattern_edits_refused(family, lane):  # the bridge-BERT subset, plus the block edit
        return _edits_for("bert") + [tld.ResidualScale("block")]
    return _edits_for(family)


def _grad_edits(family: str, lane: str) -> list:
    edits = [tld.ValueScale(0.0), tld.ResidualScale("attn", 0.0), tld.ResidualScale("mlp", 0.5, 1.5),
             tld.ResidualScale("block", 0.0)]
    if not _pattern_edits_refused(family, lane):
        edits += [tld.ValueScale(0.5, 2.0, mode="exclusive"), tld.DiagonalRemoval(), tld.EffectiveDiagonal(0.0)]
    return edits


def _fact_applies(family: str) -> bool:
    return REGISTRY[family].layout.norm not in NO_FACTORIZATION


@pytest.mark.parametrize("family", EXTRA)
def test_layout_facts_match_the_resolved_sites(tiny_model, family):
    layout = REGISTRY[family].layout
    sites = tld.resolve_sites(tiny_model(family), warn=False)
    assert sites.arch == (PARALLEL if layout.parallel else SEQUENTIAL)
    assert sites.factorization_applicable == _fact_applies(family)
    assert (SANDWICH_NOTE in sites.notes) == (not _fact_applies(family))


@pytest.mark.parametrize("family", EXTRA)
def test_additive_identity_at_every_layer(tiny_model, family):
    model = tiny_model(family)
    sites = tld.resolve_sites(model, warn=False)
    tokens = torch.tensor([[1, 5, 9, 13, 2, 7, 3, 11, 17, 4]])
    errors = tld.verify_sites(model, sites, tokens)
    assert errors and max(errors.values()) < 1e-5
    units = {k.split(".")[0] for k in errors}
    layers = {int(k.split(".")[1]) for k in errors}
    assert units == {"attn", "mlp", "block"} and layers == set(range(model.cfg.n_layers)), sorted(errors)


@pytest.mark.parametrize("family", EXTRA)
def test_streaming_profile_equals_profile_from_cache(tiny_model, family):
    model = tiny_model(family)
    prof = tld.profile(model, TEXTS, batch_size=2, progress=False)
    batch = tld.prepare_inputs(model, TEXTS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    ref = tld.Profile.from_cache(model, cache, attention_mask=batch.attention_mask)
    for name in ("residual", "value"):
        a, b = getattr(prof, name), getattr(ref, name)
        num = a.select_dtypes("number").columns
        pd.testing.assert_frame_equal(a[num], b[num], check_exact=False, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", EXTRA)
def test_factorization_reproduces_alpha_or_is_nan_with_the_note(tiny_model, family):
    prof = tld.profile(tiny_model(family), TEXTS, progress=False)
    errs = prof.value["factorization_error_max"]
    attn = prof.residual.query("component == 'attn'")["factorization_error_max"]
    if _fact_applies(family):
        assert (errs < 1e-5).all() and (attn < 1e-5).all(), errs
        assert SANDWICH_NOTE not in prof.metadata["notes"]
    else:
        assert errs.isna().all() and prof.value["phi_mean"].isna().all()
        assert prof.value["beta_mean"].notna().all()
        assert prof.residual["par_frac_mean"].notna().all()
        assert SANDWICH_NOTE in prof.metadata["notes"]


@pytest.mark.parametrize("family", EXTRA)
def test_identity_at_scale_one_is_bit_exact(tiny_model, family, lane):
    model = tiny_model(family)
    batch = _batch(model)
    base = model(batch.tokens, attention_mask=batch.attention_mask)
    for edit in _edits(family, lane):
        assert torch.equal(_run(model, batch, edit), base), edit


@pytest.mark.parametrize("family", EXTRA)
@pytest.mark.parametrize("s_par", [0.0, 2.0])
def test_vpara_equals_effective_diagonal(tiny_model, family, s_par, lane):
    model = tiny_model(family)
    batch = _batch(model)
    a = _run(model, batch, tld.ValueScale(s_par, 1.0, mode="full"))
    if _pattern_edits_refused(family, lane):
        with pytest.raises(RuntimeError, match="hook_pattern did not fire before hook_z"):
            _run(model, batch, tld.EffectiveDiagonal(s_par))
        return
    b = _run(model, batch, tld.EffectiveDiagonal(s_par))
    base = model(batch.tokens, attention_mask=batch.attention_mask)
    assert (a - base).abs().max() > 1e-3  # the edit does something
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


@pytest.mark.parametrize("family", EXTRA)
def test_gqa_head_mapping(tiny_model, family):
    model = tiny_model(family)
    sites = tld.resolve_sites(model, warn=False)
    n_kv = REGISTRY[family].default_kv_heads(4)
    assert (sites.n_heads, sites.n_kv_heads) == (4, n_kv)
    assert [sites.kv_head(h) for h in range(4)] == [h // (4 // n_kv) for h in range(4)]
    assert REGISTRY[family].layout.gqa == (n_kv < 4)
    # a per-head V-Para edit uses the head's own KV head
    batch = _batch(model)
    names = ["blocks.1.attn.hook_v", "blocks.1.attn.hook_z"]
    store: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(t, hook):
            store[name] = t.detach().clone()
            return t
        return hook

    model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,
                         fwd_hooks=[(n, keep(n)) for n in names])
    v, z0 = store[names[0]], store[names[1]]
    hooks = tld.edit_hooks(model, tld.ValueScale(0.0, layers=[1], heads=[3])) + [(names[1], keep(names[1]))]
    model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=hooks)
    z1 = store[names[1]]
    assert v.shape[2] == n_kv and z0.shape[2] == 4
    assert torch.equal(z1[:, :, :3], z0[:, :, :3])
    expected = tld.decompose(z0[:, :, 3], v[:, :, sites.kv_head(3)]).perp
    assert torch.allclose(z1[:, :, 3], expected.float(), atol=1e-6)


@pytest.mark.parametrize("family", EXTRA)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_excluded(tiny_model, family, side):
    model = tiny_model(family)
    seqs = [tld.prepare_inputs(model, [t]).tokens[0].tolist() for t in TEXTS]
    padded = pad_sequences(seqs, pad_id=0, padding_side=side)
    kw = dict(attention_mask=padded.attention_mask, progress=False)
    together = tld.profile(model, padded.tokens, batch_size=3, **kw)
    one_by_one = tld.profile(model, padded.tokens, batch_size=1, **kw)
    assert together.residual["count"].iloc[0] == sum(len(s) - 1 for s in seqs)
    cols = ["count", "par_frac_mean", "alpha_mean", "energy_ratio"]
    pd.testing.assert_frame_equal(together.residual[cols], one_by_one.residual[cols], rtol=1e-4)
    vcols = ["count", "beta_mean", "A_tt_mean"]
    pd.testing.assert_frame_equal(together.value[vcols], one_by_one.value[vcols], rtol=1e-4)


@pytest.mark.parametrize("family", EXTRA)
def test_gradients_flow_through_every_edit(tiny_model, family, lane):
    model = tiny_model(family, fresh=True)
    batch = _batch(model)
    for edit in _grad_edits(family, lane):
        model.zero_grad(set_to_none=True)
        with tld.apply_edits(model, edit):
            loss = model(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads), edit
        assert any(g.abs().sum() > 0 for g in grads), edit


@pytest.mark.parametrize("family", EXTRA)
def test_generate_with_an_edit_equals_an_argmax_loop(tiny_model, family):
    model = tiny_model(family)
    prompt = tld.prepare_inputs(model, [PROMPT]).tokens
    with tld.apply_edits(model, tld.ValueScale(0.0, layers=[0])):
        want = _manual_greedy(model, prompt, 5)
        got = model.generate(prompt, max_new_tokens=5, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(got.cpu(), want.cpu())


@pytest.mark.skipif(not REFUSED, reason="this lane refuses no registered family")
@pytest.mark.parametrize("family", REFUSED or ["none"])
def test_refused_families_name_what_is_missing(tiny_model_dir, family, lane):
    from tl_directional.model.load import load_model

    reason = lane_named(lane).family_refusal(REGISTRY[family])
    assert reason and REGISTRY[family].hf_class in reason and "bridge lane" in reason
    with pytest.raises(ValueError) as info:
        load_model(tiny_model_dir(family))
    assert str(info.value) == reason


def test_docs_models_lists_every_family_lane_by_lane():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[1:-1]]
            for line in text.splitlines() if line.startswith("| `")}
    for name, fam in REGISTRY.items():
        assert name in rows, f"docs/models.md has no row for {name}"
        cells = rows[name]
        assert cells[1] == f"`{fam.hf_class}`", cells
        bridge, legacy = cells[-2], cells[-1]
        assert bridge.startswith("tested"), (name, bridge)
        if fam.legacy_config is None:
            assert legacy.startswith("refused"), (name, legacy)
        elif fam.causal:
            assert legacy == "tested", (name, legacy)
