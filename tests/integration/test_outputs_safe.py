"""Issue 37, "Data lost": outputs that never destroy what the command did not write, one lock
held for the whole run, a swap recoverable at every step, nothing left behind, a cross-platform
lock, and loading / writing failures as one ``error:`` line. Everything goes through the real
CLI (in process: ``main([...])``; in a subprocess where a crash is injected) or the public API
(docs/reliability.md lists the guarantees these tests hold)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tl_directional as tld
from tests.integration.test_cli_rough_edges import _one_error_line
from tests.integration.test_habits import _cli  # the real entry point: (exit status, stderr)

ROOT = Path(__file__).resolve().parents[2]
TEXT = " ".join(f"In the beginning word {i} was spoken and the people heard it." for i in range(60))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("text") / "t.txt"
    p.write_text(TEXT)
    return p


def _small(model, text_file, n: int = 2) -> list:
    return ["--model", model, "--text", text_file, "--max-sequences", str(n), "--seq-len", "16", "--quiet"]


def _tree(root: Path) -> dict:
    """Every entry under ``root`` (hidden ones included): kind, mode and bytes."""
    return {p.relative_to(root).as_posix(): (p.is_dir(), p.stat().st_mode & 0o7777,
                                             p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _env(fault: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0")
    env.pop("TL_DIRECTIONAL_FAULT", None)
    if fault:
        env["TL_DIRECTIONAL_FAULT"] = fault
    return env


def _subprocess_cli(argv, fault=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tl_directional.cli", *map(str, argv)], env=_env(fault),
                          capture_output=True, text=True, timeout=300, **kw)


def _hidden_leftovers(*dirs: Path) -> list[str]:
    """Lock files, owner records, temporaries and swap leftovers in ``dirs`` (not recursive)."""
    return sorted(p.name for d in dirs if d.is_dir() for p in d.iterdir() if p.name.startswith("."))


# -- an empty --out (an unset shell variable) never touches the current directory -------------------


@pytest.mark.parametrize("command", [["profile"], ["sweep", "--space", "value", "--s-par=0"]])
def test_empty_out_with_force_leaves_the_current_directory_alone(command, tiny_model_dir, tmp_path, text_file,
                                                                 monkeypatch):
    work = tmp_path / "s"
    work.mkdir()
    (work / "keep").write_text("the user's file")
    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    rc, err = _cli(*command, *_small(tiny_model_dir("gpt2"), text_file), "--out", "", "--force")
    _one_error_line(rc, err, "--out is empty", "unset shell variable", "current directory")
    assert (work / "keep").read_text() == "the user's file"
    assert _tree(tmp_path) == before  # nothing written, nothing removed, no lock file


# -- paths no command may ever replace, refused before any model work -------------------------------

_NO_MODEL = "/nonexistent/tl-directional-model"  # loading it would fail: the --out check must come first

_COMMANDS = {
    "profile": (["profile", "--model", _NO_MODEL, "--force"], "--out"),
    "sweep": (["sweep", "--model", _NO_MODEL, "--force"], "--out"),
    "report": (["report", "--model", _NO_MODEL, "--force"], "--out"),
    "compress": (["compress", "--model", _NO_MODEL, "--spec", "rtn:bits=8", "--force"], "--out"),
    "compress-check": (["compress-check", "--dense", _NO_MODEL, "--compressed", _NO_MODEL,
                        "--max-perp-error", "0.1", "--force"], "--report"),
    "train": (["train", "--corpus", _NO_MODEL], "--out"),
    "experiment": (["experiment", "--corpus", _NO_MODEL], "--out"),
}


def _case(name: str, tmp: Path, home: Path, work: Path) -> tuple[str, list[str]]:
    """(--out value, fragments the error line must hold) of one refused output."""
    if name == "empty":
        return "", ["is empty"]
    if name == "dot":
        return ".", ["is the current directory"]
    if name == "home":
        return str(home), [str(home), "is your home directory"]
    if name == "root":
        return "/", ["is the root of the file system"]
    if name == "ancestor":
        return "..", ["..", "is an ancestor of the current directory"]
    if name == "foreign":
        mine = tmp / "mine"
        return str(mine), [f"refusing to replace {mine.resolve()}", "not a previous",
                           "no manifest.json of a tl-directional command"]
    if name == "read-only":
        ro = tmp / "ro"
        return str(ro), [str(ro), "is read-only (mode 555)"]
    if name == "parent-is-a-file":
        return str(tmp / "afile" / "out"), [str(tmp / "afile"), "is a file, not a directory"]
    if name == "unwritable":
        return "/proc/tl-directional-out", ["/proc/tl-directional-out", "cannot create files in /proc"]
    raise AssertionError(name)


@pytest.mark.parametrize("case", ["empty", "dot", "home", "root", "ancestor", "foreign", "read-only",
                                  "parent-is-a-file", "unwritable"])
@pytest.mark.parametrize("command", list(_COMMANDS))
def test_outputs_that_are_never_replaced_are_refused_before_any_model_work(command, case, tmp_path, monkeypatch):
    if case == "unwritable" and not Path("/proc/self").exists():
        pytest.skip("needs /proc (a directory nobody can create files in)")
    home = tmp_path / "home"
    work = home / "projects" / "s"  # ".." is an ancestor of it, not the home directory
    work.mkdir(parents=True)
    (work / "keep").write_text("keep")
    (home / "notes.txt").write_text("the user's notes")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    (tmp_path / "ro").mkdir(mode=0o555)
    (tmp_path / "ro").chmod(0o555)
    (tmp_path / "afile").write_text("a file")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    out, fragments = _case(case, tmp_path, home, work)
    argv, option = _COMMANDS[command]
    before = _tree(tmp_path)
    try:
        rc, err = _cli(*argv, option, out)
        line = _one_error_line(rc, err, *fragments)
        assert line.startswith(f"error: {option}") or case == "foreign", line  # names the user's option
        assert ".lock" not in line and "--model" not in line and "--dense" not in line, line
        if case == "foreign" and "--force" in argv:
            assert "--force never replaces files the library did not write" in line
        assert _tree(tmp_path) == before  # nothing created, removed or re-moded; no lock file left
    finally:
        (tmp_path / "ro").chmod(0o755)


# -- one lock for the whole run: a second writer is refused at start ---------------------------------


def test_second_writer_on_one_out_is_refused_at_start_naming_the_owner(tiny_model_dir, tmp_path, text_file):
    model = tiny_model_dir("gpt2")
    out = tmp_path / "p"
    owner = tmp_path / ".p.owner"
    first = subprocess.Popen([sys.executable, "-m", "tl_directional.cli", "profile",
                              *map(str, _small(model, text_file, 4)), "--out", str(out)],
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not owner.exists():  # the first run records itself when it takes the lock, at its start
            assert first.poll() is None, "the first run ended without ever holding a lock on --out: " + \
                first.stderr.read()[-2000:]
        first.send_signal(signal.SIGSTOP)  # hold it mid-run
        rc, err = _cli("profile", *_small(model, text_file), "--out", out)
        _one_error_line(rc, err, f"--out {out.resolve()} is in use by pid {first.pid} on host",
                        "tl-directional profile", "choose another output")
        first.send_signal(signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr[-2000:]
    assert tld.Profile.load(out).metadata["sequences_seen"] == 4  # the first run's result, complete
    assert _hidden_leftovers(tmp_path, out) == []


# -- the swap is recoverable at every step ------------------------------------------------------------

_SWAP_STEPS = ("replace_dir.before_swap", "replace_dir.ready", "replace_dir.mid_swap", "replace_dir.after_swap")


def test_profile_killed_at_every_step_of_the_swap_leaves_the_old_or_the_new_output(tiny_model_dir, tmp_path,
                                                                                    text_file):
    """A kill at each step of the output swap: the next reader finds the old or the new profile
    complete (never a missing directory), and the next write leaves nothing behind."""
    model = tiny_model_dir("gpt2")
    out = tmp_path / "p"
    old, new = _small(model, text_file, 2), _small(model, text_file, 3)
    for step in _SWAP_STEPS:
        rc, err = _cli("profile", *old, "--out", out)
        assert rc == 0, err
        r = _subprocess_cli(["profile", *new, "--out", out], fault=step)
        assert r.returncode == -signal.SIGKILL, (step, r.stderr[-2000:])
        seen = tld.Profile.load(out).metadata["sequences_seen"]  # verified against its manifest
        # before the old output is set aside the old one stands; after, the complete new one
        assert seen == (3 if step in ("replace_dir.mid_swap", "replace_dir.after_swap") else 2), step
        rc, err = _cli("profile", *old, "--out", out)  # the next write completes the cleanup
        assert rc == 0, err
        assert tld.Profile.load(out).metadata["sequences_seen"] == 2
        assert _hidden_leftovers(tmp_path, out) == [], step


def test_next_write_recovers_a_swap_killed_between_its_renames(tiny_model_dir, tmp_path, text_file):
    model = tiny_model_dir("gpt2")
    out = tmp_path / "p"
    rc, err = _cli("profile", *_small(model, text_file, 2), "--out", out)
    assert rc == 0, err
    r = _subprocess_cli(["profile", *_small(model, text_file, 3), "--out", out], fault="replace_dir.mid_swap")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert not out.exists()  # cut between the renames: the target is missing until recovered
    rc, err = _cli("profile", *_small(model, text_file, 2), "--out", out)  # no reader in between
    assert rc == 0, err
    assert tld.Profile.load(out).metadata["sequences_seen"] == 2
    assert _hidden_leftovers(tmp_path, out) == []


# -- nothing left behind, on every exit path ------------------------------------------------------------


def test_lock_files_and_temporaries_never_outlive_a_run(tiny_model_dir, tmp_path, text_file):
    model = tiny_model_dir("gpt2")
    rc, err = _cli("profile", *_small(model, text_file), "--out", tmp_path / "p")
    assert rc == 0, err
    assert _hidden_leftovers(tmp_path, tmp_path / "p") == []  # a finished run
    rc, err = _cli("profile", *_small(model, text_file), "--text", tmp_path / "missing.txt",
                   "--out", tmp_path / "a" / "b" / "p")
    _one_error_line(rc, err, "--text")
    assert not (tmp_path / "a").exists()  # a failed run: not even the parents it created
    # a sweep killed while writing its figure leaves a temporary; the rerun removes it
    sw = tmp_path / "sw"
    argv = ["sweep", *_small(model, text_file), "--space", "value", "--s-par=0", "--out", sw]
    r = _subprocess_cli(argv, fault="sweep.html_written")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert [p for p in sw.iterdir() if p.name.startswith(".sweep.html.") and p.name.endswith(".tmp")]
    rc, err = _cli(*argv)
    assert rc == 0, err
    assert _hidden_leftovers(tmp_path, sw) == []
    assert sorted(p.name for p in sw.iterdir()) == ["manifest.json", "sweep.csv", "sweep.html",
                                                     "sweep.progress.json"]


def test_failed_train_and_experiment_leave_nothing(tmp_path):
    for command in ("train", "experiment"):
        out = tmp_path / command / "runs" / "r"
        rc, err = _cli(command, "--out", out, "--corpus", tmp_path / "no-corpus", "--quiet")
        _one_error_line(rc, err, str(tmp_path / "no-corpus"))
        assert not (tmp_path / command).exists(), command  # no empty --out folder, no parents
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, err = _cli("train", "--out", empty, "--corpus", tmp_path / "no-corpus", "--quiet")
    assert rc == 2 and sorted(os.listdir(empty)) == [] and _hidden_leftovers(tmp_path) == []


# -- the lock: cross-platform, owner recorded, a dead owner's lock taken over -------------------------


def test_the_output_lock_is_cross_platform_records_its_owner_and_is_taken_over(tmp_path):
    import inspect

    from tl_directional.io import locks
    from tl_directional.io.atomic import ArtefactLockedError
    from tl_directional.io.locks import exclusive_lock, lock_path_for, owner_path_for

    assert "fcntl" not in inspect.getsource(locks)  # filelock: flock on POSIX, msvcrt on Windows
    target = tmp_path / "p"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from tl_directional.io.locks import exclusive_lock\n"
         "with exclusive_lock(sys.argv[1], 'tl-directional holder'):\n"
         "    print('locked', flush=True); time.sleep(600)", str(target)],
        env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        record = json.loads(owner_path_for(target).read_text())
        assert record["pid"] == holder.pid and record["command"] == "tl-directional holder"
        with pytest.raises(ArtefactLockedError, match=f"in use by pid {holder.pid} on host .*tl-directional holder"):
            with exclusive_lock(target):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_path_for(target).exists()  # left by the killed owner ...
    with exclusive_lock(target, "me"):  # ... and taken over: the system dropped the dead owner's lock
        assert json.loads(owner_path_for(target).read_text())["pid"] == os.getpid()
        with pytest.raises(ArtefactLockedError, match=f"pid {os.getpid()}"):
            with exclusive_lock(target):  # refused within one process too
                pass
    assert _hidden_leftovers(tmp_path) == []  # lock file and owner record removed on release


# -- loading and writing failures on the CLI: one error line -------------------------------------------


@pytest.fixture(scope="module")
def damaged_dirs(tiny_model_dir, tmp_path_factory):
    from safetensors.torch import load_file, save_file

    src = tiny_model_dir("gpt2")
    root = tmp_path_factory.mktemp("damaged")
    shape = root / "wrong-shape"
    shutil.copytree(src, shape)
    (shape / "manifest.json").unlink(missing_ok=True)
    tensors = load_file(shape / "model.safetensors")
    name = next(k for k in tensors if k.endswith("h.0.attn.c_proj.weight"))
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, shape / "model.safetensors", metadata={"format": "pt"})
    pickled = root / "pickled"
    shutil.copytree(src, pickled)
    (pickled / "manifest.json").unlink(missing_ok=True)
    (pickled / "model.safetensors").unlink()
    marker = root / "EXECUTED"
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(str(marker))}))
    return {"wrong-shape": shape, "pickled": pickled}, marker


class _Payload:
    """Unpickling this would create a file: proof that a pickle was executed."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("damage", ["wrong-shape", "pickled"])
