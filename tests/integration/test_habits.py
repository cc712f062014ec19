"""TransformerLens habits that used to give wrong or surprising results (issue 14).

Each test goes through the public API a TL user would reach for first."""

import pytest
import torch

import tl_directional as tld
from tl_directional.model.load import load_model

PROMPT = "In the beginning God created"


@pytest.fixture(scope="module")
def default_model():
    return load_model("default")


def _model(name, tiny_model, default_model):
    return default_model if name == "default" else tiny_model(name)


def _manual_greedy(model, tokens, n):
    """The reference: argmax of a full forward pass, one token at a time."""
    for _ in range(n):
        with torch.no_grad():
            nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


# -- 1. generate ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "llama", "neox", "default"])
@pytest.mark.parametrize("edit", [None, "value"])
def test_generate_equals_manual_greedy_loop(name, edit, tiny_model, default_model):
    model = _model(name, tiny_model, default_model)
    prompt = tld.prepare_inputs(model, [PROMPT]).tokens
    edits = [] if edit is None else [tld.ValueScale(0.0, layers=[0])]
    with tld.apply_edits(model, *edits):
        want = _manual_greedy(model, prompt, 6)
        got = model.generate(prompt, max_new_tokens=6, do_sample=False, stop_at_eos=False, verbose=False)
        text = model.generate(PROMPT, max_new_tokens=6, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(got.cpu(), want.cpu())
    assert text == model.tokenizer.decode(want[0], skip_special_tokens=True)


def test_cached_generate_is_right_or_refused(tiny_model, lane):
    """Explicit use_past_kv_cache=True gives the manual loop's tokens where the cache is
    right (legacy lane; NeoX on the bridge) and a clear error where it is not."""
    for name in ("gpt2", "llama", "neox"):
        model = tiny_model(name)
        prompt = tld.prepare_inputs(model, [PROMPT]).tokens
        want = _manual_greedy(model, prompt, 5)
        if lane == "bridge" and name != "neox":
            with pytest.raises(ValueError, match="use_past_kv_cache=False"):
                model.generate(prompt, max_new_tokens=5, do_sample=False, use_past_kv_cache=True,
                               stop_at_eos=False, verbose=False)
            continue
        got = model.generate(prompt, max_new_tokens=5, do_sample=False, use_past_kv_cache=True,
                             stop_at_eos=False, verbose=False)
        assert torch.equal(got.cpu(), want.cpu()), name


# -- 2. EffectiveDiagonal and the KV cache ---------------------------------------

def test_effective_diagonal_in_generation(tiny_model, lane):
    model = tiny_model("gpt2")
    prompt = tld.prepare_inputs(model, [PROMPT]).tokens
    kw = dict(max_new_tokens=5, do_sample=False, stop_at_eos=False, verbose=False)
    with tld.apply_edits(model, tld.EffectiveDiagonal(0.0)):
        want = _manual_greedy(model, prompt, 5)
        got = model.generate(prompt, use_past_kv_cache=False, **kw)
        with pytest.raises((RuntimeError, ValueError), match="use_past_kv_cache=False|Use ValueScale"):
            model.generate(prompt, use_past_kv_cache=True, **kw)
    assert torch.equal(got.cpu(), want.cpu())
    with tld.apply_edits(model, tld.ValueScale(0.0)):  # the same edit in hook_z form
        assert torch.equal(model.generate(prompt, **kw).cpu(), want.cpu())


def test_effective_diagonal_equals_hook_z_form_in_a_cached_step(tiny_model, lane):
    """A direct cached forward (no generate) on a bridge whose cached pattern is one key
    wide: the pattern form gives the hook_z form's logits, or refuses."""
    model = tiny_model("gpt2")
    tokens = tld.prepare_inputs(model, [PROMPT]).tokens
    if lane == "legacy":
        from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache

        def step(*edits):
            cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
            model(tokens[:, :-1], past_kv_cache=cache)
            with tld.apply_edits(model, *edits):
                return model(tokens[:, -1:], past_kv_cache=cache)
    else:
        def step(*edits):
            _, past = model(tokens[:, :-1], return_type="logits_and_cache")
            with tld.apply_edits(model, *edits):
                return model(tokens[:, -1:], past_key_values=past)
    z_form = step(tld.ValueScale(0.0))
    try:
        pattern_form = step(tld.EffectiveDiagonal(0.0))
    except RuntimeError as err:
        assert "Use ValueScale" in str(err)
    else:
        torch.testing.assert_close(pattern_form, z_form, atol=1e-5, rtol=1e-5)


# -- 6. negative indices ----------------------------------------------------------

TEXTS = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]


