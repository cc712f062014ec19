"""Sweeps and safe-scale search: exact baseline, identity rows, agreement with one-at-a-time runs."""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.sweeps import (
    Setting,
    batch_metric_sums,
    find_safe_scale,
    grid,
    sweep,
)
from tl_directional.io.corpus import chunk_text, heldout_text
from tl_directional.views import sweep_figure

from ._families import CAUSAL

TEXTS = chunk_text(heldout_text(), 200)[:6]


def _one_at_a_time(model, texts, setting):
    b = tld.prepare_inputs(model, texts)
    with torch.no_grad():
        base = model(b.tokens, attention_mask=b.attention_mask)
        with tld.apply_edits(model, *setting.edits()):
            out = model(b.tokens, attention_mask=b.attention_mask)
    return batch_metric_sums(base, out, b.tokens, b.attention_mask).row()


@pytest.mark.parametrize("family", CAUSAL)
def test_baseline_exact_identity_zero_and_matches_single_runs(tiny_model, family):
    model = tiny_model(family)
    settings = grid("value,resid-attn,resid-mlp,resid-both,block,hard-diag,eff-diag,value-exclusive",
                    s_par=[0.0, 1.0, 2.0], s_perp=[1.0])
    df = sweep(model, TEXTS, settings, batch_size=4, progress=False)
    assert df.iloc[0]["label"] == "baseline"
    assert df.iloc[0][["delta_loss", "delta_ppl", "kl"]].tolist() == [0.0, 0.0, 0.0]
    ident = df[(df["s_par"] == 1.0) & (df["s_perp"] == 1.0) & (df["space"] != "hard-diag")]
    assert len(ident) >= 7
    assert (ident["delta_loss"] == 0.0).all() and (ident["kl"] == 0.0).all() and (ident["top1_agree"] == 1.0).all()
    base_loss = df.iloc[0]["loss"]
    assert math.isclose(df.iloc[0]["ppl"], math.exp(base_loss))
    for s in [Setting("value", 0.0), Setting("resid-mlp", 2.0), Setting("hard-diag")]:
        row = df[df["label"] == s.label].iloc[0]
        single = _one_at_a_time(model, TEXTS, s)
        assert row["delta_loss"] == pytest.approx(single["delta_loss"], abs=1e-5)
        assert row["kl"] == pytest.approx(single["kl"], abs=1e-5)
        assert row["tokens"] == single["tokens"]


def test_stacked_settings_agree_with_unstacked(tiny_model):
    model = tiny_model("llama")
    settings = grid("value,resid-attn,eff-diag", s_par=[-1.0, 0.0, 0.5, 2.0])
    a = sweep(model, TEXTS, settings, batch_size=3, progress=False)
    b = sweep(model, TEXTS, settings, batch_size=3, stack=4, progress=False)
    for col in ("delta_loss", "kl", "top1_agree"):
        assert (a[col] - b[col]).abs().max() < 1e-5, col


def test_layer_sets_and_figure(tiny_model):
    model = tiny_model("gpt2")
    settings = grid("value", s_par=[0.0, 2.0], layers=[[0], [1], None])
    df = sweep(model, TEXTS[:2], settings, progress=False)
    assert set(df["layers"]) == {"all", "0", "1"}
    fig = sweep_figure(df)
    assert len(fig.data) == 3


def test_sweep_resumes_from_checkpoint(tiny_model, tmp_path):
    model = tiny_model("gpt2")
    settings = grid("resid-mlp", s_par=[0.0, 2.0])
    ckpt = tmp_path / "sweep.json"
    full = sweep(model, TEXTS, settings, batch_size=2, progress=False)

    # interrupt after the first batch by raising from a hook on the second forward of batch 2
    calls = {"n": 0}

    def bomb(t, hook):
        calls["n"] += 1
        if calls["n"] == 4:  # batch 0: base + 2 settings; batch 1: base -> boom
            raise KeyboardInterrupt
        return t

    model.add_hook("blocks.0.hook_resid_pre", bomb)
    try:
        with pytest.raises(KeyboardInterrupt):
            sweep(model, TEXTS, settings, batch_size=2, checkpoint=ckpt, progress=False)
    finally:
        model.reset_hooks(including_permanent=True)
    import json

    assert json.loads(ckpt.read_text())["batches_done"] == 1
    resumed = sweep(model, TEXTS, settings, batch_size=2, checkpoint=ckpt, progress=False)
    cols = ["tokens", "loss", "delta_loss", "kl", "top1_agree"]
    assert (resumed[cols] - full[cols]).abs().max().max() < 1e-9
    with pytest.raises(ValueError, match="holds a finished sweep of .* settings that differs from this one"):
        sweep(model, TEXTS, grid("value", s_par=[0.0]), batch_size=2, checkpoint=ckpt, progress=False)


