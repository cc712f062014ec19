"""The accuracy table of docs/lm_eval.md: the bundled default model on the local task
``tld_kjv_cloze`` (80 items, zero-shot, lm-eval's HFLM) under several edits.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/hf_lm_eval_table.py
"""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

try:
    import _common  # scripts/ is sys.path[0] when a script runs
except ImportError:  # loaded by file path (the tests): through the package
    from scripts import _common

from tl_directional.edit import DiagonalRemoval, ResidualScale, ValueScale
from tl_directional.evaluate.lm_eval_task import TASK_NAME, evaluate_edited
from tl_directional.model.load import default_model_dir, load_hf_model

SETTINGS = [
    ("unedited", ()),
    ("scale 1 (value exclusive + resid mlp)", (ValueScale(1.0, mode="exclusive"), ResidualScale("mlp", 1.0, 1.0))),
    ("V-Para removal, ValueScale(0.0)", (ValueScale(0.0),)),
    ("exclusive removal, ValueScale(0.0, mode='exclusive')", (ValueScale(0.0, mode="exclusive"),)),
    ("resid attn parallel removal, ResidualScale('attn', 0.0)", (ResidualScale("attn", 0.0),)),
    ("hard diagonal removal, DiagonalRemoval()", (DiagonalRemoval(),)),
    ("resid MLP perpendicular removal, ResidualScale('mlp', 1.0, 0.0)", (ResidualScale("mlp", 1.0, 0.0),)),
]


def main() -> None:
    torch.set_num_threads(1)
    d = default_model_dir()
    model, tok = load_hf_model(d), AutoTokenizer.from_pretrained(str(d))
    print("| setting | accuracy |\n|---|---|")
    for name, edits in SETTINGS:
        acc = evaluate_edited(model, tok, edits)["acc"][TASK_NAME]
        print(f"| {name} | {acc:.4f} |")


if __name__ == "__main__":
    _common.run_main(main)
