"""``train_like_own_trainer(save_every=...)``: the HF ``Trainer`` + callback path checkpoints and a
run resumed from its last checkpoint returns the same per-step losses and final validation loss
as an uninterrupted one."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (pip install 'tl-directional[hf]')")

from tl_directional.training.config import BUILTIN_CORPUS, TrainConfig  # noqa: E402
from tl_directional.training.data import prepare_data  # noqa: E402
from tl_directional.training.hf_recipe import train_like_own_trainer  # noqa: E402


def test_resumed_hf_run_equals_uninterrupted(tmp_path):
    cfg = TrainConfig(corpus=BUILTIN_CORPUS, variant="vpara", vocab_size=512, n_layers=2, d_model=32, n_heads=4,
                      n_ctx=32, batch_size=4, max_steps=4, warmup_steps=1, lr=3e-3, eval_windows=8)
    data = prepare_data(cfg, tmp_path)
    whole = train_like_own_trainer(cfg, data, tmp_path / "whole")
    run = tmp_path / "split"
    first = train_like_own_trainer(cfg, data, run, save_every=2)
    assert first["train_losses"] == whole["train_losses"] and first["val_loss"] == whole["val_loss"]
    assert sorted(p.name for p in (run / "trainer").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    shutil.rmtree(run / "trainer" / "checkpoint-4")  # as if stopped after step 3
    kept = run / "trainer" / "checkpoint-2" / "tld_train_losses.json"
    assert json.loads(kept.read_text()) == whole["train_losses"][:2]
    kept.write_text("[1.0, 2.0]")  # marks the first two steps: a resumed run does not redo them
    resumed = train_like_own_trainer(cfg, data, run, save_every=2)
    assert resumed["train_losses"] == [1.0, 2.0] + whole["train_losses"][2:]
    assert resumed["val_loss"] == whole["val_loss"]