def test_negative_layers_and_heads_mean_the_last(tiny_model):
    model = tiny_model("llama")  # GQA: heads are query heads
    batch = tld.prepare_inputs(model, TEXTS)
    n_l, n_h = model.cfg.n_layers, model.cfg.n_heads

    def run(*edits):
        with torch.no_grad(), tld.apply_edits(model, *edits):
            return model(batch.tokens, attention_mask=batch.attention_mask)

    assert torch.equal(run(tld.ValueScale(0.0, layers=[-1], heads=[-1])),
                       run(tld.ValueScale(0.0, layers=[n_l - 1], heads=[n_h - 1])))
    assert torch.equal(run(tld.ResidualScale("mlp", 0.0, layers=-1)), run(tld.ResidualScale("mlp", 0.0, layers=n_l - 1)))
    assert torch.equal(run(tld.DiagonalRemoval(layers=[-2], heads=-2)),
                       run(tld.DiagonalRemoval(layers=[n_l - 2], heads=n_h - 2)))
    with pytest.raises(ValueError, match=r"layers has layer -3, out of range .*-2\.\.-1"):
        tld.ValueScale(0.0, layers=[-3]).fwd_hooks(model)

    def metric(logits):
        return logits[:, -1, 5].mean()
    res, table = tld.directional_patch(model, TEXTS[:1], TEXTS[:1], metric, components=("value", "attn"),
                                       layers=[-1], heads=[-1])
    assert set(table["layer"]) == {n_l - 1}
    assert set(table.loc[table["component"] == "value", "head"]) == {n_h - 1}

    with tld.split_hook_points(model, components=("attn",), layers=[-1]) as h:
        assert h.names == [f"blocks.{n_l - 1}.hook_attn_out.hook_par", f"blocks.{n_l - 1}.hook_attn_out.hook_perp"]

    from tl_directional.views import attention_triptych_figure
    a = attention_triptych_figure(model, TEXTS[:1], -1, -1)
    b = attention_triptych_figure(model, TEXTS[:1], n_l - 1, n_h - 1)
    fa, fb = (getattr(x, "figure", x) for x in (a, b))
    assert fa.layout.title.text == fb.layout.title.text


# -- 3. two meanings of a parallel-only patch --------------------------------------

def _tl_patching():
    try:
        from transformer_lens import patching
    except ImportError:  # pragma: no cover
        pytest.skip("transformer_lens.patching not available")
    return patching


def _replace_setter(corrupted_activation, index, clean_activation):
    corrupted_activation[...] = clean_activation
    return corrupted_activation


