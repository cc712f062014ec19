"""Issue 37, "silently wrong": damaged weights, non-finite edits and sweeps, and arguments that
were accepted as no-ops. Every case goes through the public API or the real CLI entry point and
failed (accepted, or gave numbers) before the fix."""

from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tl_directional as tld
from tests.integration.test_cli_rough_edges import _one_error_line
from tests.integration.test_habits import _cli
from tl_directional.edit import NonFiniteEditError
from tl_directional.model.load import (
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
        load_hf_model(bad)  # the plain-transformers loader (tl_directional.edit.hf) too


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


# -- non-finite results raise ------------------------------------------------------------------


@pytest.mark.parametrize("edit", [tld.ValueScale(1e39), tld.ValueScale(1e39, mode="exclusive"),
                                  tld.EffectiveDiagonal(1e39), tld.ResidualScale("mlp", s_par=1e30),
                                  tld.ResidualScale("attn", s_perp=1e25)], ids=repr)
def test_overflowing_edit_raises_in_float32_naming_edit_layer_and_scale(tiny_model, edit):
    """float32, not only half precision: 1e39 is inf in float32; 1e30 on a residual update is
    finite, but the next norm squares it (its scale was inf and the logits looked plausible)."""
    model = tiny_model("gpt2")
    tokens = model.to_tokens(["In the beginning was the word"])
    with torch.no_grad(), pytest.raises(NonFiniteEditError) as info, tld.apply_edits(model, edit):
        model(tokens)
    message = str(info.value)
    assert repr(edit) in message and "at layer 0" in message and "smaller scales" in message
    with torch.no_grad():  # the hooks are gone and the model is intact
        assert bool(torch.isfinite(model(tokens)).all())


def test_edits_at_ordinary_scales_do_not_raise(tiny_model):
    model = tiny_model("llama")
    tokens = model.to_tokens(["In the beginning was the word"])
    with torch.no_grad():
        for edit in (tld.ValueScale(-1.0), tld.ResidualScale("block", 1e3, 0.0), tld.EffectiveDiagonal(5.0)):
            with tld.apply_edits(model, edit):
                assert bool(torch.isfinite(model(tokens)).all())


def test_sweep_records_an_overflowing_setting_with_its_reason(tiny_model):
    from tl_directional.evaluate.sweeps import grid, sweep

    model = tiny_model("gpt2")
    texts = [TEXT[:200], TEXT[200:400], TEXT[400:600]]
    for stack in (1, 3):
        df = sweep(model, texts, grid("value,resid-mlp", s_par=[0.0, 1e30, 1e39]), batch_size=2, stack=stack,
                   progress=False).set_index("label")
        assert set(df["status"]) == {"ok", "failed"}
        for label in ("value[s_par=0,s_perp=1,L=all]", "resid-mlp[s_par=0,s_perp=1,L=all]", "baseline"):
            assert df.loc[label, "status"] == "ok" and df.loc[label, "reason"] == ""
            assert math.isfinite(df.loc[label, "delta_loss"])
        for label in ("value[s_par=1e+39,s_perp=1,L=all]", "resid-mlp[s_par=1e+30,s_perp=1,L=all]",
                      "resid-mlp[s_par=1e+39,s_perp=1,L=all]", "value[s_par=1e+30,s_perp=1,L=all]"):
            row = df.loc[label]
            assert row["status"] == "failed", label
            assert "NonFinite" not in row["reason"] and "at layer 0" in row["reason"] and "s_par=1e+" in row["reason"]
            assert math.isnan(row["delta_loss"]) and math.isnan(row["kl"])


def test_cli_sweep_with_an_overflowing_scale_exits_1_with_the_reason(tiny_model_dir, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    rc, err = _cli("sweep", "--model", tiny_model_dir("gpt2"), "--text", text, "--space", "value",
                   "--s-par=0,1e39", "--out", tmp_path / "o", "--quiet", "--max-sequences", "2", "--seq-len", "32")
    assert rc == 1, err
    assert "failed: value[s_par=1e+39,s_perp=1,L=all]: ValueScale(s_par=1e+39" in err and "Traceback" not in err
    assert "1 of 2 settings failed" in err
    import pandas as pd

    table = pd.read_csv(tmp_path / "o" / "sweep.csv").set_index("label")
    assert table.loc["value[s_par=1e+39,s_perp=1,L=all]", "status"] == "failed"
    assert table.loc["value[s_par=0,s_perp=1,L=all]", "status"] == "ok"


def test_a_space_that_cannot_take_the_requested_s_perp_is_an_error_not_a_dropped_row(tiny_model_dir, tmp_path):
    from tl_directional.evaluate.sweeps import grid

    with pytest.raises(ValueError, match=r"spaces has 'eff-diag', which scales only the parallel part .*"
                                         r"s_perp \(--s-perp\) has 0.5; sweep 'eff-diag' in a grid of its own"):
        grid("value,eff-diag", s_par=[0.0], s_perp=[0.5])
    with pytest.raises(ValueError, match="'eff-diag'"):
        grid("eff-diag", s_par=[0.0], s_perp=[1.0, 0.5])
    assert {s.space for s in grid("value,eff-diag,hard-diag", s_par=[0.0])} == {"value", "eff-diag", "hard-diag"}
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    rc, err = _cli("sweep", "--model", tiny_model_dir("gpt2"), "--text", text, "--space", "value,eff-diag",
                   "--s-par=0", "--s-perp=0.5", "--out", tmp_path / "o", "--quiet")
    _one_error_line(rc, err, "'eff-diag'", "--s-perp")


# -- no silent no-op argument --------------------------------------------------------------------


def test_zero_or_partly_zero_reference_is_an_error_naming_reference(tiny_model):
    d = tiny_model("gpt2").cfg.d_model
    with pytest.raises(ValueError, match=r"reference has a zero direction \(it is zero"):
        tld.ResidualScale("mlp", s_par=0.0, reference=torch.zeros(d))
    partly = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(0))
    partly[1, 3] = 0.0
    with pytest.raises(ValueError, match=r"reference has a zero direction \(1 of its 10 directions are zero"):
        tld.ResidualScale("attn", s_par=0.0, reference=partly)
    with pytest.raises(ValueError, match="reference has non-finite values"):
        tld.ResidualScale("attn", reference=torch.full((d,), float("nan")))
    tld.ResidualScale("mlp", s_par=0.0, reference=torch.ones(d))  # a real direction is fine


def test_decompose_validates_eps_like_every_other_entry_point():
    u, r = torch.randn(3, 8), torch.randn(3, 8)
    for eps in (-1.0, float("nan"), 0.0, float("inf")):
        with pytest.raises(ValueError, match="eps must be a finite float > 0"):
            tld.decompose(u, r, eps=eps)
    assert torch.allclose(tld.decompose(u, r, eps=1e-9).par + tld.decompose(u, r).perp, u, atol=1e-6)


@pytest.mark.parametrize("positions,fragment", [
    ([], r"positions=\[\] is empty: the edit would change nothing"),
    (torch.tensor([], dtype=torch.long), "is empty: the edit would change nothing"),
    (torch.zeros(9, dtype=torch.bool), "bool mask with no True entry"),
    (torch.tensor([True, False, True, False, True]), r"bool mask of shape \(5,\), 5 positions, but the sequence has 9"),
    (torch.ones(1, 12, dtype=torch.bool), "12 positions, but the sequence has 9"),
])
def test_empty_positions_and_wrong_length_masks_raise(tiny_model, positions, fragment):
    model = tiny_model("gpt2")
    tokens = torch.arange(1, 10).unsqueeze(0)  # 9 tokens
    for edit in (tld.ValueScale(0.0, positions=positions), tld.ResidualScale("attn", 0.0, positions=positions)):
        with torch.no_grad(), pytest.raises(ValueError, match=fragment), tld.apply_edits(model, edit):
            model(tokens)
    mask = torch.zeros(9, dtype=torch.bool)
    mask[[2, 5]] = True
    with torch.no_grad():  # a mask of the right length is the same edit as its positions
        with tld.apply_edits(model, tld.ValueScale(0.0, positions=mask)):
            a = model(tokens)
        with tld.apply_edits(model, tld.ValueScale(0.0, positions=[2, 5])):
            b = model(tokens)
    assert torch.equal(a, b)


def test_duplicate_experiment_seeds_are_refused_naming_seeds(tmp_path):
    from tl_directional.cli.train import experiment_main
    from tl_directional.training.experiment import check_seeds

    with pytest.raises(ValueError, match=r"seeds repeats seed\(s\) 0"):
        check_seeds([0, 0])
    rc, err = _cli("experiment", "--seeds", "0,0", "--out", tmp_path / "x")
    _one_error_line(rc, err, "--seeds repeats seed(s) 0", "distinct seeds")
    assert not (tmp_path / "x").exists()
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        assert experiment_main(["--seeds", "0,x", "--out", str(tmp_path / "y")]) == 2
    assert "--seeds '0,x': expected comma-separated integers" in buf.getvalue()


def test_split_logit_attribution_past_the_context_is_an_error(tiny_model):
    model = tiny_model("gpt2")
    long_text = " ".join(["and the earth was without form and void"] * 40)
    ids = model.tokenizer(long_text, add_special_tokens=False)["input_ids"]
    assert len(ids) > model.cfg.n_ctx
    with pytest.raises(ValueError, match=r"inputs\[0\] has \d+ tokens, more than the model's context of 128: "
                                         "the answer follows the text's last token.*last n_ctx token ids"):
        tld.split_logit_attribution(model, long_text, 5)
    short = torch.tensor([ids[-model.cfg.n_ctx:]])  # the fix the message names: the last n_ctx ids
    table = tld.split_logit_attribution(model, short, 5)
    assert len(table) and table["dla"].notna().any()


def test_processed_weights_warn_on_edits_too(tiny_model, lane):
    model = tiny_model("gpt2", fresh=True)
    if lane == "bridge":
        model.enable_compatibility_mode(disable_warnings=True)
    else:  # fold_ln=False: split_logit_attribution reads ln_final.hook_scale, which folding removes
        model.process_weights_(fold_ln=False, center_writing_weights=True, center_unembed=True)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    for enter in (lambda: tld.apply_edits(model, tld.ValueScale(0.0)),
                  lambda: model.hooks(fwd_hooks=tld.ResidualScale("mlp", 0.5).fwd_hooks(model))):
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            with torch.no_grad(), enter():
                model(tokens)
        assert any(issubclass(w.category, tld.WeightProcessingWarning) and "processed" in str(w.message)
                   for w in log)
    with pytest.warns(tld.WeightProcessingWarning, match="processed"):
        tld.split_logit_attribution(model, tokens, 5)


def test_safe_scale_search_counts_an_overflowing_scale_as_over_budget(tiny_model):
    from tl_directional.evaluate.sweeps import find_safe_scale

    model = tiny_model("gpt2")
    (res,) = find_safe_scale(model, [TEXT[:200]], "value", budget=10.0, bounds=(-1.0, 1e30), grid_points=3,
                             refine_steps=2)
    assert res.evaluations["cost"].iloc[-1] == math.inf  # the overflowing point, not a crash
    assert res.interval[1] < 1e29 and not res.hit_bounds[1]


def test_a_config_that_does_not_fit_the_weights_is_refused_before_allocation(tmp_path):
    """Issue 47: a directory whose config.json says Llama (its defaults: 4096 wide, 32 layers,
    6.7B values) beside GPT-2 weights used to build the full Llama before any weight check (killed
    at 22.8 GB on the legacy lane). The CLI runs here under an 8 GB address-space limit: the
    refusal must come from the file headers, before anything of that size is allocated."""
    import json
    import subprocess
    import sys

    from tl_directional.model.load import default_model_dir

    bad = tmp_path / "llama-config-gpt2-weights"
    shutil.copytree(default_model_dir(), bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
            "from tl_directional.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", code, "profile", "--model", str(bad), "--out",
                           str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, timeout=300)
    _one_error_line(done.returncode, done.stderr, "config.json describes LlamaForCausalLM",
                    "does not belong to these weights", "nothing was built")
