"""The training experiment runner (tl_directional.training.experiment): statistics and one tiny end-to-end
run whose report is regenerated identically from the finished runs."""

from __future__ import annotations

import json
import math

import pytest

from tl_directional import training as T
from tl_directional.cli.train import experiment_main
from tl_directional.training import experiment as E


def test_paired_comparison_statistics():
    base = [3.0, 3.1, 2.9, 3.05, 3.2]
    var = [b - d for b, d in zip(base, [0.01, 0.02, 0.03, 0.02, 0.02], strict=True)]
    p = E.paired_comparison(var, base)
    assert p["n"] == 5 and p["wins"] == 5
    assert p["mean_diff"] == pytest.approx(-0.02)
    assert p["std_diff"] == pytest.approx(math.sqrt(0.0002 / 4))
    half = 2.7764451051977987 * p["std_diff"] / math.sqrt(5)  # t_{0.975, 4}
    assert (p["ci95_low"], p["ci95_high"]) == pytest.approx((-0.02 - half, -0.02 + half))
    assert p["perm_p"] == pytest.approx(2 / 32)  # all signs agree: only the two extreme flips
    mixed = E.paired_comparison([1.0, 2.0, 3.0], [1.1, 1.9, 3.0])
    assert mixed["perm_p"] == pytest.approx(1.0) and mixed["wins"] == 1


def test_t_quantiles():
    # exact quantiles at every df (tests/unit/test_student_t.py), not a 3-decimal table and 1.96 past df 30
    assert E.t975(4) == pytest.approx(2.7764451051977987, rel=1e-12)
    assert E.t975(100) == pytest.approx(1.983971518523552, rel=1e-12) and math.isnan(E.t975(0))


def test_tiny_experiment_end_to_end(tmp_path):
    base = T.TrainConfig(vocab_size=400, n_layers=1, d_model=16, n_heads=2, n_ctx=24, batch_size=4,
                         max_steps=3, warmup_steps=1, eval_every=3, eval_windows=4, ckpt_every=3,
                         keep_checkpoints=1)
    out = tmp_path / "exp"
    res = E.run_experiment(base, out, seeds=[0, 1], variants=["baseline", "vpara"], progress=False,
                           profile_windows=2)
    for f in ("curves.csv", "curves.html", "final.csv", "geometry.csv", "table.md", "results.json"):
        assert (out / f).is_file(), f
    assert (out / "profiles" / "vpara-s1" / "residual.csv").is_file()
    assert set(res["summary"]["paired"]) == {"vpara"}
    finals = {(r["variant"], r["seed"]): r["final_val_loss"] for r in res["finals"]}
    assert len(finals) == 4
    # same seed => same init and data order: the variants differ only through the edit
    init_a = (out / "runs" / "baseline-s0" / "init" / "model.safetensors").read_bytes()
    init_b = (out / "runs" / "vpara-s0" / "init" / "model.safetensors").read_bytes()
    assert init_a == init_b
    # Pre-edit geometry: the vpara models' own edit is active, yet beta is read before it.
    geo = res["summary"]["geometry"]["vpara"]
    assert abs(geo["value_beta_mean"]["mean"]) > 1e-3
    # The report is regenerated identically from the finished runs (no retraining).
    table = (out / "table.md").read_text()
    again = experiment_main(["--out", str(out), "--report-only", "--seeds", "0,1", "--variants", "baseline,vpara",
                    "--profile-windows", "2", "--quiet", *_flags(base)])
    assert again == 0
    assert (out / "table.md").read_text() == table
    assert json.loads((out / "results.json").read_text())["summary"] == json.loads(json.dumps(res["summary"]))


def _flags(cfg: T.TrainConfig) -> list[str]:
    out = []
    for k, v in cfg.to_dict().items():
        if v is not None and k not in ("variant", "seed"):
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


def test_experiment_needs_a_baseline(tmp_path):
    with pytest.raises(ValueError, match="baseline"):
        E.run_experiment(T.TrainConfig(), tmp_path, seeds=[0], variants=["vpara"], progress=False)
