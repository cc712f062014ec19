"""Fault injection: crashes at chosen points, byte flips and truncations of every artefact,
two concurrent writers, NaN / inf weights into the gate. Each test asserts that nothing is
lost and the exact error (docs/reliability.md lists the guarantees these tests hold).

Crash points are ``tl_directional.io.atomic.fault_point`` names, armed in a subprocess through
``TL_DIRECTIONAL_FAULT=name[:n]`` (the process kills itself with SIGKILL there).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional import training as T
from tl_directional.cli.train import train_main
from tl_directional.io.atomic import ArtefactError, ArtefactLockedError
from tl_directional.io.locks import exclusive_lock
from tl_directional.io.records import seal, verify_manifest
from tl_directional.model.load import build_tiny_hf_model, load_hf_model, load_model, tl_lane

from ._training import TINY
from ._training import cfg as _cfg

ROOT = Path(__file__).resolve().parents[2]
TEXT = "In the beginning God created the heaven and the earth. And the earth was without form. " * 12


def _env(fault: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    env.pop("TL_DIRECTIONAL_FAULT", None)
    if fault:
        env["TL_DIRECTIONAL_FAULT"] = fault
    return env


def _run(args: list[str], fault: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=_env(fault), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path, fraction: float = 0.5) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * fraction)])


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("text") / "t.txt"
    p.write_text(TEXT)
    return p


# ------------------------------------------------------------------------------------------
# compress-check: a gate fails on anything it cannot measure
# ------------------------------------------------------------------------------------------


def _poisoned_dir(src: Path, dst: Path, where: str, value: float) -> Path:
    """A copy of GPT-2 ``src`` (plain transformers) with ``value`` written into one weight."""
    from transformers import AutoTokenizer

    hf = load_hf_model(src)
    with torch.no_grad():
        if where == "one c_fc weight":
            hf.transformer.h[0].mlp.c_fc.weight[3, 5] = value
        elif where == "all of c_attn":
            hf.transformer.h[1].attn.c_attn.weight.fill_(value)
        elif where == "all of c_fc":
            hf.transformer.h[0].mlp.c_fc.weight.fill_(value)
        elif where == "ln_f":
            hf.transformer.ln_f.weight[0] = value
    hf.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


@pytest.mark.parametrize("where,value", [("one c_fc weight", float("nan")), ("all of c_attn", float("nan")),
                                         ("all of c_fc", float("inf")), ("ln_f", float("nan"))])
def test_gate_fails_on_nonfinite_weights(tiny_model_dir, tmp_path, text_file, capsys, where, value):
    from tl_directional.cli import main

    dense = tiny_model_dir("gpt2")
    bad = _poisoned_dir(dense, tmp_path / "bad", where, value)
    rc = main(["compress-check", "--dense", str(dense), "--compressed", str(bad), "--text", str(text_file),
               "--max-sequences", "2", "--seq-len", "32", "--max-perp-error", "100"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "compress-check FAIL" in out and "non-finite" in out
    reason = out.split("reason:", 1)[1]
    names = {"ln_f": ("transformer.ln_f.weight", "ln_final.w"),
             "one c_fc weight": ("transformer.h.0.mlp.c_fc.weight", "blocks.0.mlp.W_in"),
             "all of c_fc": ("transformer.h.0.mlp.c_fc.weight", "blocks.0.mlp.W_in"),
             "all of c_attn": ("transformer.h.1.attn.", "blocks.1.attn.W_")}[where]
    assert any(f"compressed {n}" in reason for n in names), reason


def test_gate_never_marks_a_nan_row_ok(tiny_model):
    """NaN activations / errors in a row (finite weights) are a FAIL, not 'ok'."""
    from tl_directional.compression import compress_check, compression_geometry, summarize
    from tl_directional.compression.compressors import quantize_rtn
    from tl_directional.compression.geometry import _IDX, _STATS

    gpt2 = tiny_model("gpt2")
    toks = torch.randint(1, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        comp = quantize_rtn(gpt2, 8)
        geo = compression_geometry(gpt2, comp, toks, components=("block",))
    geo.loc[1, "err_perp_energy"] = float("nan")
    res = compress_check(gpt2, comp, toks, max_perp_error=100.0, geometry=geo)
    assert not res.passed and res.exit_code == 1
    row = res.table[res.table.layer == int(geo.loc[1, "layer"])].iloc[0]
    assert row.status == "FAIL (non-finite)"
    assert any(f"block layer {int(geo.loc[1, 'layer'])}" in r for r in res.reasons)
    # a NaN sum never reads as a zero error (it used to: NaN > 0 is False)
    sums = torch.ones(len(_STATS), dtype=torch.float64)
    sums[_IDX["u_sq"]] = float("nan")  # a NaN dense update: every ratio over ||u||^2 is unknown
    s = summarize(sums, "local")
    assert s["finite"] is False and s["err_perp_energy"] != s["err_perp_energy"]


def _broken(dense: Path, dst: Path, how: str) -> Path:
    import shutil

    shutil.copytree(dense, dst)
    if how == "truncated weights":
        _truncate(dst / "model.safetensors")
    elif how == "missing config":
        (dst / "config.json").unlink()
    elif how == "missing tokenizer.json":
        (dst / "tokenizer.json").unlink()
    elif how == "missing weights":
        (dst / "model.safetensors").unlink()
    return dst


@pytest.mark.parametrize("how,named", [("truncated weights", "model.safetensors"), ("missing config", "config.json"),
                                       ("missing tokenizer.json", "tokenizer.json"),
                                       ("missing weights", "model.safetensors")])
def test_gate_corrupt_or_missing_model_files_exit_2(tiny_model_dir, tmp_path, text_file, capsys, how, named):
    from tl_directional.cli import main

    dense = tiny_model_dir("gpt2")
    bad = _broken(dense, tmp_path / "bad", how)
    rc = main(["compress-check", "--dense", str(dense), "--compressed", str(bad), "--text", str(text_file),
               "--max-sequences", "2", "--seq-len", "32", "--max-perp-error", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: --compressed") and named in line and "sentencepiece" not in line


# ------------------------------------------------------------------------------------------
# compress --out and train --export: never destroy what was there
# ------------------------------------------------------------------------------------------


@pytest.mark.bridge  # compress --out writes HF directories from the bridge lane only
def test_compress_out_killed_mid_write_keeps_the_good_model(tiny_model_dir, tmp_path):
    from tl_directional.cli import main

    dense = tiny_model_dir("gpt2")
    out = tmp_path / "c"
    assert main(["compress", "--model", str(dense), "--spec", "rtn:bits=8", "--out", str(out)]) == 0
    before = _snapshot(out)
    for point in ("replace_dir.before_swap", "replace_dir.mid_swap"):
        r = _run(["-m", "tl_directional.cli", "compress", "--model", str(dense), "--spec", "rtn:bits=3",
                  "--out", str(out)], fault=point)
        assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
        # the next write finds the previous model intact (put back if the swap was cut in two)
        assert main(["compress", "--model", str(dense), "--spec", "rtn:bits=8", "--out", str(out)]) == 0
        assert _snapshot(out) == before
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".c.") and "lock" not in p.name]
    verify_manifest(out, kind="compressed-model")
    load_model(out)


def test_compress_out_refuses_a_foreign_directory(tiny_model_dir, tmp_path, capsys, lane):
    from tl_directional.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    rc = main(["compress", "--model", str(tiny_model_dir("gpt2")), "--spec", "rtn:bits=8", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and (out / "notes.txt").read_text() == "my notes"
    if lane == "bridge":
        assert "refusing to replace" in err and "--force never replaces files" in err
        # --force replaces only a previous tl-directional output, never the user's own files
        assert main(["compress", "--model", str(tiny_model_dir("gpt2")), "--spec", "rtn:bits=8",
                     "--out", str(out), "--force"]) == 2
        assert (out / "notes.txt").read_text() == "my notes" and sorted(os.listdir(out)) == ["notes.txt"]


def _cli_args(tok_dir, out: Path, **kw) -> list[str]:
    args = ["--out", str(out), "--tokenizer", str(tok_dir), "--quiet"]
    for k, v in {**TINY, **kw}.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    return args


def test_export_never_deletes_the_users_files(tmp_path, tok_dir, capsys):
    run = tmp_path / "run"
    T.train(_cfg(tok_dir), run, progress=False, stop_after=2)
    before = _snapshot(run)
    rc = train_main(_cli_args(tok_dir, run) + ["--export", str(run)])  # --export = --out
    assert rc == 2 and "refusing to replace" in capsys.readouterr().err
    assert _snapshot(run) == before  # the run's checkpoints are all still there
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    rc = train_main(_cli_args(tok_dir, tmp_path / "run2") + ["--export", str(mine)])
    err = capsys.readouterr().err
    assert rc == 2 and "--export-force" in err and (mine / "thesis.tex").read_text() == "years of work"


# ------------------------------------------------------------------------------------------
# training records: integrity, corpus identity, clear errors, orphan temporaries
# ------------------------------------------------------------------------------------------


def test_edited_checkpoint_record_is_refused(tmp_path, tok_dir, data):
    run = tmp_path / "r"
    T.train(_cfg(tok_dir), run, progress=False, data=data, stop_after=4)
    last = T.checkpoint_paths(run)[-1]
    original = last.read_bytes()
    rng = random.Random(0)
    accepted_changed = []
    for _ in range(12):
        data_ = bytearray(original)
        i = rng.randrange(len(data_))
        data_[i] = rng.choice([c for c in b"0123456789abcdef\",:{}[] " if c != data_[i]])
        last.write_bytes(bytes(data_))
        try:
            T.read_checkpoint(last)
        except T.CheckpointError as err:
            assert str(last) in str(err)
            continue
        if json.loads(bytes(data_)) != json.loads(original):
            accepted_changed.append(i)
    assert accepted_changed == []  # no changed record is ever accepted
    last.write_bytes(original)
    assert T.train(_cfg(tok_dir), run, progress=False, data=data).resumed_from == 4


def test_wrong_types_in_a_record_are_a_clear_error(tmp_path, tok_dir, data, capsys):
    run = tmp_path / "r"
    T.train(_cfg(tok_dir), run, progress=False, data=data, stop_after=2)
    last = T.checkpoint_paths(run)[-1]
    meta = json.loads(last.read_text())
    meta.pop("record_sha256", None)
    meta["step"] = str(meta["step"])
    last.write_text(json.dumps(seal(meta)))  # a well-formed record with a string "step"
    with pytest.raises(T.CheckpointError, match=r"'step' is '2', not a int"):
        T.read_checkpoint(last)
    assert train_main(_cli_args(tok_dir, run)) == 2
    assert str(last) in capsys.readouterr().err


def test_resume_on_a_replaced_corpus_is_refused(tmp_path, tok_dir, data):
    run = tmp_path / "r"
    T.train(_cfg(tok_dir), run, progress=False, data=data, stop_after=2)
    other = T.Data(data.tokenizer, data.train.roll(1, 0), data.validation, data.tokenizer_sha256,
                   data.corpus_info)
    with pytest.raises(T.CheckpointError, match="trained on other data"):
        T.train(_cfg(tok_dir), run, progress=False, data=other)
    meta = json.loads(T.checkpoint_paths(run)[-1].read_text())
    assert meta["data_sha256"] == T.data_sha256(data) and meta["tokenizer_sha256"] == data.tokenizer_sha256


def test_truncated_init_weights_are_a_clear_error(tmp_path, tok_dir, data, capsys):
    run = tmp_path / "r"
    T.train(_cfg(tok_dir), run, progress=False, data=data, stop_after=2)
    init = run / T.INIT_DIR / "model.safetensors"
    _truncate(init)
    with pytest.raises(T.CheckpointError) as err:
        T.train(_cfg(tok_dir), run, progress=False, data=data)
    assert str(init) in str(err.value) and "delete" in str(err.value)
    assert train_main(_cli_args(tok_dir, run)) == 2
    assert str(init) in capsys.readouterr().err
    import shutil

    shutil.rmtree(run / T.INIT_DIR)  # the fix the message gives
    assert T.train(_cfg(tok_dir), run, progress=False, data=data).resumed_from == 2


def test_orphan_checkpoint_temporaries_are_removed_at_start(tmp_path, tok_dir, data):
    run = tmp_path / "r"
    T.train(_cfg(tok_dir), run, progress=False, data=data, stop_after=2)
    orphan = run / T.CHECKPOINT_DIR / ".ckpt-0000004.safetensors.x1y2z3.tmp"
    orphan.write_bytes(b"\0" * (1 << 20))
    T.train(_cfg(tok_dir), run, progress=False, data=data, stop_after=4)
    assert not orphan.exists()


def test_kill_between_tensors_and_record_resumes_bit_identical(tmp_path, tok_dir, data):
    run = tmp_path / "r"
    r = _run(["-m", "tl_directional.training", "train", *_cli_args(tok_dir, run)],
             fault="train.between_tensors_and_record:2")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert [p.name for p in T.checkpoint_paths(run)] == ["ckpt-0000002.json"]
    resumed = T.train(_cfg(tok_dir), run, progress=False, data=data)
    assert resumed.resumed_from == 2
    straight = T.train(_cfg(tok_dir), tmp_path / "s", progress=False, data=data)
    for k, v in T.canonical_state_dict(straight.model).items():
        assert torch.equal(v, T.canonical_state_dict(resumed.model)[k]), k


def test_two_trainings_on_one_out_the_second_is_refused(tmp_path, tok_dir, capsys):
    run = tmp_path / "r"
    first = subprocess.Popen([sys.executable, "-m", "tl_directional.training", "train",
                              *_cli_args(tok_dir, run, max_steps=100000, ckpt_every=1000)],
                             env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (run / T.METRICS_FILE).exists():  # the first run is training
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.2)
        rc = train_main(_cli_args(tok_dir, run, lr=1e-3))
        err = capsys.readouterr().err
        assert rc == 2 and f"pid {first.pid}" in err and "in use" in err
    finally:
        first.kill()
        first.wait()
    # its owner is dead: the lock is taken over
    assert train_main(_cli_args(tok_dir, run)) == 0


# ------------------------------------------------------------------------------------------
# sweeps: model fingerprint, exact resume, sealed progress
# ------------------------------------------------------------------------------------------


def _sweep_cli(model_dir: Path, text_file: Path, out: Path) -> list[str]:
    return ["sweep", "--model", str(model_dir), "--text", str(text_file), "--out", str(out),
            "--space", "value,resid-mlp", "--s-par=0,0.5,2", "--max-sequences", "6", "--seq-len", "24",
            "--batch-size", "1", "--quiet"]


def test_sweep_killed_and_resumed_equals_uninterrupted_exactly(tiny_model_dir, tmp_path, text_file):
    from tl_directional.cli import main

    model_dir = tiny_model_dir("gpt2")
    straight = tmp_path / "straight"
    assert main(_sweep_cli(model_dir, text_file, straight)) == 0
    out = tmp_path / "resumed"
    r = _run(["-m", "tl_directional.cli", *_sweep_cli(model_dir, text_file, out)], fault="sweep.after_checkpoint:3")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    progress = json.loads((out / "sweep.progress.json").read_text())
    assert progress["batches_done"] == 3 and isinstance(progress["sums"]["__baseline__"][0], int)
    assert main(_sweep_cli(model_dir, text_file, out)) == 0
    assert (out / "sweep.csv").read_bytes() == (straight / "sweep.csv").read_bytes()
    # rerunning a finished sweep reproduces its own table exactly
    assert main(_sweep_cli(model_dir, text_file, out)) == 0
    assert (out / "sweep.csv").read_bytes() == (straight / "sweep.csv").read_bytes()


def test_sweep_counts_stay_exact_above_2_to_the_24(tmp_path):
    from tl_directional.evaluate.sweeps import MetricSums
    from tl_directional.evaluate.sweeps.sweep_store import SweepProgress

    big = MetricSums(2**24 + 1, 1e-9 + 12345.678, 0.1, 0.2, 2**24 + 1)
    path = tmp_path / "p.json"
    SweepProgress({"x": 1}, 1, {"s": big.to_disk()}).save(path)
    back = SweepProgress.load(path).sums["s"]
    assert back == big and back.row()["tokens"] == 2**24 + 1


def test_sweep_of_another_model_into_the_same_checkpoint_is_refused(tmp_path, tiny_model_dir):
    from tl_directional.evaluate.sweeps import grid, sweep

    a = load_model(tiny_model_dir("gpt2"))
    b = load_model(build_tiny_hf_model("gpt2", tmp_path / "b", seed=1))
    toks = torch.randint(1, 400, (4, 12), generator=torch.Generator().manual_seed(0))
    ckpt = tmp_path / "sweep.progress.json"
    settings = grid("value", s_par=[0.0])
    sweep(a, toks, settings, checkpoint=ckpt, progress=False, batch_size=2)
    with pytest.raises(ArtefactError, match=r"holds a finished sweep of 1 setting that differs from this one in \['model'\]"):
        sweep(b, toks, settings, checkpoint=ckpt, progress=False, batch_size=2)


@pytest.mark.parametrize("damage", ["digit", "truncate"])
def test_damaged_sweep_progress_is_refused(tmp_path, tiny_model, damage):
    from tl_directional.evaluate.sweeps import grid, sweep

    m = tiny_model("gpt2")
    toks = torch.randint(1, 400, (4, 12), generator=torch.Generator().manual_seed(0))
    ckpt = tmp_path / "sweep.progress.json"
    sweep(m, toks, grid("value", s_par=[0.0]), checkpoint=ckpt, progress=False, batch_size=2)
    text = ckpt.read_text()
    if damage == "digit":
        i = text.index('"sums"')
        i += next(j for j, c in enumerate(text[i:]) if c in "123456789")
        ckpt.write_text(text[:i] + str((int(text[i]) % 9) + 1) + text[i + 1:])
    else:
        _truncate(ckpt)
    with pytest.raises(ArtefactError, match=str(ckpt).replace(".", r"\.")) as err:
        sweep(m, toks, grid("value", s_par=[0.0]), checkpoint=ckpt, progress=False, batch_size=2)
    assert "delete it" in str(err.value)


# ------------------------------------------------------------------------------------------
# profiles: manifest, stale tables, clear decode errors, kill mid-save
# ------------------------------------------------------------------------------------------


def _profile(per_token: bool = False) -> tld.Profile:
    res = pd.DataFrame({"layer": [0, 0, 1, 1], "component": ["attn", "mlp"] * 2, "x": [0.1, 0.2, 0.3, 0.4]})
    val = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "beta": [0.5, 0.25]})
    tokens = pd.DataFrame({"t": range(6)}) if per_token else None
    return tld.Profile(res, val, {"model_name": "toy", "tokens_seen": 6}, tokens=tokens)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
@pytest.mark.parametrize("which", ["residual", "value", "metadata"])
def test_damaged_profile_file_is_named(tmp_path, fmt, damage, which):
    out = _profile().save(tmp_path / "p", format=fmt)
    f = out / ("metadata.json" if which == "metadata" else f"{which}.{fmt}")
    if damage == "flip":
        _flip(f, f.stat().st_size // 2)
    else:
        _truncate(f)
    with pytest.raises(ArtefactError, match=str(f).replace(".", r"\.")):
        tld.Profile.load(out)


def test_profile_save_leaves_no_stale_table(tmp_path):
    out = _profile(per_token=True).save(tmp_path / "p")
    assert tld.Profile.load(out).tokens is not None
    _profile(per_token=False).save(out)
    assert not (out / "tokens.parquet").exists() and tld.Profile.load(out).tokens is None


def test_profile_save_refuses_a_foreign_directory(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("precious")
    with pytest.raises(ArtefactError, match="overwrite=True"):
        _profile().save(mine)
    assert (mine / "data.csv").read_text() == "precious"


def test_profile_save_replaces_a_profile_written_before_manifests(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for name in ("metadata.json", "residual.csv", "value.csv"):
        (old / name).write_text("{}" if name.endswith("json") else "layer\n0\n")
    _profile().save(old, format="csv")
    assert tld.Profile.load(old).residual["x"].tolist() == [0.1, 0.2, 0.3, 0.4]


def test_profile_killed_mid_save_keeps_the_previous_one(tmp_path):
    out = _profile().save(tmp_path / "p")
    before = _snapshot(out)
    code = ("import pandas as pd, tl_directional as tld, sys; "
            "p = tld.Profile(pd.DataFrame({'layer': [9]}), pd.DataFrame({'layer': [9]}), {}); "
            "p.save(sys.argv[1])")
    for point in ("replace_dir.before_swap", "replace_dir.mid_swap"):
        r = _run(["-c", code, str(out)], fault=point)
        assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
        if point == "replace_dir.before_swap":
            assert _snapshot(out) == before and tld.Profile.load(out).residual["x"].tolist() == [0.1, 0.2, 0.3, 0.4]
        _profile().save(out)  # the next save puts back / replaces cleanly
        assert _snapshot(out) == before


# ------------------------------------------------------------------------------------------
# concurrent writers: an exclusive lock, taken over when its owner is dead
# ------------------------------------------------------------------------------------------


def test_concurrent_writers_are_refused_and_a_dead_owner_is_taken_over(tmp_path, tiny_model):
    from tl_directional.evaluate.sweeps import grid, sweep

    target = tmp_path / "p"
    ckpt = tmp_path / "sweep.progress.json"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from tl_directional.io.locks import exclusive_lock\n"
         "with exclusive_lock(sys.argv[1], 'holder'), exclusive_lock(sys.argv[2], 'holder'):\n"
         "    print('locked', flush=True); time.sleep(600)", str(target), str(ckpt)],
        env=_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ArtefactLockedError, match=f"pid {holder.pid} on host"):
            _profile().save(target)
        with pytest.raises(ArtefactLockedError, match=f"pid {holder.pid}"):
            sweep(tiny_model("gpt2"), torch.ones(2, 4, dtype=torch.long), grid("value", s_par=[0.0]),
                  checkpoint=ckpt, progress=False)
        assert not target.exists() and not ckpt.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    _profile().save(target)  # the owner died (SIGKILL): its lock is taken over
    verify_manifest(target, kind="profile")
    with exclusive_lock(target):
        with pytest.raises(ArtefactLockedError):  # also refused within one process
            _profile().save(target)


# ------------------------------------------------------------------------------------------
# numerics and input length
# ------------------------------------------------------------------------------------------


def test_fp16_edit_at_a_huge_scale_raises_naming_layer_and_scale(tiny_model_dir):
    from tl_directional.edit import NonFiniteEditError, ResidualScale, apply_edits

    m = load_model(tiny_model_dir("gpt2"), dtype=torch.float16)
    toks = torch.randint(1, 400, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(m(toks)).all()
        with pytest.raises(NonFiniteEditError, match=r"s_par=1000000.0.*layer 0"), \
                apply_edits(m, ResidualScale("attn", s_par=1e6)):
            m(toks)


def test_sequence_longer_than_n_ctx_is_a_clear_error(tiny_model):
    m = tiny_model("gpt2")
    n_ctx = m.cfg.n_ctx
    toks = torch.ones(1, n_ctx + 1, dtype=torch.long)
    with pytest.raises(ValueError, match=f"{n_ctx + 1} positions.*n_ctx={n_ctx}.*--seq-len {n_ctx}"):
        tld.profile(m, toks, progress=False)
    assert tl_lane() in ("bridge", "legacy")
