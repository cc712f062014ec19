"""Integrity of everything written to disk: one home for it.

- Atomic file writes: every writer goes to a temporary file in the target's
  directory, fsyncs it, then renames it over the target (``os.replace`` is atomic
  on POSIX), so an interruption leaves either the old file or the new one.
- Manifests: an artefact directory lists the sha256 and size of each of its files
  in ``manifest.json``, written last; loaders verify it and name the failing file.
- Sealed JSON records: a record carries the sha256 of its own content.
- Exclusive locks on outputs (a ``flock`` on a lock file naming the owner), so two
  processes never write one output; a dead owner's lock is taken over.
- Whole-directory outputs built in a temporary sibling and swapped in, refusing
  to replace a directory that is not a previous output of the same command.

All user-facing failures raise :class:`ArtefactError` (a ``ValueError``).
See docs/reliability.md for the guarantees and the tests that hold them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..core.errors import TLDirectionalError


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``.

    For writers that want a filename (``pyarrow.parquet.write_table``,
    ``DataFrame.to_csv``). On an exception the temporary file is removed and
    ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; use the usual mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


# ---------------------------------------------------------------------------
# user-facing errors about artefacts on disk
# ---------------------------------------------------------------------------


class ArtefactError(TLDirectionalError, ValueError):
    """An artefact on disk is missing, corrupt, truncated, foreign or in use.

    The message names the file and says what to do; the command line reports it as
    one ``error:`` line with exit status 2.
    """


class ArtefactLockedError(ArtefactError):
    """Another live process holds the exclusive lock of an output."""


# ---------------------------------------------------------------------------
# manifests: sha256 and size of every file of an artefact directory
# ---------------------------------------------------------------------------

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "tl-directional-manifest/1"
_CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _artefact_files(directory: Path) -> list[str]:
    """Relative paths of the files a manifest covers: every regular file except the
    manifest itself and hidden names (temporary files, lock files)."""
    out = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if p.is_file() and rel.as_posix() != MANIFEST_FILE and not any(s.startswith(".") for s in rel.parts):
            out.append(rel.as_posix())
    return out


def write_manifest(directory: str | os.PathLike, kind: str, extra: dict | None = None) -> Path:
    """Write ``directory/manifest.json`` (atomically, last) listing sha256 and size of
    every file now in ``directory``; ``kind`` names the command that wrote it."""
    directory = Path(directory)
    files = {rel: {"sha256": sha256_file(directory / rel), "bytes": (directory / rel).stat().st_size}
             for rel in _artefact_files(directory)}
    doc = {"format": MANIFEST_FORMAT, "kind": kind, "files": files, **(extra or {})}
    path = directory / MANIFEST_FILE
    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(directory: str | os.PathLike, *, name: str = MANIFEST_FILE,
                  strict: bool = True) -> dict | None:
    """The manifest of ``directory`` (None when it has none); a corrupt manifest raises.

    ``name`` is the manifest's file name. With ``strict=False`` (the model cache's
    ``tl_directional_manifest.json``, see :mod:`tl_directional.model.load.catalog`) any JSON
    object is accepted and an unreadable or corrupt file reads as None instead of raising.
    """
    path = Path(directory) / name
    if not strict:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return doc
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtefactError(f"{path} is corrupt or truncated ({err}); the directory cannot be "
                            "verified: write it again") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("files"), dict):
        raise ArtefactError(f"{path} is not a {MANIFEST_FORMAT} manifest; write the directory again")
    return doc


def verify_manifest(directory: str | os.PathLike, *, kind: str | None = None, required: bool = True,
                    fix: str = "write it again") -> dict | None:
    """Check every file listed in ``directory``'s manifest (size, then sha256).

    Raises :class:`ArtefactError` naming the first file that is missing, truncated or
    changed (and a directory without a manifest when ``required``). Returns the manifest.
    """
    directory = Path(directory)
    doc = read_manifest(directory)
    if doc is None:
        if required:
            raise ArtefactError(f"{directory} has no {MANIFEST_FILE}: it is incomplete (a write was "
                                f"interrupted) or was not written by tl-directional; {fix}")
        return None
    if kind is not None and doc.get("kind") != kind:
        raise ArtefactError(f"{directory} holds a {doc.get('kind')!r} artefact, not a {kind!r} one")
    for rel, entry in sorted(doc["files"].items()):
        f = directory / rel
        if not f.is_file():
            raise ArtefactError(f"{f} is missing (listed in {directory / MANIFEST_FILE}); {fix}")
        size = f.stat().st_size
        if size != entry.get("bytes"):
            raise ArtefactError(f"{f} is truncated or changed ({size} bytes, manifest says "
                                f"{entry.get('bytes')}); {fix}")
        if sha256_file(f) != entry.get("sha256"):
            raise ArtefactError(f"{f} is corrupt (sha256 differs from {directory / MANIFEST_FILE}); {fix}")
    return doc


# ---------------------------------------------------------------------------
# sealed JSON records: a sha256 of the content travels inside the file
# ---------------------------------------------------------------------------

SEAL_KEY = "record_sha256"


def _seal_of(obj: dict) -> str:
    body = {k: v for k, v in obj.items() if k != SEAL_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sealed_json_dumps(obj: dict) -> bytes:
    """JSON of ``obj`` with a ``record_sha256`` of its canonical form added."""
    return (json.dumps({**obj, SEAL_KEY: _seal_of(obj)}, indent=2, sort_keys=True) + "\n").encode("utf-8")


def sealed_json_loads(data: bytes | str, path: str | os.PathLike, *, fix: str) -> dict:
    """Parse a record written by :func:`sealed_json_dumps` and check its seal; any
    damage (truncation, an edited byte, a missing seal) raises :class:`ArtefactError`."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtefactError(f"{path} is corrupt or truncated ({err}); {fix}") from None
    if not isinstance(obj, dict) or SEAL_KEY not in obj:
        raise ArtefactError(f"{path} has no integrity seal ({SEAL_KEY}); it is damaged or was written "
                            f"by an older version; {fix}")
    if obj[SEAL_KEY] != _seal_of(obj):
        raise ArtefactError(f"{path} was changed or damaged after it was written (its {SEAL_KEY} does "
                            f"not match its content); {fix}")
    return obj