def test_parallel_only_patch_two_routes(tiny_model):
    """TL's patching on the nested hook_par puts in the *clean* run's parallel part
    (against the clean reference); directional_patch puts in P_r u_c with r from the
    *corrupted* run (METHOD sec. 5). Both are reachable, and they differ."""
    from tl_directional.core.geometry import parallel_part

    patching = _tl_patching()
    model = tiny_model("gpt2")
    clean = tld.prepare_inputs(model, ["And God said, Let there be light."]).tokens
    corrupted = clean.clone()
    corrupted[0, 2:4] = clean[0, 2:4].flip(0) + 1  # other tokens, same length
    answer = int(clean[0, -1])

    def metric(logits):
        return logits[:, -1, answer].mean()

    with tld.split_hook_points(model):
        _, clean_cache = model.run_with_cache(clean)
        tl_attn = patching.generic_activation_patch(model, corrupted, clean_cache, metric, _replace_setter,
                                                    "attn_out.hook_par", index_axis_names=("layer",))
        tl_value = patching.generic_activation_patch(model, corrupted, clean_cache, metric, _replace_setter,
                                                     "z.hook_par", index_axis_names=("layer",))  # KeyError before
        assert torch.equal(clean_cache["blocks.0.hook_z.hook_par"], clean_cache["blocks.0.attn.hook_z.hook_par"])
    results, _ = tld.directional_patch(model, clean, corrupted, metric, components=("attn",))
    ours = results["attn"]["par"]

    # The TL route by hand: corrupted update with its parallel part replaced by the clean one's.
    def captured(tokens, names):
        store = {}
        hooks = [(n, lambda t, hook, n=n: store.__setitem__(n, t.detach().clone())) for n in names]
        model.run_with_hooks(tokens, fwd_hooks=hooks)
        return store
    names = ["blocks.0.hook_attn_out", "blocks.0.hook_resid_pre"]
    c = captured(clean, names)
    clean_par = parallel_part(c[names[0]], c[names[1]])

    def swap_par(t, hook):
        ref = state["ref"]
        return t - parallel_part(t, ref).to(t.dtype) + clean_par.to(t.dtype)
    state = {}
    by_hand = model.run_with_hooks(corrupted, fwd_hooks=[
        (names[1], lambda t, hook: state.__setitem__("ref", t) or t), (names[0], swap_par)])
    torch.testing.assert_close(float(tl_attn[0]), float(metric(by_hand)), atol=1e-5, rtol=1e-5)
    assert abs(float(tl_attn[0]) - float(ours[0])) > 1e-4  # the two definitions differ
    assert torch.isfinite(tl_value).all() and tl_value.shape == (2,)


# -- 5. split DLA vs TL's cache.logit_attrs ----------------------------------------

def test_split_dla_vs_tl_logit_attrs(default_model):
    """TL's logit_attrs skips ln_final.w (it assumes fold_ln); ours applies it, so ours
    equals TL's with the direction times ln_final.w, and the parts add up to the true
    logit difference."""
    model = default_model
    tokens = tld.prepare_inputs(model, ["And God said, Let there be"]).tokens
    table = tld.split_logit_attribution(model, tokens, [" light"], incorrect_tokens=[" water"])  # strings work
    ans, wrong = (model.tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" light", " water"))
    logits, cache = model.run_with_cache(tokens)
    true_diff = float(logits[0, -1, ans] - logits[0, -1, wrong])
    w = model.ln_final.w if hasattr(model.ln_final, "w") else model.ln_final.original_component.weight
    direction = model.W_U[:, ans] - model.W_U[:, wrong]
    scale = cache["ln_final.hook_scale"][0, -1]

    def attr(vec, weighted):  # TL's apply_ln_to_stack (centre, divide by scale) then the direction
        x = (vec - vec.mean(-1, keepdim=True)) / scale
        return float(x @ (direction * w if weighted else direction))

    mlp0 = cache["blocks.0.hook_mlp_out"][0, -1]
    ours = float(table.query("unit == 'mlp' and layer == 0")["dla"].iloc[0])
    tl = float(cache.logit_attrs(mlp0[None, None, None], tokens=torch.tensor([ans]),
                                 incorrect_tokens=torch.tensor([wrong]), pos_slice=-1).flatten()[0])
    assert abs(tl - attr(mlp0, False)) < 1e-4  # TL's logit_attrs: no ln_final weight
    assert abs(ours - attr(mlp0, True)) < 1e-4  # ours: with it
    assert abs(ours - tl) > 1e-2
    # Ours reconstructs the true logit difference: units + embeddings + the biases' share.
    units = float(table.query("unit in ['attn', 'mlp']")["dla"].sum())
    embed = attr(cache["blocks.0.hook_resid_pre"][0, -1], True)
    b = getattr(model.ln_final, "b", None)
    if b is None:
        b = model.ln_final.original_component.bias
    bias = float(b @ direction) + float(model.b_U[ans] - model.b_U[wrong]) if b is not None else 0.0
    assert abs(units + embed + bias - true_diff) < 1e-3


# -- 4. statistics never quietly contaminated or empty ------------------------------

