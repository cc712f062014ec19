"""compress_check names what it checks "component" (the package's one word for an update);
``unit=`` / ``--unit`` stay as deprecated spellings that give the same verdict."""

from __future__ import annotations

import pytest
import torch

from tl_directional.cli import main
from tl_directional.compression import (
    GATE_COMPONENTS,
    GATE_UNITS,
    compress_check,
    compression_geometry,
)
from tl_directional.compression.compressors import quantize_rtn

TOKS = torch.randint(1, 400, (2, 12), generator=torch.Generator().manual_seed(0))


def test_component_argument_and_its_deprecated_alias(tiny_model):
    dense = tiny_model("gpt2")
    with torch.no_grad():
        comp = quantize_rtn(dense, 3)
        geo = compression_geometry(dense, comp, TOKS)
        new = compress_check(dense, comp, TOKS, max_perp_error=1.0, component="attn", geometry=geo)
        with pytest.warns(DeprecationWarning, match="component="):
            old = compress_check(dense, comp, TOKS, max_perp_error=1.0, unit="attn", geometry=geo)
    assert GATE_UNITS == GATE_COMPONENTS
    assert new.units == old.units == ("attn",) and new.table.equals(old.table)
    with pytest.raises(ValueError, match=r"component must be one of \('attn', 'mlp', 'block', 'all'\), got 'x'"):
        compress_check(dense, comp, TOKS, max_perp_error=1.0, component="x")
    with pytest.raises(ValueError, match="unit must be one of"), pytest.warns(DeprecationWarning):
        compress_check(dense, comp, TOKS, max_perp_error=1.0, unit="x")


def test_cli_component_option_and_unit_alias(tiny_model_dir, capsys):
    d = str(tiny_model_dir("gpt2"))
    common = ["compress-check", "--dense", d, "--compressed", d, "--max-sequences", "2", "--seq-len", "16",
              "--max-perp-error", "0"]
    assert main(common + ["--component", "attn"]) == 0
    assert "units attn" in capsys.readouterr().out
    assert main(common + ["--unit", "mlp"]) == 0
    assert "units mlp" in capsys.readouterr().out
