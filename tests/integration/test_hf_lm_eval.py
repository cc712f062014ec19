"""lm-evaluation-harness on an edited HF model: the bundled local task ``tld_kjv_cloze``.

The model is the bundled pretrained default (4-layer GPT-2 trained on KJV, well above chance on a
KJV cloze); the first 40 items keep each evaluation to a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed on this lane (pip install 'tl-directional[hf]')")

from transformers import AutoTokenizer  # noqa: E402

from tl_directional.edit import ResidualScale, ValueScale  # noqa: E402
from tl_directional.evaluate.suites.lm_eval_task import (  # noqa: E402
    TASK_NAME,
    check_task_dir,
    evaluate_edited,
    task_dir,
)
from tl_directional.model.load import default_model_dir, load_hf_model  # noqa: E402

LIMIT = 40


@pytest.fixture(scope="module")
def default_hf():
    d = default_model_dir()
    return load_hf_model(d), AutoTokenizer.from_pretrained(str(d))


def _loglik(result) -> list[list[float]]:
    """Per item, the log-likelihood of each choice (``resps``: one ``[(loglik, is_greedy)]`` per choice)."""
    return [[float(x[0][0]) for x in s["resps"]] for s in result["results"]["samples"][TASK_NAME]]


def test_scale_one_equals_unedited_and_damage_lowers_accuracy(default_hf):
    model, tok = default_hf
    base = evaluate_edited(model, tok, limit=LIMIT, log_samples=True)
    one = evaluate_edited(model, tok, [ValueScale(1.0, mode="exclusive"), ResidualScale("mlp", 1.0, 1.0)],
                          limit=LIMIT, log_samples=True)
    assert base["acc"] == one["acc"]
    ll = _loglik(base)
    assert len(ll) == LIMIT and all(len(item) == 4 for item in ll)
    assert ll == _loglik(one)  # every choice's log-likelihood, bit for bit
    assert base["acc"][TASK_NAME] >= 0.5, "the bundled model should be well above chance (0.25)"
    damaged = evaluate_edited(model, tok, [ResidualScale("mlp", 1.0, 0.0)], limit=LIMIT)
    assert damaged["acc"][TASK_NAME] < base["acc"][TASK_NAME] - 0.2, (damaged["acc"], base["acc"])


def test_bad_task_dirs_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="task_dir="):
        check_task_dir(tmp_path / "nope", [TASK_NAME])
    (tmp_path / "bad.yaml").write_text("task: [unclosed\n")
    with pytest.raises(ValueError, match=r"task_dir=.*bad\.yaml is not valid YAML"):
        check_task_dir(tmp_path, [TASK_NAME])
    (tmp_path / "bad.yaml").write_text("task: mine\noutput_type: multiple_choice\n")
    with pytest.raises(ValueError, match=r"task 'mine' \(bad\.yaml\) lacks \['doc_to_text'"):
        check_task_dir(tmp_path, ["mine"])
    with pytest.raises(ValueError, match=r"\['other'\] not found"):
        check_task_dir(task_dir(), ["other"])
    assert check_task_dir(task_dir(), [TASK_NAME]) == task_dir()


def test_task_data_is_rebuilt_identically(tmp_path):
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "studies.data.make_lm_eval_task", "--n", "80",
                           "--seed", "0", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "kjv_cloze.jsonl").read_bytes() == (task_dir() / "kjv_cloze.jsonl").read_bytes()
    assert (tmp_path / "build.json").read_text() == (task_dir() / "build.json").read_text()
