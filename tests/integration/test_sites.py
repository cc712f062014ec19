"""METHOD.md sec. 2: which update against which reference, checked on real activations."""

import pytest
import torch

import tl_directional as tld
from tl_directional.model.families import REGISTRY
from tl_directional.model.sites import PARALLEL, POST_LN, SEQUENTIAL

from ._families import ALL, CAUSAL

EXPECTED_ARCH = {"gpt2": SEQUENTIAL, "llama": SEQUENTIAL, "neox": PARALLEL, "bert": POST_LN}


@pytest.mark.parametrize("family", ALL)
def test_resolves_architecture_and_additive_identity_holds(tiny_model, family):
    model = tiny_model(family)
    sites = tld.resolve_sites(model)
    assert sites.arch == EXPECTED_ARCH[family]
    tokens = torch.tensor([[1, 5, 9, 13, 2, 7, 3, 11]])
    errors = tld.verify_sites(model, sites, tokens)
    assert errors and max(errors.values()) < 1e-5


@pytest.mark.parametrize("family", CAUSAL)
def test_reference_names_follow_the_method_table(tiny_model, family):
    sites = tld.resolve_sites(tiny_model(family))
    attn, mlp, block = sites.unit("attn", 1), sites.unit("mlp", 1), sites.unit("block", 1)
    assert (attn.update_hook, attn.reference_hook) == ("blocks.1.hook_attn_out", "blocks.1.hook_resid_pre")
    expected_mlp_ref = "blocks.1.hook_resid_pre" if family == "neox" else "blocks.1.hook_resid_mid"
    assert (mlp.update_hook, mlp.reference_hook) == ("blocks.1.hook_mlp_out", expected_mlp_ref)
    assert block.update_name == "blocks.1.hook_resid_post - blocks.1.hook_resid_pre"


def test_gqa_head_mapping(tiny_model):
    sites = tld.resolve_sites(tiny_model("llama"))
    assert (sites.n_heads, sites.n_kv_heads) == (4, 2)
    assert [sites.kv_head(h) for h in range(4)] == [0, 0, 1, 1]


@pytest.mark.bridge  # post-LN encoders are supported on the TL 4 bridge only
def test_bert_bridge_uses_post_ln_sites(tiny_model):
    sites = tld.resolve_sites(tiny_model("bert"))
    assert sites.units["attn"][0].update_hook == "blocks.0.attn.o.hook_out"
    assert sites.units["mlp"][0].reference_hook == "blocks.0.ln1.hook_out"
    assert "block" not in sites.units
    with pytest.raises(ValueError, match="no single block update"):
        sites.unit("block", 0)


def test_broken_additive_identity_raises_naming_the_layer(tiny_model):
    model = tiny_model("gpt2", fresh=True)
    sites = tld.resolve_sites(model)
    # A permanent user hook that shifts resid_mid after the sum breaks resid_mid == pre + attn.
    model.add_hook("blocks.1.hook_resid_mid", lambda t, hook: t + 1.0)
    try:
        with pytest.raises(tld.SiteResolutionError, match=r"layer 1: additive identity blocks\.1\.hook_resid_mid"):
            tld.verify_sites(model, sites, torch.tensor([[1, 2, 3, 4]]))
        with pytest.raises(tld.SiteResolutionError):
            tld.profile(model, torch.tensor([[1, 2, 3, 4]]), progress=False)
    finally:
        model.reset_hooks(including_permanent=True)


def test_processed_weights_are_detected_and_warned(tiny_model, lane):
    model = tiny_model("gpt2", fresh=True)
    with _no_processing_warning():
        sites = tld.resolve_sites(model)
    assert not sites.weights.any
    if lane == "bridge":
        model.enable_compatibility_mode(disable_warnings=True)
    else:
        model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    with pytest.warns(tld.WeightProcessingWarning, match="processed"):
        sites = tld.resolve_sites(model)
    assert sites.weights.centered_writing_weights
    if lane == "bridge":  # enable_compatibility_mode folds b_V into b_O by default
        assert sites.weights.folded_value_biases
    prof = tld.profile(model, torch.tensor([[1, 2, 3, 4, 5]]), progress=False)
    assert prof.metadata["weights_processed"] is True


class _no_processing_warning:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings(record=True)
        self.log = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        assert not any(issubclass(w.category, tld.WeightProcessingWarning) for w in self.log)


def test_not_a_transformerlens_model_is_a_type_error():
    with pytest.raises(TypeError, match="TransformerLens model"):
        tld.resolve_sites(torch.nn.Linear(3, 3))


def test_model_without_needed_hooks_is_reported(tiny_model):
    model = tiny_model("gpt2")

    class NoHooks:
        cfg = model.cfg
        hook_dict = {}
        run_with_hooks = hooks = None
        blocks = model.blocks

    with pytest.raises(tld.SiteResolutionError, match="has no hook point"):
        tld.resolve_sites(NoHooks())


def test_verification_is_kept_per_model_until_a_hook_changes(tiny_model, monkeypatch):
    """verify_sites runs its forward once per model; a hook added later (which can break the
    identity) makes the next call verify again, and a breaking one is still caught."""
    import tl_directional.model.verify as S

    model = tiny_model("gpt2", fresh=True)
    sites = tld.resolve_sites(model)
    forwards = []
    real = S.capture
    monkeypatch.setattr(S, "capture", lambda *a, **k: forwards.append(1) or real(*a, **k))
    tokens = torch.tensor([[1, 2, 3, 4]])
    try:
        first = tld.verify_sites(model, sites, tokens)
        assert tld.verify_sites(model, sites, tokens) == first and len(forwards) == 1
        tld.profile(model, tokens, progress=False)  # its own verification is the kept one
        assert len(forwards) == 1
        model.add_hook("blocks.1.hook_resid_mid", lambda t, hook: t + 1.0)
        with pytest.raises(tld.SiteResolutionError, match=r"layer 1: additive identity"):
            tld.verify_sites(model, sites, tokens)
        model.reset_hooks(including_permanent=True)
        assert tld.verify_sites(model, sites, tokens) == first and len(forwards) == 2  # as verified
    finally:
        model.reset_hooks(including_permanent=True)


def test_no_value_bias_fold_is_read_into_gpt_neo(tiny_model):
    """GPT-Neo's attention has an output bias but no value bias (``Layout.value_bias=False``):
    unprocessed weights give no WeightProcessingWarning (the legacy lane used to read the
    zero ``b_V`` plus a non-zero ``b_O`` as "value biases were folded")."""
    model = tiny_model("gpt_neo", fresh=True)
    assert not REGISTRY["gpt_neo"].layout.value_bias
    with _no_processing_warning():
        sites = tld.resolve_sites(model)
    assert not sites.weights.folded_value_biases
    assert not sites.weights.any


def test_folded_value_biases_still_warn_unlike_gpt_neo(tiny_model, lane):
    """A family with a value bias (GPT-2) whose ``b_V`` is all zero while ``b_O`` is not still
    reads as folded and warns."""
    if not hasattr(tiny_model("gpt2").blocks[0].attn, "b_V"):
        pytest.skip(f"no b_V attribute to zero on the {lane} lane")
    model = tiny_model("gpt2", fresh=True)
    assert REGISTRY["gpt2"].layout.value_bias
    with torch.no_grad():
        for block in model.blocks:
            block.attn.b_V.zero_()
            block.attn.b_O.add_(0.01)
    with pytest.warns(tld.WeightProcessingWarning, match="processed"):
        sites = tld.resolve_sites(model)
    assert sites.weights.folded_value_biases
