"""Issue 23 items 7, 8 and 10: near-miss model names, leftovers of a killed conversion, and the
CLI's last rough edges. Everything goes through the public API or the real CLI entry point."""

from __future__ import annotations

import time

import pytest

from tests.test_habits import _cli  # the real entry point: (exit status, stderr)
from tl_directional.cli import main
from tl_directional.models import UnknownModelError, catalogue_names, load_model


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

    from tl_directional.models import catalog

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

