"""A model the user drops is freed: nothing the library keeps per model (resolved sites, the
installed ``generate``, checks done once per model) holds it alive. Before this held, every model
ever loaded in a process stayed in memory (a notebook loading models in a loop grew without
bound, and the legacy lane's suite ran out of memory)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import tl_directional as tld

TEXT = "In the beginning God created the heaven and the earth. And the earth was without form."


def _use(model, what: str) -> None:
    tokens = model.to_tokens(TEXT)
    if what == "profile":
        tld.profile(model, TEXT)
    elif what == "edit":
        with torch.no_grad(), tld.apply_edits(model, tld.ValueScale(s_par=0.5, mode="exclusive")):
            model(tokens)
    elif what == "generate":
        model.generate(TEXT, max_new_tokens=2, verbose=False, do_sample=False)
    elif what == "attribution":
        tld.attribution_patch(model, tokens, tokens.flip(-1), lambda logits: logits[:, -1, 0],
                              node_types=("resid", "value"))
    elif what == "logit attribution":
        tld.split_logit_attribution(model, tokens, int(tokens[0, -1]))
    elif what == "compression":
        small = tld.prune_magnitude(tld.clone_model(model), sparsity=0.5)
        tld.compression_geometry(model, small, TEXT)
        del small


@pytest.mark.parametrize("what", ["profile", "edit", "generate", "attribution", "logit attribution", "compression"])
def test_a_dropped_model_is_freed(what):
    model = tld.load_model("default")
    _use(model, what)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None, f"after {what}, something the library keeps still holds the model"
