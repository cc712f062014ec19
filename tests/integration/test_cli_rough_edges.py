"""Issue 23 items 7, 8 and 10: near-miss model names, leftovers of a killed conversion, and the
CLI's last rough edges. Everything goes through the public API or the real CLI entry point."""

from __future__ import annotations

import time

import pytest

from tests.integration.test_habits import _cli  # the real entry point: (exit status, stderr)
from tl_directional.cli import main
from tl_directional.model.load import UnknownModelError, catalogue_names, load_model


def _one_error_line(rc, err, *fragments, status=2):
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith("  ")]
    assert rc == status, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# -- item 8: a near-miss model name fails at once, offline ----------------------------------------


def test_near_miss_model_name_fails_at_once_offline_with_the_closest_match():
    started = time.perf_counter()
    with pytest.raises(UnknownModelError) as info:
        load_model("smollm2")
    assert time.perf_counter() - started < 20  # the hub path took ~30 s of retries
    message = str(info.value)
    assert "name_or_path='smollm2'" in message
    for name in catalogue_names():
        assert repr(name) in message
    assert "Did you mean 'smollm2-135m'?" in message
    assert info.value.closest == "smollm2-135m" and isinstance(info.value, ValueError)
    with pytest.raises(UnknownModelError, match="Did you mean 'gpt2'"):
        load_model("gpt-2")


def test_cli_near_miss_model_name_is_one_error_line(tmp_path):
    rc, err = _cli("profile", "--model", "smollm2", "--out", tmp_path / "o", "--quiet")
    line = _one_error_line(rc, err, "--model smollm2", "'smollm2-135m'", "'gemma-3-270m'", "'default'",
                           "Did you mean 'smollm2-135m'?")
    assert "name_or_path" not in line
    rc, err = _cli("compress-check", "--dense", "smollm2", "--compressed", tmp_path, "--max-perp-error", "0.1")
    _one_error_line(rc, err, "--dense smollm2", "Did you mean 'smollm2-135m'?")


