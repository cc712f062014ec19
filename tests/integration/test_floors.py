"""The matrix-product counts of ``benchmarks.floors`` against torch's own FLOP counter.

``forward_macs`` is counted from the shape alone; ``FlopCounterMode`` counts every matrix
product a real forward dispatches (projections, attention scores and values, MLP, unembedding).
Two multiply-add counts per FLOP pair, so the two must agree exactly: a family whose MLP is
gated read as two-matrix (or GQA read as full heads) fails here.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.floors import compression_local_floor, forward_macs, main, mlp_macs, profile_floor
from benchmarks.shapes import Shape


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_forward_macs_equal_the_flops_torch_counts(tiny_model, family):
    model = tiny_model(family)
    shape = Shape.of(model.cfg)
    batch, seq = 2, 12
    tokens = torch.randint(0, model.cfg.d_vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tokens, return_type="logits")
    assert counter.get_total_flops() == 2 * batch * seq * forward_macs(shape, seq)


def test_compression_floor_of_the_default_shape_is_the_documented_one():
    # docs/performance.md (issue 13): 0.62 + 0.62 + 0.38 of a forward on the 4-layer default shape
    default = Shape(4, 256, 4, 4, 1024, 8192, d_head=64, gated_mlp=False)
    assert compression_local_floor(default, 128) == pytest.approx(1.619, abs=5e-4)
    assert mlp_macs(default) == 2 * 256 * 1024


def test_profile_floor_of_the_default_shape_counted_by_hand():
    """Issue 51: 4 blocks of 851 968 multiply-adds per token (d 256, d_mlp 1024, T 128), plus
    ``W_O[h] x_t`` (4 layers x 4 heads x 64 x 256), against the forward with its 8192 x 256
    unembedding: 2/3."""
    default = Shape(4, 256, 4, 4, 1024, 8192, d_head=64, gated_mlp=False)
    assert profile_floor(default, 128) == pytest.approx((4 * 851_968 + 4 * 4 * 64 * 256) / (4 * 851_968 + 8192 * 256))


def test_the_table_and_a_bad_size(capsys):
    assert main(["--sizes", "smollm2-135m", "--seq", "128"]) == 0
    # the profile_overhead floor quoted in docs/performance.md (issue 51): 0.796 + 0.072
    assert "| smollm2-135m | 0.204 | 2.166 | 1.592 | 0.868 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["--sizes", "huge"])
    assert exc.value.code == 2
    assert "unknown ['huge']" in capsys.readouterr().err


def test_scaling_table_of_a_constructed_run(tmp_path, capsys):
    from benchmarks.scaling_table import main as table_main

    rec = {"name": "profile_overhead", "status": "ok", "ratio": 1.2345, "ci95": [1.2, 1.3], "n_pairs": 5,
           "extra": {"peak_memory": {"baseline": {"increment_mb": 10.0}, "candidate": {"increment_mb": 15.0}}}}
    skipped = {"name": "edit_overhead", "status": "skipped"}
    doc = {"command": "python -m benchmarks.scaling", "setting": "64x1", "device": "cpu",
           "runs": [{"size": "tiny", "dtype": "bfloat16", "parameters": 2_500_000, "run": {"records": [rec, skipped]}}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    assert table_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| tiny | bfloat16 | 2 | 1.23 [1.20, 1.30] (5) | skipped |" in out
    assert "| tiny | bfloat16 | 2 | 15 / 10 (1.50x) | - |" in out
    # merged: the ratio row per dtype, and the memory row with the parameter count beside it
    assert table_main(["--merge", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| tiny | 2 | 1.23 [1.20, 1.30] (5) | skipped |" in out
    assert "| size | dtype | parameters (M) | profile_overhead (64x1) |" in out
    assert "| tiny | bfloat16 | 2 | 15 / 10 (1.50x) |" in out
    (tmp_path / "bad.json").write_text("{}")
    assert table_main([str(tmp_path / "bad.json")]) == 2
    assert "not a scaling JSON (KeyError" in capsys.readouterr().err
