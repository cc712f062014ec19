"""Issue 21: the sweep's metrics are registries (tl_directional.evaluate.sweeps.metrics). Adding a metric
is one entry (a Quantity and a Metric), and the real-model studies (studies/realrun.py) count
every metric, top-1 agreement included, by the sweep's own rule."""

from __future__ import annotations

from types import MappingProxyType

import pytest
import torch
import torch.nn.functional as F

import tl_directional.evaluate.sweeps.metrics as M
from tl_directional.evaluate.sweeps import BaselineStats, MetricSums, grid, sweep
from tl_directional.evaluate.sweeps.sweep_store import SweepProgress


def _realrun():
    from studies import realrun

    return realrun


def _tie_logits():
    """Base logits whose argmax is token 3; edited logits where tokens 1 and 3 tie for the max
    (so ``edited.argmax()`` is 1, not the baseline's 3)."""
    base = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    base[..., 3] = 10.0
    edited = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    edited[..., 1] = 9.0
    edited[..., 3] = 9.0
    tokens = torch.randint(0, 8, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 4] = 0
    return base, edited, tokens, mask


def test_top1_agreement_is_one_rule_for_the_sweep_and_the_scripts():
    base, edited, tokens, mask = _tie_logits()
    assert (edited.argmax(-1) != base.argmax(-1)).all()  # argmax equality would say "disagree"
    sums = BaselineStats(base, tokens, mask).compare(edited)
    assert sums.top1_agree == sums.tokens == 7  # an exact tie for the largest counts as agreement
    R = _realrun()
    pred = M.prediction_mask(mask)
    per_seq = R._per_row(F.log_softmax(base[:, :-1], -1), F.log_softmax(edited[:, :-1], -1),
                         tokens[:, 1:].unsqueeze(-1), pred)
    assert R.SEQ_FIELDS == tuple(M.QUANTITIES) and per_seq.shape == (2, len(M.QUANTITIES))
    col = R.SEQ_FIELDS.index("top1_agree")
    assert float(per_seq[:, col].sum()) == sums.top1_agree


def test_the_scripts_per_sequence_sums_equal_the_sweeps():
    base = torch.randn(3, 9, 40, generator=torch.Generator().manual_seed(3))
    edited = base + 0.7 * torch.randn(3, 9, 40, generator=torch.Generator().manual_seed(4))
    tokens = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[2, 6:] = 0
    sums = BaselineStats(base, tokens, mask).compare(edited)
    R = _realrun()
    per_seq = R._per_row(F.log_softmax(base[:, :-1], -1), F.log_softmax(edited[:, :-1], -1),
                         tokens[:, 1:].unsqueeze(-1), M.prediction_mask(mask))
    total = per_seq.sum(0)
    for j, name in enumerate(M.QUANTITIES):
        assert float(total[j]) == pytest.approx(getattr(sums, name), rel=1e-5, abs=1e-5), name
    row = R.summarize(per_seq, R.bootstrap_weights(3, 10, 0))
    want = sums.row()
    for col in ("delta_loss", "delta_ppl", "kl", "top1_agree", "loss", "ppl", "base_loss", "base_ppl"):
        assert row[col] == pytest.approx(want[col], rel=1e-5, abs=1e-5), col
    assert list(row)[:4] == ["tokens", "delta_loss", "delta_loss_lo", "delta_loss_hi"]  # the scripts' order


@pytest.fixture
def accuracy_metric(monkeypatch):
    """A new metric, registered as one entry in each registry (nothing else is edited)."""
    quantity = M.Quantity("correct", lambda c: c.logits.argmax(-1) == c.target.squeeze(-1),
                          lambda b: float(((b._top1 == b._tgt.squeeze(-1)) & b._weight).sum()), count=True)
    metric = M.Metric("accuracy", ("accuracy",), lambda s, n: (s["correct"] / n,), {}, interval=("accuracy",))
    monkeypatch.setattr(M, "QUANTITIES", MappingProxyType({**M.QUANTITIES, "correct": quantity}))
    monkeypatch.setattr(M, "METRIC_REGISTRY", MappingProxyType({**M.METRIC_REGISTRY, "accuracy": metric}))
    return metric


def test_adding_a_metric_is_one_entry(accuracy_metric, tiny_model_dir, tmp_path):
    from tl_directional.model.load import load_model

    model = load_model(tiny_model_dir("gpt2"))
    toks = torch.randint(1, 400, (4, 12), generator=torch.Generator().manual_seed(0))
    settings = grid("value", s_par=[0.0, 2.0])
    ckpt = tmp_path / "sweep.progress.json"
    df = sweep(model, toks, settings, batch_size=2, metrics=["loss", "accuracy"], progress=False, checkpoint=ckpt)
    assert list(df.columns)[-4:] == ["loss", "base_loss", "delta_loss", "accuracy"]
    assert ((df["accuracy"] >= 0) & (df["accuracy"] <= 1)).all()
    with torch.no_grad():
        logits = model(toks)
    want = float((logits[:, :-1].argmax(-1) == toks[:, 1:]).double().mean())
    assert df.iloc[0]["accuracy"] == pytest.approx(want)  # the baseline row, from of_baseline
    # the checkpoint holds the new sum too, exactly (a count), and resumes
    back = SweepProgress.load(ckpt).sums
    assert all(len(s.values()) == len(M.QUANTITIES) == 6 for s in back.values())
    again = sweep(model, toks, settings, batch_size=2, metrics=["loss", "accuracy"], progress=False, checkpoint=ckpt)
    assert again.equals(df)
    # the scripts' per-sequence sums and their bootstrap carry it as well
    R = _realrun()
    base = torch.randn(2, 6, 30, generator=torch.Generator().manual_seed(6))
    lp, base_lp = F.log_softmax(base + torch.randn_like(base), -1), F.log_softmax(base, -1)
    target = torch.randint(0, 30, (2, 6, 1), generator=torch.Generator().manual_seed(7))
    per_seq = R._per_row(base_lp, lp, target, torch.ones(2, 6, dtype=torch.bool))
    assert per_seq.shape == (2, 6)
    row = R.summarize(per_seq, R.bootstrap_weights(2, 5, 0))
    assert {"accuracy", "accuracy_lo", "accuracy_hi"} <= row.keys()
    assert row["accuracy"] == pytest.approx(float((lp.argmax(-1) == target.squeeze(-1)).double().mean()))
    with pytest.raises(ValueError, match="unknown"):
        sweep(model, toks, settings, metrics=["nope"], progress=False)


def test_metric_sums_follow_the_registry():
    assert tuple(M.QUANTITIES) == ("tokens", "nll", "base_nll", "kl", "top1_agree")
    assert M.METRICS == tuple(M.METRIC_REGISTRY) == ("loss", "ppl", "kl", "top1_agree")
    s = MetricSums(4, 2.0, 1.0, 0.5, 3)
    assert s.to_disk() == [4, 2.0, 1.0, 0.5, 3] and MetricSums.from_disk(s.to_disk()) == s
    cols = ["tokens"] + [c for m in M.METRIC_REGISTRY.values() for c in m.columns]
    assert list(s.row()) == cols
    with pytest.raises(ValueError, match="list of 5 numbers"):
        MetricSums.from_disk([1, 2])