@pytest.mark.parametrize("command", ["profile", "sweep", "report"])
def test_damaged_model_directory_is_one_error_line(command, damage, damaged_dirs, tmp_path, text_file):
    dirs, marker = damaged_dirs
    model = dirs[damage]
    extra = ["--space", "value", "--s-par=0"] if command != "profile" else []
    rc, err = _cli(command, *_small(model, text_file), *extra, "--out", tmp_path / "o")
    if damage == "wrong-shape":  # the loader names the tensor (DamagedWeightsError)
        _one_error_line(rc, err, f"--model {model}", "h.0.attn.c_proj.weight")
    else:
        _one_error_line(rc, err, f"--model {model} cannot be loaded", "was not executed")
    assert not marker.exists() and not (tmp_path / "o").exists()
    assert _hidden_leftovers(tmp_path) == []


_FULL_DISK = """
import sys
import transformers.modeling_utils as mu
from safetensors import SafetensorError


def full_disk(tensors, filename, metadata=None):  # what safetensors raises when the disk fills
    with open(filename, "wb") as f:
        f.write(bytes(64))
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


mu.safe_save_file = full_disk
from tl_directional.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.bridge  # compress --out writes HF directories from the bridge lane only
def test_compress_on_a_full_disk_is_one_error_line_and_keeps_the_previous_model(tiny_model_dir, tmp_path):
    dense = tiny_model_dir("gpt2")
    out = tmp_path / "c"
    rc, err = _cli("compress", "--model", dense, "--spec", "rtn:bits=8", "--out", out)
    assert rc == 0, err
    before = _tree(tmp_path)
    r = subprocess.run([sys.executable, "-c", _FULL_DISK, "compress", "--model", str(dense), "--spec",
                        "rtn:bits=4", "--out", str(out)], env=_env(), capture_output=True, text=True, timeout=300)
    _one_error_line(r.returncode, r.stderr, f"writing {out}", "No space left on device",
                    "the previous output, if any, is kept")
    assert _tree(tmp_path) == before  # the previous model intact, no partial folder, no lock file
    from tl_directional.model.load import load_model

    load_model(out)


@pytest.mark.bridge  # compress --out writes HF directories from the bridge lane only
def test_a_model_directory_cut_between_its_renames_is_recovered_by_the_next_reader(tiny_model_dir, tmp_path,
                                                                                    text_file):
    dense = tiny_model_dir("gpt2")
    out = tmp_path / "c"
    rc, err = _cli("compress", "--model", dense, "--spec", "rtn:bits=8", "--out", out)
    assert rc == 0, err
    r = _subprocess_cli(["compress", "--model", dense, "--spec", "rtn:bits=4", "--out", out],
                        fault="replace_dir.mid_swap")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert not out.exists()
    rc, err = _cli("profile", *_small(out, text_file), "--out", tmp_path / "p")  # a reader, not a writer
    assert rc == 0, err
    record = json.loads((out / "tl_directional_compression.json").read_text())
    assert record["params"]["bits"] == 4  # the complete new model, verified against its manifest
    from tl_directional.io.records import verify_manifest

    verify_manifest(out, kind="compressed-model")
    assert _hidden_leftovers(tmp_path) == []


def test_library_writers_refuse_the_same_paths(tmp_path, monkeypatch):
    import pandas as pd

    from tl_directional.io.atomic import ArtefactError

    work = tmp_path / "s"
    work.mkdir()
    (work / "keep").write_text("keep")
    monkeypatch.chdir(work)
    prof = tld.Profile(pd.DataFrame({"layer": [0]}), pd.DataFrame({"layer": [0]}), {})
    for path, why in (("", "is empty"), (".", "is the current directory"), ("..", "is an ancestor"),
                      (str(work), "is the current directory")):
        with pytest.raises(ArtefactError, match=why):
            prof.save(path, format="csv", overwrite=True)
    assert sorted(os.listdir(work)) == ["keep"] and _hidden_leftovers(tmp_path) == []