# ---------------------------------------------------------------------------
# exclusive locks on outputs
# ---------------------------------------------------------------------------


def lock_path_for(target: str | os.PathLike) -> Path:
    """The lock file of an output (a file or a directory): a hidden sibling
    ``.NAME.lock``, so that the output itself can be replaced while it is held."""
    target = Path(target)
    return target.parent / f".{target.name}.lock"


def _describe_owner(text: str) -> str:
    try:
        owner = json.loads(text)
        return (f"pid {owner.get('pid')} on host {owner.get('host')} "
                f"({owner.get('command', '?')}, since {owner.get('since', '?')})")
    except (json.JSONDecodeError, AttributeError):
        return "another process"


@contextmanager
def exclusive_lock(target: str | os.PathLike, command: str = "") -> Iterator[Path]:
    """Hold an exclusive lock on the output ``target`` for the duration of the block.

    The lock file (:func:`lock_path_for`) records the owner's pid, host and command.
    The lock itself is a ``flock`` on that file, which the kernel drops when its
    owner dies (even by ``SIGKILL``): a lock left by a dead process is taken over,
    while a live owner makes this raise :class:`ArtefactLockedError` naming it.
    """
    import fcntl

    lock = lock_path_for(Path(target).resolve())
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _describe_owner(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
            raise ArtefactLockedError(
                f"{target} is in use by {owner}: two writers on one output would mix or lose "
                f"results. Wait for it to finish or choose another output (lock file {lock})"
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield lock
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# whole-directory outputs: build beside the target, then swap it in
# ---------------------------------------------------------------------------


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def check_replaceable(target: str | os.PathLike, kind: str, *, force: bool = False,
                      force_hint: str = "pass force=True", legacy_names: frozenset[str] = frozenset()) -> None:
    """Refuse to replace ``target`` unless it is absent, an empty directory, or a
    previous ``kind`` output: its manifest says so, or (written before manifests
    existed) it holds only files named in ``legacy_names``. ``force`` overrides."""
    target = Path(target)
    if not target.exists() or force:
        return
    if not target.is_dir():
        raise ArtefactError(f"{target} exists and is not a directory; choose another output "
                            "directory or remove it")
    if _is_empty_dir(target):
        return
    try:
        doc = read_manifest(target)
    except ArtefactError:
        doc = None
    if doc is None and legacy_names and all(
            p.is_file() and p.name in legacy_names for p in target.iterdir() if not p.name.startswith(".")):
        return
    if doc is None or doc.get("kind") != kind:
        raise ArtefactError(
            f"refusing to replace {target}: it is not empty and is not a previous {kind} output "
            f"(no {MANIFEST_FILE} of kind {kind!r}), so its files would be lost. Choose a new or empty "
            f"directory, or {force_hint} to replace it"
        )


def _restore_interrupted_swap(target: Path) -> None:
    """A crash between the two renames of :func:`_swap_in` leaves the old output
    under ``.NAME.old-PID``; put it back so that nothing is lost."""
    if target.exists():
        for stale in target.parent.glob(f".{target.name}.old-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return
    olds = sorted(target.parent.glob(f".{target.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if olds:
        os.rename(olds[-1], target)


def _swap_in(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` directory to ``target``, replacing what is there."""
    if _is_empty_dir(target):
        target.rmdir()
    if not target.exists():
        os.rename(tmp, target)
        return
    aside = target.with_name(f".{target.name}.old-{os.getpid()}")
    if aside.exists():
        shutil.rmtree(aside)
    os.rename(target, aside)
    fault_point("replace_dir.mid_swap")
    os.rename(tmp, target)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


@contextmanager
def replace_dir(target: str | os.PathLike, kind: str, *, force: bool = False,
                force_hint: str = "pass force=True", command: str = "",
                manifest_extra: dict | None = None, legacy_names: frozenset[str] = frozenset()) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``target`` to fill; on success write its
    manifest (kind ``kind``) and swap it in place of ``target``.

    Under :func:`exclusive_lock` of ``target``. A crash at any point leaves either the
    previous output or the complete new one under ``target`` (never a mixture), and
    the temporaries of earlier crashes are removed. ``target`` must be absent, empty,
    or a previous ``kind`` output (see :func:`check_replaceable`), unless ``force``.
    """
    target = Path(target).resolve()  # "." or "out/.." name the real directory
    with exclusive_lock(target, command or kind):
        _restore_interrupted_swap(target)
        check_replaceable(target, kind, force=force, force_hint=force_hint, legacy_names=legacy_names)
        target.parent.mkdir(parents=True, exist_ok=True)
        for orphan in target.parent.glob(f".{target.name}.*.partial"):
            shutil.rmtree(orphan, ignore_errors=True)  # we hold the lock: their writer is dead
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700
        try:
            yield tmp
            fault_point("replace_dir.before_swap")
            for f in tmp.rglob("*"):
                if f.is_file():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            write_manifest(tmp, kind, manifest_extra)
            _swap_in(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------
# Hugging Face model directories
# ---------------------------------------------------------------------------

_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")


def check_safetensors_file(path: str | os.PathLike) -> None:
    """Raise :class:`ArtefactError` unless ``path`` is a complete safetensors file (its
    header parses and its size is exactly header + every tensor's bytes)."""
    path = Path(path)
    size = path.stat().st_size
    fix = "copy or write the model again"
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ArtefactError(f"{path} is truncated ({size} bytes, not a safetensors file); {fix}")
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            raise ArtefactError(f"{path} is truncated ({size} bytes; its header alone needs {8 + n}); {fix}")
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise ArtefactError(f"{path} is corrupt (its safetensors header does not parse); {fix}") from None
    if 8 + n + end != size:
        raise ArtefactError(f"{path} is truncated or corrupt ({size} bytes; its header describes "
                            f"{8 + n + end}); {fix}")


def check_model_dir(path: str | os.PathLike, argument: str, *, must_exist: bool = False) -> None:
    """Check a Hugging Face model directory before loading it: its manifest (when it
    has one), ``config.json``, complete safetensors weights and a tokenizer file.
    Names that are not existing paths (``"default"``, a TransformerLens name) pass,
    unless ``must_exist`` (:func:`tl_directional.model.load.load_model` with a path).

    Raises :class:`ArtefactError` naming ``argument``, the file and the fix.
    """
    p = Path(path)
    if not p.exists():
        if must_exist:
            raise ArtefactError(
                f"{argument}={str(p)!r} does not exist. Pass a directory written by "
                "build_tiny_hf_model() or save_pretrained(), or a TransformerLens model name.")
        return
    if not p.is_dir():
        raise ArtefactError(f"{argument} {p} is a file; pass a Hugging Face model directory")
    try:
        verify_manifest(p, required=False, fix="copy or write the model again")
    except ArtefactError as err:
        raise ArtefactError(f"{argument}: {err}") from None
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ArtefactError(f"{argument} {p} has no config.json; pass a directory written by "
                            "save_pretrained (or tl-directional compress)")
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtefactError(f"{argument}: {cfg} is corrupt or truncated ({err}); copy or write the "
                            "model again") from None
    weights = sorted(p.glob("*.safetensors"))
    if not weights and not any(p.glob("pytorch_model*.bin")):
        raise ArtefactError(f"{argument} {p} has no model.safetensors (no weights); copy the model's "
                            "weight files into it or write it again")
    for w in weights:
        try:
            check_safetensors_file(w)
        except ArtefactError as err:
            raise ArtefactError(f"{argument}: {err}") from None
    if not any((p / name).is_file() for name in _TOKENIZER_FILES):
        raise ArtefactError(f"{argument} {p} has no tokenizer.json; save the model's tokenizer into it "
                            f"(tokenizer.save_pretrained('{p}')) or copy tokenizer.json from the model "
                            "it was made from")


# ---------------------------------------------------------------------------
# crash-test hook
# ---------------------------------------------------------------------------

_FAULT_COUNTS: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Crash-test hook: with ``TL_DIRECTIONAL_FAULT=name[:n[:sigint]]`` in the environment
    this process kills itself with ``SIGKILL`` (or, with ``:sigint``, sends itself the
    ``SIGINT`` a Ctrl-C sends) the ``n``-th time (default 1) it passes ``name``. A no-op
    otherwise (tests/integration/test_faults.py and tests/integration/test_cli_rough_edges.py use it)."""
    spec = os.environ.get("TL_DIRECTIONAL_FAULT")
    if not spec or spec.split(":")[0] != name:
        return
    parts = spec.split(":")
    _FAULT_COUNTS[name] = _FAULT_COUNTS.get(name, 0) + 1
    if _FAULT_COUNTS[name] >= int(parts[1] if len(parts) > 1 else 1):
        import signal

        os.kill(os.getpid(), signal.SIGINT if parts[2:] == ["sigint"] else signal.SIGKILL)


def seal(obj: dict) -> dict:
    """``obj`` with its ``record_sha256`` added (for writers with their own JSON layout;
    :func:`sealed_json_loads` checks it)."""
    return {**obj, SEAL_KEY: _seal_of(obj)}
