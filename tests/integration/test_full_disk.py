"""Issue 47: a full disk under ``sweep`` / ``report`` printed ``[Errno 28] No space left on
device`` naming no path; the one ``error:`` line now names what was being written and the fix.
The disk is real: a 64 KiB tmpfs mounted for the test (root only; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.integration.test_cli_rough_edges import _one_error_line
from tests.integration.test_habits import _cli

TEXT = " ".join(f"In the beginning word {i} was spoken and the people heard it." for i in range(20))


@pytest.fixture
def tiny_disk(tmp_path):
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


@pytest.mark.parametrize("command", ["sweep", "report"])
def test_a_full_disk_names_the_path(tiny_model_dir, tmp_path, tiny_disk, command):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    extra = ("--space", "value", "--s-par", "0") if command == "sweep" else ()
    out = tiny_disk / "out"
    rc, err = _cli(command, "--model", tiny_model_dir("gpt2"), "--text", text, "--max-sequences", "2",
                   "--seq-len", "16", *extra, "--out", out, "--quiet")
    line = _one_error_line(rc, err, "No space left on device", "free space there or write elsewhere")
    assert str(out) in line


def test_a_sweep_on_a_full_disk_keeps_its_table_and_finishes_once_space_is_freed(tiny_model_dir, tmp_path, tiny_disk):
    """What a full disk leaves behind is what was complete: the measured table and its checkpoint
    (``--out`` is kept for them, not removed); the same command, once there is space, resumes and
    writes the rest, with nothing measured twice."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tiny_disk / "out"
    argv = ("sweep", "--model", tiny_model_dir("gpt2"), "--text", text, "--max-sequences", "2",
            "--seq-len", "16", "--space", "value", "--s-par", "0", "--out", out, "--quiet")
    rc, err = _cli(*argv)
    assert rc == 2 and "No space left on device" in err
    assert sorted(p.name for p in out.iterdir()) == ["sweep.csv", "sweep.progress.json"]
    table = (out / "sweep.csv").read_bytes()
    subprocess.run(["mount", "-o", "remount,size=32m", str(tiny_disk)], check=True)
    rc, err = _cli(*argv[:-1])  # without --quiet: the resume is announced
    assert rc == 0, err
    assert "resuming from" in err and (out / "sweep.csv").read_bytes() == table
    assert {"sweep.html", "manifest.json"} <= {p.name for p in out.iterdir()}
