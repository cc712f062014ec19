"""The accuracy table of docs/lm_eval.md: the bundled default model on the local task
``tld_kjv_cloze`` (80 items, zero-shot, lm-eval's HFLM) under several edits, each accuracy with
a 95% interval and its paired change against the unedited model.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m studies.explore.hf_lm_eval_table

Intervals: percentile bootstrap over items (2000 resamples, numpy seed 0, the same resampled
item sets for every setting), so a change is paired item by item with the unedited run.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoTokenizer

from studies import common
from tl_directional.edit import DiagonalRemoval, ResidualScale, ValueScale
from tl_directional.evaluate.suites.lm_eval_task import TASK_NAME, evaluate_edited
from tl_directional.model.load import default_model_dir, load_hf_model

SETTINGS = [
    ("unedited", ()),
    ("scale 1 (value exclusive + resid mlp)", (ValueScale(1.0, mode="exclusive"), ResidualScale("mlp", 1.0, 1.0))),
    ("V-Para removal, ValueScale(0.0)", (ValueScale(0.0),)),
    ("exclusive removal, ValueScale(0.0, mode='exclusive')", (ValueScale(0.0, mode="exclusive"),)),
    ("exclusive removal, joint form, ValueScale(0.0, mode='exclusive', joint=True)",
     (ValueScale(0.0, mode="exclusive", joint=True),)),
    ("resid attn parallel removal, ResidualScale('attn', 0.0)", (ResidualScale("attn", 0.0),)),
    ("hard diagonal removal, DiagonalRemoval()", (DiagonalRemoval(),)),
    ("resid MLP perpendicular removal, ResidualScale('mlp', 1.0, 0.0)", (ResidualScale("mlp", 1.0, 0.0),)),
]
RESAMPLES, SEED = 2000, 0


def item_correct(results: dict) -> np.ndarray:
    """Per-item correctness (0/1) of an ``evaluate_edited(..., log_samples=True)`` run, by doc id."""
    samples = sorted(results["results"]["samples"][TASK_NAME], key=lambda s: s["doc_id"])
    return np.array([float(s["acc"]) for s in samples])


def interval(values: np.ndarray, idx: np.ndarray, fmt: str = ".3f") -> str:
    """Mean of ``values`` and its percentile interval over the resampled item sets ``idx``."""
    boots = values[idx].mean(axis=1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return f"{values.mean():{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def main() -> None:
    torch.set_num_threads(1)
    d = default_model_dir()
    model, tok = load_hf_model(d), AutoTokenizer.from_pretrained(str(d))
    correct = {name: item_correct(evaluate_edited(model, tok, edits, log_samples=True)) for name, edits in SETTINGS}
    n = len(correct["unedited"])
    idx = np.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n))
    print(f"{n} items; 95% percentile bootstrap over items ({RESAMPLES} resamples, seed {SEED}), paired\n")
    print("| setting | accuracy [95% CI] | change vs unedited [95% CI] |\n|---|---|---|")
    for name, _ in SETTINGS:
        change = "-" if name == "unedited" else interval(correct[name] - correct["unedited"], idx, "+.3f")
        print(f"| {name} | {interval(correct[name], idx)} | {change} |")


if __name__ == "__main__":
    common.run_main(main)
