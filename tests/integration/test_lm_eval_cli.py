"""lm-evaluation-harness's own command line on an edited model: the registered ``tl-directional``
model (tl_directional.evaluate.suites.lm_eval_model) run through ``tl-directional-lm-eval`` (lm-eval's
``cli_evaluate`` with the model registered; here as ``python -m tl_directional.cli.lm_eval``,
the same function the console script calls, so the test needs no reinstall) equals the Python
route (``evaluate_edited``) item for item on the bundled task and the bundled default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed on this lane (pip install 'tl-directional[hf]')")

from transformers import AutoTokenizer  # noqa: E402

from tl_directional.core.roundoff import roundoff_tolerance  # noqa: E402
from tl_directional.evaluate.suites.lm_eval_task import TASK_NAME, evaluate_edited  # noqa: E402
from tl_directional.evaluate.sweeps.edit_spec import spec_edits  # noqa: E402
from tl_directional.model.load import default_model_dir, load_hf_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 8
# removing the perpendicular part of every MLP update: the edit that brings the cloze to chance
SPEC = "resid-mlp[s_par=1,s_perp=0,L=all]"


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # this checkout first: the package under test, whatever an editable install points at
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm_eval_out")
    cmd = [sys.executable, "-m", "tl_directional.cli.lm_eval", "--model", "tl-directional",
           "--model_args", f"pretrained=default,edits={SPEC}", "--tasks", TASK_NAME, "--limit", str(LIMIT),
           "--batch_size", "8", "--device", "cpu", "--output_path", str(out), "--log_samples"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    (samples,) = out.rglob(f"samples_{TASK_NAME}_*.jsonl")
    rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
    return json.loads(results.read_text()), rows, proc


@pytest.fixture(scope="module")
def python_route():
    d = default_model_dir()
    model, tok = load_hf_model(d), AutoTokenizer.from_pretrained(str(d))
    edited = evaluate_edited(model, tok, spec_edits(SPEC), limit=LIMIT, log_samples=True)
    plain = evaluate_edited(model, tok, limit=LIMIT, log_samples=True)
    return edited, plain


def _loglik_python(result) -> list[list[float]]:
    return [[float(x[0][0]) for x in s["resps"]] for s in result["results"]["samples"][TASK_NAME]]


def _loglik_cli(rows) -> list[list[float]]:
    return [[float(x[0][0]) for x in r["resps"]] for r in rows]


def _gap(a: list[list[float]], b: list[list[float]]) -> tuple[float, float]:
    """``(largest |a - b|, largest |b|)`` over every choice's log-likelihood."""
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return max(abs(x - y) for x, y in pairs), max(abs(y) for _, y in pairs)


def test_cli_equals_the_python_route(cli_run, python_route):
    results, rows, _ = cli_run
    edited, plain = python_route
    assert len(rows) == LIMIT
    assert results["results"][TASK_NAME]["acc,none"] == edited["acc"][TASK_NAME]
    # every choice's log-likelihood within float32 round-off: the CLI is another process with
    # one thread, whose reductions may add in another order (seen: 1e-6 in one of -9.95)
    cfg = load_hf_model(default_model_dir()).config
    gap, size = _gap(_loglik_cli(rows), _loglik_python(edited))
    limit = roundoff_tolerance(torch.float32, size, cfg.n_embd * cfg.n_layer)
    assert gap <= limit, f"CLI and Python route differ by {gap:.3g} > {limit:.3g}"
    # and the edit was active: the unedited model's numbers differ by far more than that
    assert _gap(_loglik_cli(rows), _loglik_python(plain))[0] > 100 * limit


def test_cli_records_the_model_and_its_edits(cli_run):
    results, _, _ = cli_run
    config = results["config"]
    assert config["model"] == "tl-directional" and config["model_args"]["edits"] == SPEC
    assert config["tl_directional_edits"] == [SPEC]  # parsed back: the label of the setting applied
    assert Path(config["model_path"]) == default_model_dir() and config["model_dtype"] == "torch.float32"


def test_bad_spec_is_one_error_line_before_the_model_loads(capsys):
    from tl_directional.cli.lm_eval import main

    status = main(["--model", "tl-directional", "--model_args", "pretrained=default,edits=valu[s_par=0]",
                   "--tasks", TASK_NAME, "--limit", "1", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("error: edits='valu[s_par=0]': unknown space 'valu'; choose from value,")
    assert "Traceback" not in "\n".join(err)
    status = main(["--model", "tl-directional", "--model_args", "pretrained=/nonexistent/dir",
                   "--tasks", TASK_NAME, "--limit", "1", "--device", "cpu"])
    assert status == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: pretrained='/nonexistent/dir' is not a directory")


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11 has no tomllib")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tl-directional-lm-eval"] == "tl_directional.cli.lm_eval:main"


def test_carrier_edits_and_random_rows_run_and_a_truncated_file_is_one_error_line(tmp_path):
    """Issue 47: ``edits=mlp-carrier-input[...]`` was accepted by the spec parser and then failed
    inside lm-eval (TypeError); a ``sweep --random`` row label was refused (``unknown key
    'random'``) though every row label reads back; a truncated safetensors file ended in a
    traceback. The first two now run, the third is one ``error:`` line."""
    import shutil

    from tl_directional.cli.lm_eval import main
    from tl_directional.evaluate.sweeps.random_draws import random_setting

    common = ["--model", "tl-directional", "--tasks", TASK_NAME, "--limit", "1", "--device", "cpu",
              "--batch_size", "1"]
    label = random_setting("value", 4, "uniform", seed=2, layers=[1, 2]).label
    for spec in ("mlp-carrier-input[s_par=0,L=1]", label):
        assert main([*common, "--model_args", f"pretrained=default,edits={spec}",
                     "--output_path", str(tmp_path / "o")]) == 0, spec
    broken = tmp_path / "truncated"
    shutil.copytree(default_model_dir(), broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    # the real command in its own process: its stderr is what a user sees
    proc = subprocess.run([sys.executable, "-m", "tl_directional.cli.lm_eval", *common, "--model_args",
                           f"pretrained={broken}"], capture_output=True, text=True, timeout=600, env=_env())
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert err[-1].startswith(f"error: pretrained='{broken}' cannot be loaded") and "truncated" in err[-1]