def test_safe_scale_interval_contains_one_and_respects_budget(tiny_model):
    model = tiny_model("gpt2")
    (res,) = find_safe_scale(model, TEXTS[:3], "value", budget=0.02, metric="kl", bounds=(-1.0, 3.0),
                             grid_points=5, refine_steps=3)
    lo, hi = res.interval
    assert lo <= 1.0 <= hi and -1.0 <= lo and hi <= 3.0
    ev = res.evaluations
    inside = ev[(ev["scale"] >= lo) & (ev["scale"] <= hi)]
    assert (inside["cost"] <= 0.02).all()
    assert len(ev) <= 5 + 1 + 2 * 3
    assert res.figure().data
    # budget 0 with a damaging edit: the interval collapses onto 1
    (tight,) = find_safe_scale(model, TEXTS[:3], "resid-mlp", budget=0.0, metric="kl", grid_points=5, refine_steps=2)
    assert tight.interval[0] <= 1.0 <= tight.interval[1] and tight.interval[1] - tight.interval[0] < 1.0
    groups = find_safe_scale(model, TEXTS[:2], "resid-attn", budget=0.05, layer_groups=[[0], [1]], grid_points=3, refine_steps=1)
    assert [g.layers for g in groups] == [(0,), (1,)]


def test_bad_input_errors(tiny_model):
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match="edits_grid is empty"):
        sweep(model, TEXTS, [], progress=False)
    with pytest.raises(ValueError, match="unknown space 'residual'"):
        grid("residual", s_par=[0.0])
    with pytest.raises(ValueError, match="s_par must be a finite number"):
        grid("value", s_par=[float("inf")])
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        sweep(model, [[5], [6, 7, 8]], grid("value", s_par=[0.0]), progress=False)
    with pytest.raises(ValueError, match="metrics has unknown"):
        sweep(model, TEXTS, grid("value", s_par=[0.0]), metrics=["bleu"], progress=False)
    with pytest.raises(ValueError, match="bounds must be finite with lo < 1 < hi"):
        find_safe_scale(model, TEXTS, "value", bounds=(1.5, 3.0))
    with pytest.raises(ValueError, match="layers has layer 9"):
        sweep(model, TEXTS, grid("value", s_par=[0.0], layers=[[9]]), progress=False)


def test_cli_sweep_parses_negative_lists_and_writes_outputs(tiny_model_dir, tmp_path):
    from tl_directional.cli import main

    out = tmp_path / "sweep"
    text = tmp_path / "t.txt"
    text.write_text("\n".join(TEXTS))
    rc = main(["sweep", "--model", str(tiny_model_dir("gpt2")), "--text", str(text), "--space",
               "value,resid-attn", "--s-par=-1,0,0.5,2", "--s-perp", "1", "--max-sequences", "4",
               "--seq-len", "32", "--out", str(out), "--quiet"])
    assert rc == 0
    import pandas as pd

    df = pd.read_csv(out / "sweep.csv")
    assert sorted(df["s_par"].unique().tolist()) == [-1.0, 0.0, 0.5, 1.0, 2.0]
    assert (out / "sweep.html").stat().st_size > 1000


DDP_SCRIPT = textwrap.dedent("""
    import os, sys, json, torch, torch.distributed as dist
    sys.path.insert(0, {root!r})
    from tl_directional.model.load import load_model
    from tl_directional.evaluate.sweeps import grid, sweep
    dist.init_process_group("gloo")
    model = load_model({path!r})
    texts = json.loads(open({texts!r}).read())
    df = sweep(model, texts, grid("value,resid-mlp", s_par=[0.0, 2.0]), batch_size=1, progress=False)
    if dist.get_rank() == 0:
        df.to_csv({out!r}, index=False)
    rank = dist.get_rank()
    dist.destroy_process_group()
    # the plain torch call, as a user's script makes it, must free the group and join its threads
    # (left running, they can abort the process at interpreter exit: issue 16)
    import time

    from tl_directional.io.distributed import group_threads_alive
    # gloo's loop thread can take a moment to end after destroy on a busy machine: what matters
    # is that it ends before the interpreter exits, so wait up to 5 s for it
    deadline, left = time.monotonic() + 5.0, group_threads_alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = group_threads_alive()
    open({out!r} + f".threads{{rank}}", "w").write(json.dumps(left))
""")


def test_sweep_shards_across_torchrun_ranks(tiny_model, tiny_model_dir, tmp_path):
    import json

    import pandas as pd

    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps(TEXTS[:4]))
    out = tmp_path / "ddp.csv"
    script = tmp_path / "ddp_sweep.py"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script.write_text(DDP_SCRIPT.format(root=root, path=str(tiny_model_dir("gpt2")), texts=str(texts), out=str(out)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # --standalone picks a free local port (a fixed port collides with any other torchrun on the machine)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        left = json.loads(Path(f"{out}.threads{rank}").read_text())
        assert left in ([], None), f"rank {rank}: process-group threads alive after destroy: {left}"
    ddp = pd.read_csv(out)
    single = sweep(tiny_model("gpt2"), TEXTS[:4], grid("value,resid-mlp", s_par=[0.0, 2.0]), batch_size=1, progress=False)
    assert ddp["tokens"].tolist() == single["tokens"].tolist()
    for col in ("loss", "delta_loss", "kl", "top1_agree"):
        assert (ddp[col] - single[col]).abs().max() < 1e-6, col
