"""Issue 47: indices and caches that used to end in a raw ``IndexError`` or a shape error deep
inside now raise the verb's own error, naming the argument, its valid range and the fix."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.lens import LensInputError, split_logit_lens
from tl_directional.evaluate.patching.path_nodes import PathPatchError
from tl_directional.evaluate.sweeps.random_draws import RandomScaleError, random_setting
from tl_directional.model.load import build_tiny_hf_model, load_model

CLEAN = torch.tensor([[1, 5, 9, 13, 17, 21]])
CORRUPT = torch.tensor([[1, 5, 9, 30, 17, 21]])


def _metric(logits):
    return logits[:, -1, 3] - logits[:, -1, 4]


def test_lens_past_the_context_and_shares_past_the_result(tiny_model):
    model = tiny_model("gpt2")
    n_ctx = model.cfg.n_ctx
    with pytest.raises(LensInputError, match=rf"n_ctx={n_ctx}; pass at most {n_ctx} tokens"):
        split_logit_lens(model, torch.ones(1, n_ctx + 1, dtype=torch.long), targets=7)
    res = split_logit_lens(model, CLEAN, targets=7)
    assert res.shares(position=-1) == res.shares(position=5)
    with pytest.raises(LensInputError, match=r"shares\(position=99\): the result has 6 positions; pass an int in \[-6, 5\]"):
        res.shares(position=99)
    with pytest.raises(LensInputError, match=r"shares\(batch=1\): the result has 1 sequences"):
        res.shares(batch=1)


def test_random_setting_layers_out_of_range():
    with pytest.raises(RandomScaleError, match=r"layer 9, out of range for a model with 4 layers \(valid: 0\.\.3"):
        random_setting("value", 4, "uniform", seed=0, layers=[9])
    assert random_setting("value", 4, "uniform", seed=0, layers=[-1]).layers == (3,)


def test_path_patch_layers_and_another_models_cache(tiny_model, tmp_path):
    model = tiny_model("gpt2")
    with pytest.raises(PathPatchError, match=r"path_patch: layers has layer 99, out of range .*valid: 0\.\."):
        tld.path_patch(model, CLEAN, CORRUPT, _metric, sender=("head", 0, 0), receivers="q", layers=[99])
    # a wider model's cache (d_model 48): the shapes disagree (same-shaped caches cannot be told)
    other = load_model(build_tiny_hf_model("gpt2", tmp_path / "wide", d_model=48)).eval()
    _, cache = other.run_with_cache(CLEAN)
    with pytest.raises(PathPatchError, match=r"clean_cache\['.*'\] has shape .* but this model's run gives"):
        tld.path_patch(model, CORRUPT, cache, _metric, sender=("head", 0, 0), receivers="q")


@pytest.mark.parametrize("layers", [[], [99], [-3], [0.5], ["a"], [True]])
def test_every_layers_argument_names_itself_and_the_fix(tiny_model, layers):
    """Issue 47, by family: each verb and edit that takes layers refuses an empty set, an index
    out of range and a non-int (``grid`` turned 0.5 into layer 0 and said "invalid literal for
    int()" for a string), naming ``layers``."""
    model = tiny_model("gpt2")
    tokens = torch.tensor([[1, 5, 9, 13, 17, 21]])
    calls = [
        lambda: tld.directional_patch(model, tokens, tokens.flip(1), lambda lg: lg[:, -1, 3].mean(),
                                      components=("attn",), layers=layers),
        lambda: tld.compression_geometry(model, model, tokens, layers=layers, progress=False),
        lambda: tld.sweep(model, tokens, tld.grid("value", s_par=[0.0], layers=[layers]), progress=False),
        # (non-ints in layer_groups meet the suite's runtime type check first; outside it the
        # library's own check names layers as for the others)
        *([lambda: tld.find_safe_scale(model, tokens, "value", layer_groups=[layers])]
          if all(type(x) is int for x in layers) else []),
        lambda: tld.attach_split_hook_points(model, layers=layers),
        lambda: tld.edit_hooks(model, tld.ValueScale(0.5, layers=layers)),
        lambda: tld.random_setting("value", model.cfg.n_layers, seed=0, layers=layers),
    ]
    for call in calls:
        with pytest.raises((ValueError, TypeError), match=r"layers (is empty|has|must hold)"):
            call()
