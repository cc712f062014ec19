"""The pass8m page's trajectory reading (protocol sec. 10): where a variant runs ahead of the
baseline over training, from per-seed validation curves, against the paper's "ahead from early
training stages ... through the final checkpoint"."""

from __future__ import annotations

import pandas as pd

from studies.pass_training import page as pass_page
from studies.pass_training import run as pass_run


def _curves(gaps_by_seed: dict[int, list[float]]) -> pd.DataFrame:
    rows = []
    for seed, gaps in gaps_by_seed.items():
        for i, g in enumerate([0.0, *gaps]):
            base = 9.0 - 0.5 * i
            rows.append({"variant": "baseline", "seed": seed, "step": 100 * i, "val_loss": base})
            rows.append({"variant": "vpara", "seed": seed, "step": 100 * i, "val_loss": base + g})
    return pd.DataFrame(rows)


def test_an_early_lead_that_is_lost_is_read_as_lost():
    # seed 0 and 1 differ, their mean decides: ahead at 100-300, behind from 400 on
    c = _curves({0: [-0.2, -0.1, -0.01, 0.02, 0.03], 1: [-0.1, -0.05, -0.03, 0.04, 0.01]})
    tr = pass_page.trajectory(c, "vpara")
    assert tr == {"ahead": [100, 200, 300], "behind": [400, 500], "since": 400, "last_behind": True, "seeds": [0, 1],
                  "clear_ahead": [], "clear_behind": []}
    line = pass_page.trajectory_sentence(c, "vpara", per_step=10)
    assert "ahead at the first evaluation (step 100); behind the baseline from step 400 (4,000 tokens)" in line
    assert "ahead at 3, behind at 2 of 5" in line and "mean over seeds 0, 1" in line
    # two seeds that disagree this much leave every step's interval across zero
    assert line.endswith("the paired 95% interval includes zero at every step (per step, uncorrected).")


def test_steps_where_the_paired_interval_excludes_zero_are_named():
    # three seeds close together: ahead clearly at 100 and 200, behind clearly at 400, unclear at 300
    c = _curves({0: [-0.10, -0.05, -0.03, 0.050], 1: [-0.11, -0.06, 0.04, 0.052], 2: [-0.12, -0.04, 0.00, 0.048]})
    tr = pass_page.trajectory(c, "vpara")
    assert tr["clear_ahead"] == [100, 200] and tr["clear_behind"] == [400]
    # at 300: mean +0.0033, sd 0.035, half-width 4.303 * 0.035 / sqrt(3) = 0.087: across zero
    line = pass_page.trajectory_sentence(c, "vpara", per_step=1)
    assert line.endswith("the paired 95% interval excludes zero ahead at steps 100, 200 and behind at step 400 "
                         "(per step, uncorrected).")


def test_a_lead_kept_to_the_end_is_read_from_its_first_step():
    c = _curves({0: [0.05, -0.01, -0.02, -0.03]})
    tr = pass_page.trajectory(c, "vpara")
    assert tr["since"] == 200 and tr["last_behind"] is False
    line = pass_page.trajectory_sentence(c, "vpara", per_step=1)
    assert "behind at the first evaluation (step 100); ahead of the baseline from step 200" in line
    # a variant without runs yet says so
    assert pass_page.trajectory_sentence(c, "attn-para", per_step=1) == "- attn-para: no paired steps yet."


def test_the_scale_gap_is_counted_from_the_config():
    # protocol sec. 10's grid: 4 x 128, 2 heads, d_mlp 512, vocabulary 8,192, n_ctx 256
    cfg = {"n_layers": 4, "d_model": 128, "vocab_size": 8192, "n_ctx": 256, "max_steps": 1100, "batch_size": 32}
    sc = pass_page.scale(cfg)
    assert sc["tokens"] == 9_011_200
    assert sc["params_nonemb"] == 786_432 and sc["params"] == 786_432 + 8192 * 128 + 256 * 128
    assert round(sc["paper_params_x"]) == 158 and round(sc["paper_tokens_x"]) == 233


def test_missing_names_every_task_without_a_final():
    rows = [{"variant": v, "seed": s, "path": "own"} for v in pass_run.VARIANTS for s in pass_run.SEEDS]
    rows.remove({"variant": "vpara", "seed": 2, "path": "own"})
    rows.append({"variant": "baseline", "seed": 0, "path": "hf"})
    assert pass_page.missing(pd.DataFrame(rows)) == ["own-vpara-s2"] + [f"hf-{v}-s0" for v in pass_run.VARIANTS if v != "baseline"]


def _finals(own: dict[str, list[float]], hf: dict[str, float]) -> pd.DataFrame:
    rows = [{"variant": v, "seed": s, "path": "own", "final_val_loss": x} for v, xs in own.items() for s, x in enumerate(xs)]
    rows += [{"variant": v, "seed": 0, "path": "hf", "final_val_loss": x} for v, x in hf.items()]
    return pd.DataFrame(rows)


OWN = {"baseline": [4.456, 4.474, 4.478], "vpara": [4.482, 4.449, 4.458], "attn-para": [4.451, 4.490, 4.441]}
TRAIN = pd.DataFrame({"hf_train_loss": [5.0, 4.6], "own_train_loss": [5.0, 4.6001]})


def test_the_users_path_is_equal_within_the_tolerance():
    hf = {"baseline": 4.456 + 4e-6, "vpara": 4.482 - 9e-6, "attn-para": 4.451}
    (_, line) = pass_page.hf_reading(_finals(OWN, hf), TRAIN)
    assert ("largest gap of the interval-mean training loss 0.0001, of the final validation loss 9e-06 nats "
            "(baseline 4e-06, vpara 9e-06, attn-para 0)") in line
    assert "within the existing tolerance of 1e-5 nats, so the user's path is **equal**" in line
    assert "vpara seed 0: own +0.0260, HF +0.0260 (same sign)" in line


def test_above_the_tolerance_the_sign_rule_decides():
    agree = {"baseline": 4.456 + 2e-5, "vpara": 4.481, "attn-para": 4.452}
    line = pass_page.hf_reading(_finals(OWN, agree), TRAIN)[1]
    assert "above the existing tolerance of 1e-5 nats, so not equal" in line
    assert "the seed-to-seed standard deviation of the baseline's final loss (0.012 nats)" in line
    # the attn-para difference is -0.005 on the own trainer and -0.004 on the HF path: same sign
    assert "Under it the user's path **agrees**" in line and "opposite" not in line
    flips = {"baseline": 4.456 + 2e-5, "vpara": 4.481, "attn-para": 4.460}
    line = pass_page.hf_reading(_finals(OWN, flips), TRAIN)[1]
    assert "**does not agree**" in line and "attn-para seed 0: own -0.0050, HF +0.0040 (**opposite sign**)" in line
    waiting = {"baseline": 4.456 + 2e-5}
    line = pass_page.hf_reading(_finals(OWN, waiting), TRAIN)[1]
    assert "waits for the variants' HF runs" in line and line.endswith("on both paths: -.")
    assert pass_page.hf_reading(_finals(OWN, {}), TRAIN.iloc[:0]) == []