def test_profile_inputs_are_checked(tiny_model):
    model = tiny_model("gpt2")
    n_real = tld.prepare_inputs(model, TEXTS).n_tokens
    padded = model.to_tokens(TEXTS)  # TL pads the shorter row, no mask
    with pytest.warns(UserWarning, match="looks padded.*attention_mask"):
        tld.profile(model, padded, progress=False)
    assert int(tld.profile(model, TEXTS, progress=False).residual["count"].iloc[0]) == n_real - len(TEXTS)
    with pytest.raises(ValueError, match="empty string.*BOS alone"):
        tld.profile(model, "", progress=False)
    with pytest.raises(ValueError, match=r"positions=\[500\] selects no token.*0\.\.\d+"):
        tld.profile(model, TEXTS, positions=[500], progress=False)
    long_text = " ".join(["And God said, Let there be light."] * 60)
    with pytest.warns(UserWarning, match="more than the model's context of 128.*windows"):
        tld.profile(model, long_text, progress=False)
    with pytest.raises(ValueError, match="token id 9999, outside the vocabulary"):
        tld.profile(model, torch.tensor([[0, 5, 9999]]), progress=False)


def test_first_token_left_out_of_statistics_by_default(tiny_model):
    """BOS (the attention sink) is not mixed into the summaries unless asked for."""
    model = tiny_model("gpt2")
    default = tld.profile(model, TEXTS, progress=False)
    with_bos = tld.profile(model, TEXTS, exclude_first_token=False, progress=False)
    only_bos = tld.profile(model, TEXTS, positions=[0], progress=False)  # explicit positions count as asked
    assert default.metadata["exclude_first_token"] is True
    assert (with_bos.residual["count"] - default.residual["count"] == len(TEXTS)).all()
    assert (only_bos.residual["count"] == len(TEXTS)).all()
    assert not default.value["beta_mean"].equals(with_bos.value["beta_mean"])


# -- CLI: one error line, exit status 2, never a traceback ----------------------------

def _cli(*argv):
    """Run the real entry point; returns (exit status, stderr)."""
    import contextlib
    import io

    from tl_directional.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's own usage errors
            rc = exc.code
    return rc, err.getvalue()


def _assert_one_error_line(rc, err, *fragments):
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith("  ")]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_cli_user_mistakes_give_one_error_line(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")  # n_ctx 128, 2 layers, 4 heads
    out = tmp_path / "out"
    a_file = tmp_path / "file.txt"
    a_file.write_text("hello")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Caf\xe9 au lait, na\xefve.".encode("latin-1"))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    cases = [
        (("profile", "--model", tmp_path / "nope", "--out", out), ["--model", "does not exist"]),
        (("profile", "--model", empty_dir, "--out", out), ["--model", "config.json"]),
        (("profile", "--model", "gpt2", "--out", out), ["--model gpt2", "local HF model directory"]),
        (("profile", "--model", model, "--text", latin1, "--out", out), ["--text", "not UTF-8"]),
        (("profile", "--model", model, "--seq-len", 200, "--out", out), ["--seq-len 200", "n_ctx=128"]),
        (("profile", "--model", model, "--out", a_file), ["--out", "existing file"]),
        (("sweep", "--model", model, "--space", "values", "--out", out), ["--space", "values", "resid-attn"]),
        (("sweep", "--model", model, "--layers", "9", "--out", out), ["--layers", "9", "0..1"]),
        (("report", "--model", model, "--layer", 9, "--out", out), ["--layer=9", "0..1"]),
        (("report", "--model", model, "--head", 7, "--out", out), ["--head=7", "0..3"]),
        (("sweep", "--model", model, "--s-par", "x", "--out", out), ["--s-par", "numbers"]),
    ]
    for argv, fragments in cases:
        rc, err = _cli(*argv)
        _assert_one_error_line(rc, err, *fragments)


