"""Issue 37, "silently wrong": damaged weights, non-finite edits and sweeps, and arguments that
were accepted as no-ops. Every case goes through the public API or the real CLI entry point and
failed (accepted, or gave numbers) before the fix."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tl_directional as tld
from tests.integration.test_cli_rough_edges import _one_error_line
from tests.integration.test_habits import _cli
from tl_directional.models import (
    DamagedWeightsError,
    DamagedWeightsWarning,
    build_tiny_hf_model,
    load_hf_model,
    load_model,
)

TEXT = " ".join(f"In the beginning word {i} was spoken and the people heard it." for i in range(40))


# -- damaged weights are never numbers ---------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_3l(tmp_path_factory) -> Path:
    """A seeded 3-layer GPT-2 directory (so that ``h.2`` exists, as in the issue)."""
    return build_tiny_hf_model("gpt2", tmp_path_factory.mktemp("gpt2_3l") / "m", n_layers=3)


def _damaged(src: Path, dst: Path, how: str) -> Path:
    """A copy of ``src`` whose ``model.safetensors`` lost, gained or reshaped one tensor."""
    shutil.copytree(src, dst)
    (dst / "manifest.json").unlink(missing_ok=True)  # the damage is in the tensors, not the bytes
    sd = load_file(dst / "model.safetensors")
    if how == "missing":
        del sd["transformer.h.2.attn.c_proj.weight"]
    elif how == "unexpected":
        sd["transformer.h.2.attn.extra.weight"] = torch.zeros(4, 4)
    else:  # wrong shape
        w = sd["transformer.h.2.attn.c_proj.weight"]
        sd["transformer.h.2.attn.c_proj.weight"] = w[:, : w.shape[1] // 2].contiguous()
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


_NAMED = {"missing": "missing tensor(s) transformer.h.2.attn.c_proj.weight",
          "unexpected": "unexpected tensor(s) transformer.h.2.attn.extra.weight",
          "shape": "wrong-shaped tensor(s) transformer.h.2.attn.c_proj.weight"}


@pytest.mark.parametrize("how", ["missing", "unexpected", "shape"])
def test_damaged_model_directory_is_an_error_naming_the_tensor(gpt2_3l, tmp_path, how):
    bad = _damaged(gpt2_3l, tmp_path / "bad", how)
    with pytest.raises(DamagedWeightsError, match=_NAMED[how].replace("(", r"\(").replace(")", r"\)")) as info:
        load_model(bad)
    assert isinstance(info.value, ValueError) and "name_or_path=" in str(info.value)
    with pytest.raises(DamagedWeightsError, match="transformer.h.2.attn"):
        load_hf_model(bad)  # the plain-transformers loader (tl_directional.hf) too


def test_damaged_weights_load_on_request_with_a_loud_warning(gpt2_3l, tmp_path):
    bad = _damaged(gpt2_3l, tmp_path / "bad", "missing")
    with pytest.warns(DamagedWeightsWarning, match="transformer.h.2.attn.c_proj.weight"):
        model = load_model(bad, damaged_weights="warn")
    assert model.cfg.n_layers == 3
    with pytest.raises(ValueError, match="damaged_weights must be 'error' or 'warn', got 'ignore'"):
        load_model(gpt2_3l, damaged_weights="ignore")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedWeightsWarning)
        load_model(gpt2_3l)  # an intact directory: no warning


@pytest.mark.parametrize("how", ["missing", "shape"])
def test_cli_profile_and_sweep_on_damaged_weights_exit_2_naming_the_tensor(gpt2_3l, tmp_path, how):
    bad = _damaged(gpt2_3l, tmp_path / "bad", how)
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    for argv in (["profile"], ["sweep", "--space", "value", "--s-par=0"]):
        rc, err = _cli(*argv, "--model", bad, "--text", text, "--out", tmp_path / argv[0], "--quiet")
        _one_error_line(rc, err, f"--model {bad}", "transformer.h.2.attn.c_proj.weight")
        assert not (tmp_path / argv[0]).exists()


@pytest.mark.parametrize("role", ["--compressed", "--dense"])
def test_compress_check_on_damaged_weights_exits_2_not_a_gate_result(gpt2_3l, tmp_path, role):
    bad = _damaged(gpt2_3l, tmp_path / "bad", "missing")
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    pair = {"--dense": gpt2_3l, "--compressed": gpt2_3l, role: bad}
    rc, err = _cli("compress-check", "--dense", pair["--dense"], "--compressed", pair["--compressed"],
                   "--text", text, "--max-sequences", "2", "--seq-len", "32", "--max-perp-error", "0.5")
    _one_error_line(rc, err, role, "missing tensor(s) transformer.h.2.attn.c_proj.weight")
