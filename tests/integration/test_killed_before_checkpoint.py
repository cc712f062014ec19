"""Issue 47: a sweep killed before its first checkpoint leaves only the library's own lock file
and owner record in ``--out``; running it again (plain, ``--restart`` or ``--force``) used to be
refused as "not a previous sweep output" and now starts it afresh. The kill is real: a process
that took the checkpoint's lock exits without releasing it, as ``kill -9`` does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.test_habits import _cli

TEXT = " ".join(f"In the beginning word {i} was spoken and the people heard it." for i in range(20))


def _killed_holding_the_checkpoint_lock(out):
    out.mkdir()
    code = ("import os\nfrom tl_directional.io.locks import exclusive_lock\n"
            f"held = exclusive_lock({str(out / 'sweep.progress.json')!r}, 'tl-directional sweep')\nheld.__enter__()\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    left = sorted(p.name for p in out.iterdir())
    assert left == [".sweep.progress.json.lock", ".sweep.progress.json.owner"], left


@pytest.mark.parametrize("flag", [None, "--restart", "--force"])
def test_a_sweep_killed_before_its_first_checkpoint_runs_again(tiny_model_dir, tmp_path, flag):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "sweep"
    _killed_holding_the_checkpoint_lock(out)
    rc, err = _cli("sweep", "--model", tiny_model_dir("gpt2"), "--text", text, "--space", "value", "--s-par", "0",
                   "--max-sequences", "2", "--seq-len", "16", "--out", out, "--quiet", *([flag] if flag else []))
    assert rc == 0, err
    assert (out / "sweep.csv").is_file() and (out / "manifest.json").is_file()


def test_a_directory_with_a_users_file_is_still_refused(tiny_model_dir, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "sweep"
    _killed_holding_the_checkpoint_lock(out)
    (out / "notes.txt").write_text("mine")
    rc, err = _cli("sweep", "--model", tiny_model_dir("gpt2"), "--text", text, "--space", "value", "--s-par", "0",
                   "--out", out, "--quiet", "--force")
    assert rc == 2 and "refusing to replace" in err and (out / "notes.txt").read_text() == "mine"


def test_a_damaged_checkpoint_names_the_command_lines_fix(tiny_model_dir, tmp_path):
    """The message used to suggest "a new checkpoint path", an option the command line does not
    have; it now names --restart, and --restart works."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "sweep"
    argv = ("sweep", "--model", tiny_model_dir("gpt2"), "--text", text, "--space", "value", "--s-par", "0",
            "--max-sequences", "2", "--seq-len", "16", "--out", out, "--quiet")
    assert _cli(*argv)[0] == 0
    (out / "sweep.progress.json").write_text("{garbage")
    rc, err = _cli(*argv)
    assert rc == 2 and "pass --restart to discard it" in err and "checkpoint path" not in err
    assert _cli(*argv, "--restart")[0] == 0
