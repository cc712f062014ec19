"""studies/data/train_sae.py on the legacy lane with SAELens: the script's own SAELens training
run (``LanguageModelSAETrainingRunner``), shrunk to a few steps on a few windows, writes an SAE
in SAELens's saved format that ``SAE.load_from_disk`` and tl_directional both read, and
``quality.json`` beside it (the shipped SAE is this run at full size)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import tl_directional as tld

pytestmark = [pytest.mark.legacy, pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("sae_lens") is None,
    reason="sae_lens is not installed (SAELens 6 needs transformer-lens<4: legacy lane only, make venv LANE=legacy)")]


def test_the_script_trains_an_sae_with_sae_lens(tmp_path, monkeypatch):
    from studies.data import train_sae as T
    from tl_directional.model.load import load_model

    train_text, heldout = T.split_text()
    monkeypatch.setattr(T, "split_text", lambda: (train_text[:6_000], heldout[:3_000]))
    monkeypatch.setattr(T, "D_SAE", 32)
    monkeypatch.setattr(T, "TRAINING", dict(T.TRAINING, training_tokens=8 * 512, train_batch_size_tokens=512, store_batch_size_prompts=4,
                                            n_batches_in_buffer=8, n_batches_for_norm_estimate=2))
    model = load_model("default", lane="legacy")
    out = tmp_path / "sae"
    T.train(model, T.windows(model, T.split_text()[0]), out)
    report = T.measure(model, out, 1.0)
    assert {"cfg.json", "sae_weights.safetensors", "runner_cfg.json", "quality.json"} <= {p.name for p in out.iterdir()}
    cfg = json.loads((out / "cfg.json").read_text())
    assert (cfg["d_sae"], cfg["metadata"]["hook_name"], cfg["normalize_activations"]) == (32, T.HOOK, "none")
    assert set(report["files"]) == {"cfg.json", "runner_cfg.json", "sae_weights.safetensors", "sparsity.safetensors"}
    assert report["heldout"]["tokens"] > 0 and report["versions"]["sae-lens"].startswith("6.")
    d = tld.sae_directions(out, [0, 31], model=model)
    assert d.vectors.shape == (2, 256) and d.weights_processed is False and d.layer == T.LAYER
    assert torch.isfinite(d.vectors).all()