def test_cli_model_help_names_the_catalogue(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name in catalogue_names():
        assert name in help_text


# -- item 10: the CLI's last rough edges ---------------------------------------------------------


def test_cli_models_convert_unknown_name_is_a_usage_error():
    rc, err = _cli("models", "--convert", "nope")
    _one_error_line(rc, err, "--convert nope", "unknown real model 'nope'", "gemma-3-270m", "smollm2-135m")
    rc, err = _cli("models", "--convert", "smollm2")
    _one_error_line(rc, err, "--convert smollm2", "Did you mean 'smollm2-135m'?")


def test_cli_text_that_is_a_directory_says_so(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")
    folder = tmp_path / "texts"
    folder.mkdir()
    rc, err = _cli("profile", "--model", model, "--text", folder, "--out", tmp_path / "o", "--quiet")
    line = _one_error_line(rc, err, f"--text {folder}", "is a directory", "one UTF-8 text file")
    assert "no such file" not in line
    rc, err = _cli("profile", "--model", model, "--text", tmp_path / "missing.txt", "--out", tmp_path / "o")
    _one_error_line(rc, err, "--text", "no such file", "leave --text out")


def test_cli_reversed_layer_range_gives_cli_advice(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")  # 2 layers
    rc, err = _cli("sweep", "--model", model, "--layers", "1-0", "--out", tmp_path / "o", "--quiet")
    line = _one_error_line(rc, err, "--layers '1-0'", "empty", "'0-1'", "'all'")
    assert "None" not in line


def test_cli_compress_check_missing_dense_names_the_option(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")
    missing = tmp_path / "nonexistent"
    rc, err = _cli("compress-check", "--dense", missing, "--compressed", model, "--max-perp-error", "0.1")
    line = _one_error_line(rc, err, f"--dense {missing}", "does not exist")
    assert "name_or_path" not in line
    rc, err = _cli("compress-check", "--dense", model, "--compressed", missing, "--max-perp-error", "0.1")
    line = _one_error_line(rc, err, f"--compressed {missing}", "does not exist")
    assert "name_or_path" not in line


# -- item 7: a killed conversion's folders are removed by the next run ----------------------------


def test_next_run_removes_build_folders_of_a_dead_process(tmp_path, monkeypatch):
    import os
    import re
    import socket
    import subprocess
    import sys

    from tl_directional.model.load import catalog

    monkeypatch.setenv("TL_DIRECTIONAL_CACHE", str(tmp_path / "cache"))
    root = catalog.entry_dir("smollm2-135m").parent
    root.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a real pid whose process has exited (as after kill -9)
    entry = catalog.entry_dir("smollm2-135m").name
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64]
    tag = {pid: f"{pid}@{host}" for pid in (dead.pid, os.getpid(), os.getppid())}
    gone = [root / f".{entry}.building.{tag[dead.pid]}.x1",
            root / f".{entry}.source.{tag[dead.pid]}.x2"]
    kept = [root / f".{entry}.building.{tag[os.getpid()]}.x3",  # a live owner
            root / f".{entry}.building.{tag[os.getppid()]}.x4",
            root / f".{entry}.building.{dead.pid}@some-other-host.x5"]  # cannot tell: kept by age
    for folder in gone + kept:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"\0" * 1024)
    rc, err = _cli("models")
    assert rc == 0, err
    assert [p for p in gone if p.exists()] == []
    assert all(p.exists() for p in kept)
    assert catalog.remove_dead_builds() == []  # nothing left to remove



# -- item 6: one output policy for every command that writes a directory --------------------------


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("text") / "t.txt"
    p.write_text(" ".join(f"In the beginning word {i} was spoken and the people heard it." for i in range(60)))
    return p


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}  # not lock files


def _small(model, text_file):
    return ["--model", model, "--text", text_file, "--max-sequences", "2", "--seq-len", "16", "--quiet"]


def test_no_command_writes_into_another_commands_directory(tiny_model_dir, tmp_path, text_file):
    model = tiny_model_dir("gpt2")
    rep = tmp_path / "rep"
    rc, err = _cli("report", *_small(model, text_file), "--space", "value", "--s-par=0", "--out", rep)
    assert rc == 0, err
    before = _files(rep)
    assert "sweep.csv" in before and "index.html" in before  # the file a later sweep used to replace
    for argv in (["sweep", "--space", "value", "--s-par=0"], ["profile"]):
        rc, err = _cli(*argv, *_small(model, text_file), "--out", rep)
        line = _one_error_line(rc, err, f"refusing to replace {rep.resolve()}", "not a previous",
                               "pass --force to replace it")
        assert "overwrite=True" not in line
    rc, err = _cli("compress-check", "--dense", model, "--compressed", model, "--max-perp-error", "0.1",
                   "--text", text_file, "--max-sequences", "2", "--seq-len", "16", "--report", rep)
    _one_error_line(rc, err, f"refusing to replace {rep.resolve()}", "pass --force")
    assert _files(rep) == before  # nothing was touched
    # a directory with a file the library did not write is refused the same way
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    for force in ([], ["--force"]):  # --force replaces only another tl-directional command's output
        rc, err = _cli("report", *_small(model, text_file), "--space", "value", "--s-par=0", "--out", foreign,
                       *force)
        _one_error_line(rc, err, f"refusing to replace {foreign.resolve()}", "--force never replaces files")
        assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
        assert (foreign / "notes.txt").read_text() == "keep me"
    # the same command may write into its own output again; --force replaces another's
    rc, err = _cli("report", *_small(model, text_file), "--space", "value", "--s-par=0", "--out", rep)
    assert rc == 0, err
    rc, err = _cli("sweep", "--space", "value", "--s-par=0", *_small(model, text_file), "--out", rep, "--force")
    assert rc == 0, err
    assert sorted(_files(rep)) == ["manifest.json", "sweep.csv", "sweep.html", "sweep.progress.json"]
    rc, err = _cli("sweep", "--space", "value", "--s-par=0", *_small(model, text_file), "--out", rep)
    assert rc == 0, err  # its own output: rerun in place


def test_library_writers_follow_the_same_policy(tiny_model, tmp_path):
    from tl_directional.io.atomic import ArtefactError
    from tl_directional.views.report import build_report

    model = tiny_model("gpt2")
    out = tmp_path / "o"
    out.mkdir()
    (out / "sweep.csv").write_text("someone else's table\n")
    for overwrite in (False, True):  # overwrite=True replaces only a tl-directional output
        with pytest.raises(ArtefactError, match="overwrite=True never replaces files the library did not write"):
            build_report(model, ["a b c d e f g"], out, spaces=("value",), s_par=(0.0,), overwrite=overwrite)
        assert (out / "sweep.csv").read_text() == "someone else's table\n"


# -- item 9: Ctrl-C is one line and exit 130; a resumed sweep says so --------------------------------


def _subprocess_cli(argv, fault=None, env_extra=None):
    import os
    import signal
    import subprocess
    import sys

    env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               **(env_extra or {}))
    env.pop("TL_DIRECTIONAL_FAULT", None)
    if fault:
        env["TL_DIRECTIONAL_FAULT"] = fault
    # a shell's background job starts with SIGINT ignored, and the child would inherit that (no
    # KeyboardInterrupt, so nothing to test): the child gets the default a terminal gives
    return subprocess.run([sys.executable, "-m", "tl_directional.cli", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_ctrl_c_in_sweep_is_one_line_and_the_rerun_says_it_resumes(tiny_model_dir, tmp_path, text_file):
    model = tiny_model_dir("gpt2")
    out = tmp_path / "sw"
    argv = ["sweep", "--model", model, "--text", text_file, "--max-sequences", "6", "--seq-len", "16",
            "--batch-size", "1", "--space", "value", "--s-par=0,2", "--out", out]
    r = _subprocess_cli([*argv, "--quiet"], fault="sweep.after_checkpoint:2:sigint")
    assert r.returncode == 130, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    assert r.stderr.count("interrupted:") == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()][-1:]  # after any tokenizer warning
    assert lines == [f"interrupted: the batches finished so far are kept in {out / 'sweep.progress.json'}; "
                     "rerun the same command to resume"], r.stderr
    r = _subprocess_cli(argv)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"sweep: resuming from {out / 'sweep.progress.json'}: 2 of 6 batches were done" in r.stderr
    assert "sweep (resumed)" in r.stderr and "6/6" in r.stderr  # the bar counts the kept batches


def test_a_finished_sweep_directory_says_what_it_holds(tiny_model_dir, tmp_path, text_file):
    model = tiny_model_dir("gpt2")
    out = tmp_path / "sw"
    base = ["sweep", *_small(model, text_file), "--space", "value", "--out", out]
    rc, err = _cli(*base, "--s-par=0")
    assert rc == 0, err
    rc, err = _cli(*base, "--s-par=0,2")
    line = _one_error_line(rc, err, f"--out {out} holds a finished sweep of 1 setting", "settings",
                           "pass --restart (or --force) to replace it")
    assert "unfinished" not in line


# -- item 10: a checkpoint path naming someone else's file; eps everywhere ----------------------------


def test_sweep_never_suggests_deleting_a_file_it_did_not_write(tiny_model, tmp_path):
    import torch

    from tl_directional.evaluate.sweeps import grid, sweep
    from tl_directional.io.atomic import ArtefactError

    theirs = tmp_path / "hosts"
    theirs.write_text("127.0.0.1 localhost\n")
    toks = torch.randint(1, 400, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ArtefactError) as err:
        sweep(tiny_model("gpt2"), toks, grid("value", s_par=[0.0]), checkpoint=theirs, progress=False)
    msg = str(err.value)
    assert "not a sweep checkpoint written by tl-directional" in msg and "pass a new checkpoint path" in msg
    assert "delete" not in msg and "corrupt" not in msg
    assert theirs.read_text() == "127.0.0.1 localhost\n"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_eps_is_validated_wherever_it_is_taken(tiny_model, bad):
    import tl_directional as tld
    from tl_directional.compression.geometry import compression_geometry

    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match=r"eps must be a finite float .*eps=1e-12"):
        tld.ValueScale(s_par=0.0, eps=bad)
    with pytest.raises(ValueError, match=r"eps must be a finite float .*eps=1e-12"):
        with tld.split_hook_points(model, eps=bad):
            pass
    with pytest.raises(ValueError, match=r"eps must be a finite float .*eps=1e-12"):
        compression_geometry(model, model, ["a b c"], eps=bad)
    with pytest.raises(ValueError, match=r"eps must be a finite float .*eps=1e-12"):
        tld.profile(model, ["a b c"], eps=bad)
    with pytest.raises(ValueError, match=r"eps must be a finite float .*eps=1e-12"):
        tld.directional_patch(model, ["a b c"], ["a b d"], lambda lg: lg[0, -1, 0], eps=bad)
    with pytest.raises(ValueError, match=r"eps must be a finite float .*eps=1e-12"):
        tld.split_logit_attribution(model, ["a b c"], 1, eps=bad)