def test_cli_sweep_rerun_with_other_settings(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")
    common = ("sweep", "--model", model, "--space", "value", "--max-sequences", 2, "--seq-len", 16,
              "--quiet", "--out", tmp_path)
    rc, err = _cli(*common, "--s-par", "0")
    assert rc == 0, err
    rc, err = _cli(*common, "--s-par", "0.5")  # the finished sweep's progress file is still there
    _assert_one_error_line(rc, err, "--out", "--restart")
    rc, err = _cli(*common, "--s-par", "0.5", "--restart")
    assert rc == 0, err
    rc, err = _cli(*common, "--s-par", "0.5", "--layers", "-1", "--restart")  # negative = from the end
    assert rc == 0, err
    import pandas as pd
    assert list(pd.read_csv(tmp_path / "sweep.csv")["label"]) == ["baseline", "value[s_par=0.5,s_perp=1,L=1]"]


def test_cli_real_entry_point_subprocess(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "tl_directional.cli", "profile", "--model", str(tmp_path / "nope"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=300)
    _assert_one_error_line(proc.returncode, proc.stderr, "--model")
    help_text = subprocess.run([sys.executable, "-m", "tl_directional.cli", "--help"], capture_output=True,
                               text=True, env=env, timeout=300).stdout
    assert "``" not in help_text and "compress-check" in help_text
    sweep_help = subprocess.run([sys.executable, "-m", "tl_directional.cli", "sweep", "--help"], capture_output=True,
                                text=True, env=env, timeout=300).stdout
    assert "(default: 32)" in sweep_help and "(default: -1,0,0.5,1,2)" in sweep_help


# -- 8. errors that name the argument ---------------------------------------------------

def test_argument_errors_name_the_fix(tiny_model):
    from tl_directional.evaluate.sweeps import grid

    model = tiny_model("gpt2")
    assert [s.s_par for s in grid("value", s_par=0.5)] == [0.5]  # a scalar is accepted
    assert [s.s_par for s in grid("value", s_par="-1,0")] == [-1.0, 0.0]  # so is the CLI's string
    with pytest.raises(ValueError, match=r"s_par='-1,x'.*comma-separated numbers"):
        grid("value", s_par="-1,x")
    with pytest.raises(TypeError, match=r"layers=\[0, 1\] must be a list of layer sets"):
        grid("value", layers=[0, 1])
    with pytest.raises(ValueError, match=r"metric returned a tensor of shape \(2,\).*one number"):
        tld.directional_patch(model, TEXTS, TEXTS, lambda logits: logits[:, -1, 5], components=("attn",))
    with pytest.raises(ValueError, match=r"answer_tokens\[0\] = ' light house' is \d+ tokens"):
        tld.split_logit_attribution(model, TEXTS[:1], [" light house"])
    with pytest.raises(ValueError, match="answer_tokens has token id 600, outside the vocabulary"):
        tld.split_logit_attribution(model, TEXTS[:1], [600])
    with pytest.raises(ValueError, match="token id 512, outside the vocabulary"):
        tld.directional_patch(model, torch.tensor([[0, 512]]), torch.tensor([[0, 3]]), lambda x: x.sum())


# -- 7. integer index columns ------------------------------------------------------

def test_layer_and_head_columns_are_integers(tiny_model):
    model = tiny_model("gpt2")
    _, patch = tld.directional_patch(model, TEXTS[:1], TEXTS[:1], lambda x: x[0, -1, 5], components=("attn", "value"))
    dla = tld.split_logit_attribution(model, TEXTS[:1], [5])
    for table in (patch, dla):
        for col in ("layer", "head"):
            assert pd_is_integer(table[col]), (col, table[col].dtype)
    assert patch.loc[patch["component"] == "value", "head"].tolist() == [0, 1, 2, 3] * model.cfg.n_layers


def pd_is_integer(series):
    import pandas as pd

    return pd.api.types.is_integer_dtype(series.dtype)


# -- 9. views ---------------------------------------------------------------------

def test_views_are_views_with_titles_and_robust_colours(tiny_model):
    from tl_directional.views import (
        View,
        attention_triptych_figure,
        split_dla_figure,
        top_perpendicular_tokens,
    )

    model = tiny_model("gpt2")
    dla_view = split_dla_figure(tld.split_logit_attribution(model, TEXTS[:1], [5]))
    assert isinstance(dla_view, View) and len(dla_view.figure.data) == 2
    fig = attention_triptych_figure(model, TEXTS[:1], 0, 0).figure
    assert fig.layout.xaxis.title.text == "key position" and fig.layout.yaxis.title.text == "query position"
    view = top_perpendicular_tokens(model, TEXTS, 3)
    assert "quantile" in view.legend_html
    vals = torch.tensor(view.panels[0][1]["topkVals"]).flatten()
    assert float(vals.max()) <= 1.0
    assert float((vals > 0.1).float().mean()) > 0.3  # not all washed out by one outlier
