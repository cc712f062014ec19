"""Random per-layer scales (tl_directional.evaluate.sweeps.random_draws): seeded draws checked against an
independent implementation, run by sweep as a setting, resumable, with clear errors."""

from __future__ import annotations

import json
from statistics import NormalDist

import pytest
import torch

import tl_directional as tld
from tl_directional.cli import main
from tl_directional.edit import apply_edits, edits_for_space
from tl_directional.evaluate.sweeps import CheckpointMismatch
from tl_directional.evaluate.sweeps.random_draws import RandomScaleError, prefill_positions
from tl_directional.figures.sweep import sweep_figure

TEXTS = ["In the beginning God created the heaven and the earth.", "And the earth was without form, and void."]


def test_draws_are_seeded_and_match_an_independent_inverse_cdf():
    a = tld.random_scales(8, "uniform", seed=4)
    assert torch.equal(a, tld.random_scales(8, "uniform", seed=4))
    assert not torch.equal(a, tld.random_scales(8, "uniform", seed=5))
    assert a.shape == (8,) and a.dtype == torch.float64 and bool(((a >= 0) & (a <= 2)).all())
    u = torch.rand(8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    torch.testing.assert_close(a, 2 * u)
    g = tld.random_scales(8, "gaussian", seed=4)
    nd = NormalDist(1.0, 1 / 3)
    lo, hi = nd.cdf(0.0), nd.cdf(2.0)
    expect = torch.tensor([nd.inv_cdf(lo + (hi - lo) * float(x)) for x in u], dtype=torch.float64)
    torch.testing.assert_close(g, expect, rtol=1e-9, atol=1e-9)
    # a narrow truncation stays inside its range
    n = tld.random_scales(200, "gaussian", seed=1, low=0.4, high=0.6, mean=1.0, sd=0.1)
    assert bool(((n >= 0.4) & (n <= 0.6)).all())


def test_constant_per_layer_scales_equal_the_scalar_setting(tiny_model):
    """A setting whose per-layer draw is 0.5 everywhere is the fixed-0.5 setting; a real draw
    equals the edits applied by hand with that [n_layers] tensor."""
    model = tiny_model("gpt2")
    n = int(model.cfg.n_layers)
    flat = tld.Setting("value-exclusive", 0.5, 1.0, layer_s_par=(0.5,) * n, tag="flat")
    drawn = tld.random_setting("resid-attn", n, "uniform", seed=2)
    df = tld.sweep(model, TEXTS, [tld.Setting("value-exclusive", 0.5), flat, drawn], progress=False)
    rows = df.set_index("label")
    assert rows.loc[flat.label, "loss"] == pytest.approx(rows.loc["value-exclusive[s_par=0.5,s_perp=1,L=all]", "loss"],
                                                         rel=1e-6)
    batch = tld.prepare_inputs(model, TEXTS)
    edits = edits_for_space("resid-attn", tld.random_scales(n, seed=2), 1.0)
    with torch.no_grad(), apply_edits(model, *edits):
        logits = model(batch.tokens, attention_mask=batch.attention_mask)
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    nll = -logp.gather(-1, batch.tokens[:, 1:, None]).squeeze(-1)
    m = batch.attention_mask[:, 1:].bool() & batch.attention_mask[:, :-1].bool()
    assert rows.loc[drawn.label, "loss"] == pytest.approx(float(nll[m].mean()), rel=1e-5)
    assert "random=uniform,seed=2" in drawn.label and rows.loc[drawn.label, "status"] == "ok"


def test_random_setting_resumes_and_a_new_seed_is_a_new_fingerprint(tiny_model, tmp_path):
    model = tiny_model("gpt2")
    n = int(model.cfg.n_layers)
    ckpt = tmp_path / "ckpt.json"
    s = [tld.random_setting("value", n, "gaussian", seed=7)]
    first = tld.sweep(model, TEXTS, s, batch_size=1, checkpoint=ckpt, progress=False)
    again = tld.sweep(model, TEXTS, s, batch_size=1, checkpoint=ckpt, progress=False)
    assert first.equals(again)
    with pytest.raises(CheckpointMismatch):
        tld.sweep(model, TEXTS, [tld.random_setting("value", n, "gaussian", seed=8)], batch_size=1,
                  checkpoint=ckpt, progress=False)


def test_prefill_positions_scope_the_edit_to_the_prompt(tiny_model):
    model = tiny_model("llama")
    batch = tld.prepare_inputs(model, TEXTS[:1])
    n, p = int(model.cfg.n_layers), 4
    s = tld.random_scales(n, seed=0)
    mask = torch.arange(batch.tokens.shape[1]) < p
    with torch.no_grad():
        with apply_edits(model, tld.ValueScale(s, positions=prefill_positions(p))):
            a = model(batch.tokens)
        with apply_edits(model, tld.ValueScale(s, positions=mask)):
            b = model(batch.tokens)
    assert torch.equal(a, b)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"dist": "beta"}, r"dist must be one of \('uniform', 'gaussian'\), got 'beta'"),
    ({"low": -0.5}, r"inside \[0, 2\] with positive width"),
    ({"high": 3.0}, r"inside \[0, 2\]"),
    ({"low": 1.0, "high": 1.0}, r"positive width"),
    ({"dist": "gaussian", "sd": 0.0}, r"sd must be positive"),
    ({"seed": None}, r"seed must be an int"),
])
def test_bad_distributions_name_the_argument(kwargs, match):
    kw = {"seed": 0, **kwargs}
    with pytest.raises(RandomScaleError, match=match):
        tld.random_scales(4, **kw)
    assert issubclass(RandomScaleError, tld.TLDirectionalError) and issubclass(RandomScaleError, ValueError)
    with pytest.raises(RandomScaleError, match="prompt_length"):
        prefill_positions(0)


