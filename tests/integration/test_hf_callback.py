"""DirectionalEditCallback: an edit active inside ``transformers.Trainer`` (tiny GPT-2, CPU).

Reference numbers come from the HF edit path itself at the initial weights (checked against the
TransformerLens lane in test_hf_edits.py): the first logged training loss is the edited model's
loss on the first batch, and the first logged parallel share is the one measured on that batch.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (pip install 'tl-directional[hf]')")

from transformers import Trainer, TrainingArguments  # noqa: E402

from tl_directional.edit import DiagonalRemoval, ResidualScale, ValueScale  # noqa: E402
from tl_directional.edit import hf as thf  # noqa: E402
from tl_directional.model.load import load_hf_model  # noqa: E402
from tl_directional.training.hf_callback import DirectionalEditCallback, SparSchedule  # noqa: E402
from tl_directional.training.hf_recipe import token_dataset  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_dir(tiny_model_dir):
    return tiny_model_dir("gpt2")


@pytest.fixture(scope="module")
def dataset(gpt2_dir):
    return token_dataset(gpt2_dir, n_seqs=8, seq_len=16, seed=0)


def _args(out, **kw):
    base = dict(output_dir=str(out), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3,
                logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                dataloader_num_workers=0, disable_tqdm=True, lr_scheduler_type="constant")
    base.update(kw)
    return TrainingArguments(**base)


def _losses(trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def _shares(trainer) -> dict[int, dict[str, float]]:
    return {h["step"]: {k: v for k, v in h.items() if k.startswith("tld/")}
            for h in trainer.state.log_history if any(k.startswith("tld/") for k in h)}


def test_two_step_trainer_run_edits_and_logs(gpt2_dir, tmp_path):
    torch.manual_seed(0)
    edit = ValueScale(0.0)
    model = load_hf_model(gpt2_dir).train()
    # one batch is the whole dataset, so the first step's batch is known whatever the sampler draws
    dataset = token_dataset(gpt2_dir, n_seqs=4, seq_len=16, seed=1)
    args = _args(tmp_path / "a")
    first = {k: torch.stack([dataset[i][k] for i in range(4)]) for k in ("input_ids", "labels")}
    # the Trainer divides the summed loss by the number of label tokens it counts (unshifted)
    first["num_items_in_batch"] = torch.tensor(first["labels"].numel())
    with torch.no_grad():
        plain = model(**first).loss.item()
        handle = thf.install_edits(model, edit)
        handle.start_measuring()
        edited = model(**first).loss.item()
        shares0 = handle.stop_measuring()
        handle.remove()
    assert abs(plain - edited) > 1e-3
    cb = DirectionalEditCallback(edit, log_every=1)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[cb])
    trainer.train()
    losses, shares = _losses(trainer), _shares(trainer)
    assert sorted(losses) == [1, 2]
    assert abs(losses[1] - edited) < 1e-4, (losses[1], edited, plain)
    assert set(shares[1]) == {"tld/value/L0", "tld/value/L1"}
    for k, v in shares0.items():
        assert abs(shares[1][f"tld/{k}"] - v) < 1e-6 and 0.0 < v < 1.0
    assert thf.installed_edits(model) is None  # removed at the end of training


def test_schedule_values_and_errors():
    s = SparSchedule(1.0, 0.0, warmup_steps=4)
    assert [s(i) for i in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert SparSchedule.constant(0.5)(100) == 0.5
    with pytest.raises(ValueError, match=r"end=-0\.5 leaves the valid s_par range \[0\.0, 10\.0\]"):
        SparSchedule(1.0, -0.5, 3)
    with pytest.raises(ValueError, match="start"):
        SparSchedule(float("nan"), 0.0, 3)
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 0"):
        SparSchedule(1.0, 0.0, -1)
    with pytest.raises(ValueError, match="log_every"):
        DirectionalEditCallback(ValueScale(0.0), log_every=0)
    with pytest.raises(ValueError, match="no scale"):
        DirectionalEditCallback(DiagonalRemoval(), schedule=SparSchedule.constant(0.0))


def test_schedule_reaches_the_edit_and_is_logged(gpt2_dir, dataset, tmp_path):
    model = load_hf_model(gpt2_dir).train()
    cb = DirectionalEditCallback(ResidualScale("attn"), schedule=SparSchedule(1.0, 0.0, 2), log_every=1)
    trainer = Trainer(model=model, args=_args(tmp_path, max_steps=3), train_dataset=dataset, callbacks=[cb])
    trainer.train()
    shares = _shares(trainer)
    assert [shares[s]["tld/s_par"] for s in (1, 2, 3)] == [1.0, 0.5, 0.0]
    assert {"tld/resid-attn/L0", "tld/resid-attn/L1"} <= set(shares[1])


def test_off_for_eval_when_asked(gpt2_dir, dataset):
    model = load_hf_model(gpt2_dir)
    ids = dataset[0]["input_ids"].unsqueeze(0)
    with torch.no_grad():
        base = model(ids).logits
    cb = DirectionalEditCallback(ValueScale(0.0), during_eval=False)
    with cb:
        cb.on_train_begin(None, type("S", (), {"global_step": 0})(), None, model=model)
        with torch.no_grad():
            model.eval()
            assert torch.equal(model(ids).logits, base)
            model.train()
            assert not torch.allclose(model(ids).logits, base)
    assert thf.installed_edits(model) is None


def test_refused_when_edits_already_installed(gpt2_dir, dataset, tmp_path):
    model = load_hf_model(gpt2_dir)
    handle = thf.install_edits(model, ValueScale(0.5))
    try:
        trainer = Trainer(model=model, args=_args(tmp_path), train_dataset=dataset,
                          callbacks=[DirectionalEditCallback(ValueScale(0.0))])
        with pytest.raises(thf.EditsAlreadyInstalledError, match="remove_edits"):
            trainer.train()
    finally:
        handle.remove()


def test_checkpoint_resume_gives_the_same_curve(gpt2_dir, dataset, tmp_path):
    def run(out, resume=None, max_steps=4):
        torch.manual_seed(0)
        model = load_hf_model(gpt2_dir).train()
        cb = DirectionalEditCallback(ValueScale(0.0, mode="exclusive"), schedule=SparSchedule(1.0, 0.0, 3),
                                     log_every=1)
        args = _args(out, max_steps=max_steps, save_strategy="steps", save_steps=2)
        trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[cb])
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    resumed = run(tmp_path / "part", resume=str(tmp_path / "full" / "checkpoint-2"))
    lf, lr = _losses(full), _losses(resumed)
    assert sorted(lf) == [1, 2, 3, 4] and sorted(lr) == [1, 2, 3, 4]  # history restored, then continued
    for step in (3, 4):
        assert abs(lf[step] - lr[step]) < 1e-6, (step, lf[step], lr[step])
    sf, sr = _shares(full), _shares(resumed)
    for step in (3, 4):
        assert sf[step].keys() == sr[step].keys()
        for k in sf[step]:
            assert abs(sf[step][k] - sr[step][k]) < 1e-6, (step, k)
    assert sf[4]["tld/s_par"] == 0.0 and sf[2]["tld/s_par"] == pytest.approx(2 / 3)
