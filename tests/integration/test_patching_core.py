"""The one patching loop (issue 49): ``generic_directional_patch`` and what specialises it.

``directional_patch`` and ``path_patch`` are the loop with their own plan / patch setter /
tabulator; the per-component shortcuts are ``functools.partial`` s of the loop (TransformerLens's
``get_act_patch_resid_pre = partial(generic_activation_patch, ...)`` style) and give exactly the
long form's frames. The frames are compared bit for bit: the same computation twice in one process.
"""

from __future__ import annotations

import inspect
from functools import partial

import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.patching.patching import ACTIVATION_PATCHER
from tl_directional.evaluate.patching.path_patching import PATH_PATCHER

GEN = torch.Generator().manual_seed(0)
CLEAN = torch.randint(1, 500, (2, 6), generator=GEN)
CORRUPTED = CLEAN.clone()
CORRUPTED[:, 2] = torch.randint(1, 500, (2,), generator=GEN)

SHORTCUTS = {
    "resid_pre": tld.directional_patch_resid_pre,
    "attn": tld.directional_patch_attn,
    "mlp": tld.directional_patch_mlp,
    "value": tld.directional_patch_value,
}


def metric(logits):
    return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


def per_example(logits):
    return logits[:, -1, 3] - logits[:, -1, 4]


def _same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[c].keys() == b[c].keys()
        and all(torch.equal(a[c][w].isnan(), b[c][w].isnan())
                and torch.equal(a[c][w].nan_to_num(), b[c][w].nan_to_num()) for w in a[c])
        for c in a)


def test_the_shortcuts_are_partials_of_the_one_loop():
    for component, shortcut in SHORTCUTS.items():
        assert isinstance(shortcut, partial) and shortcut.func is tld.generic_directional_patch
        assert shortcut.args == ()
        assert shortcut.keywords == {**ACTIVATION_PATCHER, "components": (component,)}
    assert set(ACTIVATION_PATCHER) == set(PATH_PATCHER) == {"plan", "patch_setter", "tabulate"}


@pytest.mark.parametrize("patcher, public", [(ACTIVATION_PATCHER, tld.directional_patch),
                                             (PATH_PATCHER, tld.path_patch)])
def test_a_plan_defaults_every_option_as_the_public_function(patcher, public):
    """A partial leaves the options it does not bind to the plan: they default as in the long form."""
    plan = inspect.signature(patcher["plan"]).parameters
    long = inspect.signature(public).parameters
    options = {n: p.default for n, p in long.items() if p.kind is p.KEYWORD_ONLY and n != "progress"}
    assert options == {n: plan[n].default for n in options}
    assert set(options) == {n for n, p in plan.items() if p.kind is p.KEYWORD_ONLY}


def test_each_shortcut_gives_the_long_forms_frames(tiny_model):
    model = tiny_model("gpt2")
    for component, shortcut in SHORTCUTS.items():
        res, table = shortcut(model, CLEAN, CORRUPTED, metric, per_position=True, layers=[1])
        res_long, table_long = tld.directional_patch(model, CLEAN, CORRUPTED, metric, components=(component,),
                                                     per_position=True, layers=[1])
        pd.testing.assert_frame_equal(table, table_long, check_exact=True)
        assert _same_tensors(res, res_long), component
        assert len(table) == 6 * (model.cfg.n_heads if component == "value" else 1)
    # the TransformerLens call shape (corrupted tokens, clean cache) and result=True pass through too
    _, cache = model.run_with_cache(CLEAN)
    got = tld.directional_patch_attn(model, CORRUPTED, cache, per_example, result=True).to_frame()
    want = tld.directional_patch(model, CORRUPTED, cache, per_example, components=("attn",), result=True).to_frame()
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_path_patch_is_the_loop_with_its_patcher(tiny_model):
    model = tiny_model("llama")
    kwargs = {"sender": ("head", 0, 1), "receivers": ["q", "v", "logits"], "batch_size": 2}
    got = tld.generic_directional_patch(model, CLEAN, CORRUPTED, per_example, **PATH_PATCHER, **kwargs)
    pd.testing.assert_frame_equal(got.to_frame(), tld.path_patch(model, CLEAN, CORRUPTED, per_example,
                                                                 **kwargs).to_frame(), check_exact=True)
