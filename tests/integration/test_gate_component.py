"""compress_check names what it checks "component" (the package's one word for an update); the
former spellings ``unit=`` / ``--unit`` are refused with the new name (0.1.0 keeps no aliases)."""

from __future__ import annotations

import pytest
import torch

from tl_directional import compression
from tl_directional.cli import main
from tl_directional.compression import (
    compress_check,
    compression_geometry,
)
from tl_directional.compression.compressors import quantize_rtn
from tl_directional.core.errors import RenamedArgumentError, TLDirectionalError

TOKS = torch.randint(1, 400, (2, 12), generator=torch.Generator().manual_seed(0))


def test_component_argument_and_the_former_name_refused(tiny_model):
    dense = tiny_model("gpt2")
    with torch.no_grad():
        comp = quantize_rtn(dense, 3)
        geo = compression_geometry(dense, comp, TOKS)
        new = compress_check(dense, comp, TOKS, max_perp_error=1.0, component="attn", geometry=geo)
        with pytest.raises(RenamedArgumentError, match=r"compress_check\(\) has no argument 'unit'.*component=") as err:
            compress_check(dense, comp, TOKS, max_perp_error=1.0, unit="attn", geometry=geo)
    assert isinstance(err.value, TLDirectionalError) and isinstance(err.value, TypeError)
    assert new.units == ("attn",)
    assert not hasattr(compression, "GATE_UNITS")
    with pytest.raises(ValueError, match=r"component must be one of \('attn', 'mlp', 'block', 'all'\), got 'x'"):
        compress_check(dense, comp, TOKS, max_perp_error=1.0, component="x")


def test_cli_component_option_and_unit_refused(tiny_model_dir, capsys):
    d = str(tiny_model_dir("gpt2"))
    common = ["compress-check", "--dense", d, "--compressed", d, "--max-sequences", "2", "--seq-len", "16",
              "--max-perp-error", "0"]
    assert main(common + ["--component", "attn"]) == 0
    assert "units attn" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(common + ["--unit", "mlp"])
    assert exit_.value.code == 2 and "--unit" in capsys.readouterr().err
