"""SAEs (tl_directional.measure.sae, issue 48): the bundled SAE, trained by SAELens's own runner
(studies/data/train_sae.py) on the default model's ``blocks.2.hook_resid_pre``.

Every lane, without SAELens (the bridge lane has none):
(a) the committed weights are read with ``safetensors`` here, and ``sae_directions`` returns
    exactly their decoder rows, with the provenance of the cfg;
(b) ``sae_split``'s reconstruction and error equal a forward pass written here (hooks +
    ``torch``), its parallel parts an independent projection in float64, and it matches the
    numbers SAELens's ``HookedSAETransformer`` computed when the SAE was trained
    (``quality.json``'s ``reference``) within a stated bound;
(c) the committed SAE is real: explained variance on held-out text well above 0;
(d) the errors: a missing file, a model of the wrong width, feature ids out of range.

Legacy lane with SAELens (CI installs it there: ``make venv LANE=legacy``; a legacy venv without
it fails the first test below):
(e) the weights path equals ``HookedSAETransformer``'s ``hook_sae_recons`` / ``hook_sae_error``
    and a SAELens ``SAE`` object gives the same directions as its saved folder;
(f) JumpReLU and TopK SAEs (random weights) encode and decode as SAELens does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math

import pytest
import torch
from safetensors.torch import load_file

import tl_directional as tld
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.io.corpus import heldout_text
from tl_directional.measure.sae_weights import bundled_sae_path
from tl_directional.model.load import load_model

HOOK = "blocks.2.hook_resid_pre"
HAS_SAE_LENS = importlib.util.find_spec("sae_lens") is not None
NO_SAE_LENS = "sae_lens is not installed (SAELens 6 needs transformer-lens<4: legacy lane only, make venv LANE=legacy)"


@pytest.fixture(scope="module")
def model():
    return load_model("default").eval()


@pytest.fixture(scope="module")
def saved():
    folder = bundled_sae_path("default")
    return load_file(str(folder / "sae_weights.safetensors")), json.loads((folder / "cfg.json").read_text())


@pytest.fixture(scope="module")
def quality():
    return json.loads((bundled_sae_path("default") / "quality.json").read_text())


def _heldout_tokens(model, n_rows=2, n_pos=64):
    """BOS + tokens of the held-out end of the bundled text (the SAE never trained on it)."""
    lines = heldout_text().splitlines(keepends=True)
    text = "".join(lines[int(len(lines) * 0.85):])
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"][: n_rows * (n_pos - 1)]
    body = torch.tensor(ids).reshape(n_rows, n_pos - 1)
    return torch.cat([torch.full((n_rows, 1), int(model.tokenizer.bos_token_id)), body], 1)


def _independent_forward(model, tokens, w):
    """x at the hook (a hook of the test's own) and the standard SAE's forward in float64."""
    store = {}

    def keep(t, hook):
        store["x"] = t.detach()

    with torch.no_grad():
        model.run_with_hooks(tokens, return_type=None, fwd_hooks=[(HOOK, keep)])
    x = store["x"].double()
    acts = torch.relu((x - w["b_dec"].double()) @ w["W_enc"].double() + w["b_enc"].double())
    recon = acts @ w["W_dec"].double() + w["b_dec"].double()
    return x, acts, recon


def test_directions_are_the_committed_decoder_rows_with_provenance(saved):
    w, cfg = saved
    one = tld.sae_directions("default", 5)
    assert torch.equal(one.vectors, w["W_dec"][5]) and one.vectors.shape == (256,)
    several = tld.sae_directions(bundled_sae_path("default"), [3, 1, 400])
    assert torch.equal(several.vectors, w["W_dec"][[3, 1, 400]])
    assert (several.source, several.space, several.hook_name, several.layer) == ("sae_decoder", "resid", HOOK, 2)
    # the model was loaded unprocessed, and the cfg records it
    assert cfg["metadata"]["model_from_pretrained_kwargs"]["center_writing_weights"] is False
    assert several.weights_processed is False
    assert several.details["features"] == [3, 1, 400] and several.details["d_sae"] == 512
    assert several.details["model_name"] == "default" and several.details["architecture"] == "standard"
    file_only = tld.sae_directions(bundled_sae_path("default") / "sae_weights.safetensors", [3, 1, 400])
    assert torch.equal(file_only.vectors, several.vectors)


def test_split_equals_an_independent_forward_and_projection(model, saved):
    w, _ = saved
    tokens = _heldout_tokens(model, 2, 16)
    s = tld.sae_split(model, tokens, "default")
    x, acts, recon = _independent_forward(model, tokens, w)
    assert s.hook_name == HOOK and s.layer == 2 and s.stream.dtype == torch.float32
    scale = float(x.abs().max())
    # float32 against float64: rounding over d_in + d_sae accumulated terms
    tol = roundoff_tolerance(torch.float32, scale, 256 + 512, safety=16)
    assert torch.equal(s.stream.double(), x)
    assert (s.reconstruction.double() - recon).abs().max() <= tol
    assert (s.error.double() - (x - recon)).abs().max() <= tol
    assert torch.equal(s.reconstruction + s.error, s.stream) or \
        (s.reconstruction + s.error - s.stream).abs().max() <= roundoff_tolerance(torch.float32, scale)
    # the split against the stream: a = (u . x) / ||x||^2, parts a x and u - a x (float64 here)
    a = (recon * x).sum(-1) / (x * x).sum(-1)
    assert (s.recon_alpha.double() - a).abs().max() <= 1e-5
    assert (s.error_alpha.double() - (1 - a)).abs().max() <= 1e-5
    assert (s.recon_par.double() - a[..., None] * x).abs().max() <= tol * 4
    assert (s.recon_perp + s.error_perp).abs().max() <= tol * 4  # x_hat_perp = -e_perp
    assert torch.equal(s.first, torch.zeros_like(s.first).index_fill_(1, torch.tensor([0]), True))
    frame, summary = s.to_frame(), s.summary()
    assert len(frame) == tokens.numel() and list(summary["part"]) == ["reconstruction", "error"]
    assert summary["tokens"].tolist() == [tokens.numel() - 2] * 2 and set(summary["first_token"]) == {"excluded"}
    assert summary["random_energy_share"].iloc[0] == 1 / 256
    # a feature whose pre-activation is within rounding of 0 may fire in one dtype only
    assert (torch.tensor(frame["l0"].tolist()) - (acts[s.mask] > 0).sum(-1)).abs().max() <= 1


def test_matches_what_hooked_sae_transformer_computed(model, quality):
    """The bound: the lanes' float32 forwards of the model differ by rounding (TL 4's bridge runs
    the HF modules, TL 2 its own), which the SAE passes on; relative 1e-4 of each norm is ~1000x
    that rounding and far below any change of the SAE or the model."""
    ref = quality["reference"]
    tokens = torch.tensor(ref["tokens"])
    s = tld.sae_split(model, tokens, "default")
    for name, got in (("stream_norm", s.stream.norm(dim=-1)), ("recon_norm", s.reconstruction.norm(dim=-1)),
                      ("error_norm", s.error.norm(dim=-1)), ("recon_alpha", s.recon_alpha)):
        want = torch.tensor(ref[name], dtype=torch.float64)
        assert ((got.double() - want).abs() <= 1e-4 * want.abs().clamp_min(1e-3)).all(), name


def test_the_committed_sae_is_real(model, quality):
    folder = bundled_sae_path("default")
    for name, sha in quality["files"].items():  # the files are the ones the script measured
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == sha, name
    s = tld.sae_split(model, _heldout_tokens(model, 2, 64), "default")
    ev = s.explained_variance()
    assert ev > 0.6, f"explained variance {ev:.3f} on held-out text"
    assert quality["heldout"]["explained_variance"] > 0.6 and quality["heldout"]["ce_loss_recovered"] > 0.8
    l0 = (s.feature_acts[:, 1:] > 0).sum(-1).double().mean()
    assert 1 < l0 < 100  # sparse: a few dozen of 512 features per token


def test_errors_name_the_argument_and_the_fix(model, tiny_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="no SAE weights at .*nope.*SAE.save_model"):
        tld.sae_directions(tmp_path / "nope")
    with pytest.raises(tld.SAEError, match=r"features \[512\] out of range.*d_sae=512.*0\.\.511"):
        tld.sae_directions("default", [0, 512])
    with pytest.raises(tld.SAEError, match="repeats ids"):
        tld.sae_directions("default", [7, 7])
    small = tiny_model("gpt2")
    with pytest.raises(tld.SAEError, match=r"256-wide activations but the model has d_model=32"):
        tld.sae_split(small, torch.tensor([[1, 2, 3]]), "default")
    with pytest.raises(tld.SAEError, match="d_model=32"):
        tld.sae_directions("default", 0, model=small)
    folder = tmp_path / "normed"
    folder.mkdir()
    cfg = json.loads((bundled_sae_path("default") / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps(dict(cfg, normalize_activations="layer_norm")))
    (folder / "sae_weights.safetensors").write_bytes((bundled_sae_path("default") / "sae_weights.safetensors").read_bytes())
    with pytest.raises(tld.SAEError, match="normalize_activations='layer_norm'.*fold"):
        tld.sae_directions(folder, 0)


def test_weights_processed_from_the_cfg():
    f = tld.measure.sae_weights.weights_processed_from_cfg
    assert f({}) is None
    assert f({"metadata": {"model_from_pretrained_kwargs": {"fold_ln": True}}}) is True
    assert f({"model_from_pretrained_kwargs": {"fold_ln": False, "center_writing_weights": False,
                                               "fold_value_biases": False}}) is False
    # SAELens 6 loads with from_pretrained_no_processing: an unnamed step is off
    assert f({"metadata": {"model_from_pretrained_kwargs": {"center_writing_weights": False},
                           "sae_lens_training_version": "6.54.12"}}) is False
    assert f({"model_from_pretrained_kwargs": {"center_writing_weights": False}, "sae_lens_version": "3.1.0"}) is None


# -- legacy lane with SAELens --------------------------------------------------------------------


@pytest.mark.legacy
def test_sae_lens_is_installed_on_the_legacy_lane():
    """CI's legacy lane installs SAELens (extra ``sae``, constraints/legacy.lock); without it
    the tests below would only skip."""
    assert HAS_SAE_LENS, ("sae_lens is missing from the legacy venv: rebuild it with `make venv LANE=legacy` "
                          "(installs the extra 'sae' pinned in constraints/legacy.lock)")


def _hooked_sae_model(model):
    from sae_lens import HookedSAETransformer

    hooked = HookedSAETransformer(model.cfg, tokenizer=model.tokenizer)
    hooked.load_state_dict(model.state_dict(), strict=False)
    return hooked.eval()


@pytest.mark.legacy
@pytest.mark.skipif(not HAS_SAE_LENS, reason=NO_SAE_LENS)
def test_weights_path_equals_hooked_sae_transformer(model):
    from sae_lens import SAE

    sae = SAE.load_from_disk(str(bundled_sae_path("default")), device="cpu")
    tokens = _heldout_tokens(model, 2, 32)
    with torch.no_grad():
        _, cache = _hooked_sae_model(model).run_with_cache_with_saes(tokens, saes=[sae], use_error_term=True)
    for source in (sae, "default"):
        s = tld.sae_split(model, tokens, source)
        x = cache[f"{HOOK}.hook_sae_input"]
        tol = roundoff_tolerance(torch.float32, float(x.abs().max()), 256 + 512)
        assert torch.equal(s.stream, x)
        assert (s.reconstruction - cache[f"{HOOK}.hook_sae_recons"]).abs().max() <= tol
        assert (s.error - cache[f"{HOOK}.hook_sae_error"]).abs().max() <= tol
        assert (s.feature_acts - cache[f"{HOOK}.hook_sae_acts_post"]).abs().max() <= tol
    d_obj, d_file = tld.sae_directions(sae, [2, 9]), tld.sae_directions("default", [2, 9])
    assert torch.equal(d_obj.vectors, sae.W_dec.detach()[[2, 9]]) and torch.equal(d_obj.vectors, d_file.vectors)
    assert (d_obj.hook_name, d_obj.layer, d_obj.weights_processed) == (HOOK, 2, False)


@pytest.mark.legacy
@pytest.mark.skipif(not HAS_SAE_LENS, reason=NO_SAE_LENS)
@pytest.mark.parametrize("arch", ["jumprelu", "topk"])
def test_jumprelu_and_topk_encode_and_decode_as_sae_lens(arch):
    from sae_lens import JumpReLUSAE, JumpReLUSAEConfig, TopKSAE, TopKSAEConfig

    torch.manual_seed(0)
    if arch == "jumprelu":
        sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=16, d_sae=40))
        with torch.no_grad():
            sae.threshold.uniform_(0.0, 0.3)
    else:
        sae = TopKSAE(TopKSAEConfig(d_in=16, d_sae=40, k=5))
    with torch.no_grad():
        for p in (sae.b_enc, sae.b_dec):
            p.normal_(0, 0.1)
    x = torch.randn(3, 7, 16)
    w = tld.load_sae_weights(sae)
    assert w.architecture == arch
    with torch.no_grad():
        acts = sae.encode(x)
        assert torch.allclose(w.encode(x), acts, atol=1e-6, rtol=0)
        assert torch.allclose(w.decode(acts), sae.decode(acts), atol=1e-6, rtol=0)
    assert math.isclose(float((w.encode(x) > 0).sum()), float((acts > 0).sum()))
