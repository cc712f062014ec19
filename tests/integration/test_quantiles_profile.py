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


TEXT = "In the beginning God created the heaven and the earth, and the earth was without form."


def _quantile_columns(table):
    return [c for c in table.columns if any(c.endswith(f"_{n}") for n in ("median", *NAMES.values()))]


def test_exact_quantiles_bounds_only_the_quantile_columns(tiny_model):
    """``exact_quantiles`` decides how the quantile columns are read and nothing else: with 0 (no
    values kept) every other column equals the default profile's bit for bit; a limit below the
    sample (3 values, each group sees more) drops the kept values and reads the same histograms,
    so its tables equal the 0 tables exactly; and the default's exact quantiles differ from them."""
    model = tiny_model("gpt2")
    run = {k: tld.profile(model, [TEXT], progress=False, exclude_first_token=False, exact_quantiles=k)
           for k in (16_384, 0, 3)}
    for table in ("residual", "value"):
        exact, none, small = (getattr(run[k], table) for k in (16_384, 0, 3))
        quant = _quantile_columns(exact)
        assert quant, table
        rest = [c for c in exact.columns if c not in quant]
        assert exact[rest].equals(none[rest]), table
        assert none.equals(small), table
        assert not exact[quant].equals(none[quant]), table
    assert run[16_384].metadata["quantiles"].startswith("exact")
    assert "exact_quantiles=0: no values kept" in run[0].metadata["quantiles"]
    assert "above 3 values per metric" in run[3].metadata["quantiles"]


@pytest.mark.parametrize("bad", [-1, True])  # a float or a string: the signature's type check refuses it first
def test_exact_quantiles_refuses_what_is_not_a_count(tiny_model, bad):
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match=r"exact_quantiles must be an int >= 0.*0 keeps none.*got"):
        tld.profile(model, [TEXT], progress=False, exact_quantiles=bad)


def test_cli_exact_quantiles(tiny_model_dir, tmp_path):
    """``--exact-quantiles 0`` reaches the profile (its metadata says so); a negative count is a
    usage error naming the option, with no traceback and no output directory."""
    import json

    from tests.integration.test_habits import _cli

    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    model = tiny_model_dir("gpt2")
    rc, err = _cli("profile", "--model", model, "--text", text, "--max-sequences", "1", "--seq-len", "16",
                   "--exact-quantiles", "-1", "--out", tmp_path / "bad", "--quiet")
    assert rc == 2 and "Traceback" not in err and "--exact-quantiles" in err and "integer >= 0" in err, err
    assert not (tmp_path / "bad").exists()
    rc, err = _cli("profile", "--model", model, "--text", text, "--max-sequences", "1", "--seq-len", "16",
                   "--exact-quantiles", "0", "--out", tmp_path / "ok", "--quiet")
    assert rc == 0, err
    meta = json.loads((tmp_path / "ok" / "metadata.json").read_text())
    assert "exact_quantiles=0" in meta["quantiles"]
