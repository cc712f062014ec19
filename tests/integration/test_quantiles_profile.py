"""Issue 23 item 5 on a real profile: one sentence of a tiny GPT-2 is a small sample, so its
quantiles are numpy's (linear) ones (the summaries themselves: tests/unit/test_quantiles.py)."""

from __future__ import annotations

import numpy as np
import pytest

import tl_directional as tld
from tests.unit.test_quantiles import NAMES


def test_profile_of_one_sentence_gives_numpys_quantiles(tiny_model):
    model = tiny_model("gpt2")
    text = "In the beginning God created the heaven and the earth, and the earth was without form."
    prof = tld.profile(model, [text], progress=False, exclude_first_token=False)
    batch = tld.prepare_inputs(model, [text])
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    mask = batch.attention_mask.bool()
    u = cache["blocks.1.hook_mlp_out"][mask].double()
    r = cache["blocks.1.hook_resid_mid"][mask].double()
    cos = ((u * r).sum(-1) / (u.norm(dim=-1) * r.norm(dim=-1))).abs().numpy()
    assert 10 <= len(cos) <= 40
    row = prof.residual.query("layer == 1 and component == 'mlp'").iloc[0]
    assert row["par_frac_median"] == pytest.approx(np.median(cos), abs=1e-6)
    for q, name in NAMES.items():
        assert row[f"par_frac_{name}"] == pytest.approx(np.quantile(cos, q), abs=1e-6), name
    assert prof.metadata["quantiles"].startswith("exact")
