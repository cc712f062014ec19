"""The bundled pretrained default model (tl_directional/data/default_model): installed as package
data, small, pretrained, and the same logits through TransformerLens (this lane) and plain
transformers; both lanes are compared against the same stored transformers reference."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from tl_directional.model.load import (
    bundled_model_dir,
    default_model_dir,
    load_default_model,
    load_hf_model,
    load_model,
)


@pytest.fixture(scope="module")
def path():
    p = bundled_model_dir()
    assert p is not None, "tl_directional/data/default_model is missing from the installed package"
    return p


@pytest.fixture(scope="module")
def model(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: the real model loads
        return load_default_model()


@pytest.fixture(scope="module")
def reference(path):
    return json.loads((path / "reference_logits.json").read_text())


def test_default_resolves_to_the_bundled_model(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert default_model_dir() == path
    info = json.loads((path / "tl_directional_build.json").read_text())
    assert info["random_weights"] is False and info["train_config"]["variant"] == "baseline"


def test_bundled_model_is_small_and_float16(path):
    from safetensors import safe_open

    size = (path / "model.safetensors").stat().st_size
    assert size < 15e6
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_positions"]) == (4, 256, 256)
    assert cfg["resid_pdrop"] == cfg["attn_pdrop"] == cfg["embd_pdrop"] == 0.0


def test_loads_upcast_to_float32_ready_for_hooks(model):
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert len(model.tokenizer) <= model.cfg.d_vocab
    import tl_directional as tld

    prof = tld.profile(model, ["In the beginning God created the heaven and the earth."], progress=False)
    assert len(prof.residual) == 3 * model.cfg.n_layers


def _lane_logits(model, reference):
    tokens = torch.tensor([reference["tokens"]])
    assert model.to_tokens(reference["prompt"]).tolist() == tokens.tolist()
    with torch.no_grad():
        return model(tokens)[0].double()


def test_lane_logits_match_the_stored_transformers_reference(model, reference):
    """This lane (bridge or legacy) against the transformers logits stored when the model was
    exported: running the suite on both lanes checks bridge == HF == legacy."""
    logits = _lane_logits(model, reference)
    ids = torch.tensor(reference["top_ids"])
    torch.testing.assert_close(logits.gather(-1, ids), torch.tensor(reference["top_logits"], dtype=torch.float64),
                               atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(logits.logsumexp(-1), torch.tensor(reference["logsumexp"], dtype=torch.float64),
                               atol=2e-4, rtol=1e-4)
    assert logits.argmax(-1).tolist() == [row[0] for row in reference["top_ids"]]


def test_lane_logits_match_plain_transformers(model, path, reference):
    hf = load_hf_model(path)
    with torch.no_grad():
        expected = hf(torch.tensor([reference["tokens"]])).logits[0].double()
    torch.testing.assert_close(_lane_logits(model, reference), expected, atol=1e-4, rtol=1e-4)


def test_the_model_is_pretrained(model):
    """Held-out perplexity far below the uniform one (8192) and below a unigram-level model."""
    from tl_directional.io.corpus import heldout_text
    from tl_directional.training import evaluate_text

    text = heldout_text()[:12000]
    r = evaluate_text(model, text, batch_size=4)
    assert r["windows"] >= 4
    assert r["perplexity"] < 150, r
    assert math.isfinite(r["loss"])


def test_also_loads_from_its_directory_path(path):
    m = load_model(str(path))
    assert m.cfg.n_layers == 4