def test_prefill_only_generation_equals_the_manual_loop(tiny_model):
    """Generating under a prefill-only random edit gives the tokens of a greedy loop of full
    forwards under the same edit: the new tokens' positions lie past the prompt, so they run
    unedited while the prompt's stay edited."""
    model = tiny_model("gpt2")
    prompt = tld.prepare_inputs(model, ["In the beginning God created"]).tokens
    p = prompt.shape[1]
    edit = tld.ValueScale(tld.random_scales(int(model.cfg.n_layers), "gaussian", seed=1),
                          positions=prefill_positions(p))
    tokens = prompt
    with torch.no_grad(), apply_edits(model, edit):
        for _ in range(4):
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
        got = model.generate(prompt, max_new_tokens=4, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(got.cpu(), tokens.cpu())


def test_sweep_figure_draws_random_settings_apart(tiny_model):
    model = tiny_model("gpt2")
    n = int(model.cfg.n_layers)
    settings = [tld.Setting("value", 0.0), tld.Setting("value", 1.0), tld.random_setting("value", n, seed=0),
                tld.random_setting("value", n, seed=1)]
    df = tld.sweep(model, TEXTS[:1], settings, progress=False)
    traces = {t.name: t for t in sweep_figure(df).data}
    assert len(traces["value"].x) == 2 and len(traces["value random per-layer"].x) == 2
    assert traces["value random per-layer"].mode == "markers"


def test_cli_sweep_runs_random_settings_and_records_them(tiny_model_dir, tiny_model, tmp_path, capsys):
    n = int(tiny_model("gpt2").cfg.n_layers)
    model_dir = tiny_model_dir("gpt2")
    text = tmp_path / "t.txt"
    text.write_text("In the beginning was the word, and the word was with God. " * 20)
    out = tmp_path / "sw"
    args = ["sweep", "--model", str(model_dir), "--text", str(text), "--space", "resid-attn", "--s-par", "0.5",
            "--max-sequences", "2", "--seq-len", "16", "--out", str(out), "--quiet"]
    assert main(args + ["--random", "uniform:0,1;gaussian:3"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    label = "resid-attn[random=gaussian,seed=3,s_perp=1,L=all]"
    assert manifest["random_scales"][label] == tld.random_scales(n, "gaussian", seed=3).tolist()
    assert label in manifest["settings"] and len(manifest["random_scales"]) == 3
    capsys.readouterr()
    assert main(args[:-2] + [str(tmp_path / "other"), "--quiet", "--random", "beta:0"]) == 2
    assert "--random item 'beta:0' must be DIST:SEED" in capsys.readouterr().err
