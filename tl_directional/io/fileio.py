"""Integrity of everything written to disk: one home for it.

- Atomic file writes: every writer goes to a temporary file in the target's
  directory, fsyncs it, then renames it over the target (``os.replace`` is atomic
  on POSIX), so an interruption leaves either the old file or the new one.
- Manifests: an artefact directory lists the sha256 and size of each of its files
  in ``manifest.json``, written last; loaders verify it and name the failing file.
- Sealed JSON records: a record carries the sha256 of its own content.
- Exclusive locks on outputs (a cross-platform :mod:`filelock` lock, with an owner
  record), held for a command's whole run, so two processes never write one output; a
  dead owner's lock is taken over; lock files are removed however the run ends.
- Output paths checked before any work: never an empty path, the current or home
  directory, a root or an ancestor of the current directory, a read-only directory, or a
  directory holding files the library did not write (``--force`` or not).
- Whole-directory outputs built in a temporary sibling and swapped in, recoverable at
  every step (the next reader or writer completes an interrupted swap), refusing to
  replace a directory that is not a previous output of the same command.

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
from contextlib import ExitStack, contextmanager, suppress
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
    recover_interrupted_swap(directory)
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


def owner_path_for(target: str | os.PathLike) -> Path:
    """The owner record of an output's lock: a hidden sibling ``.NAME.owner`` (JSON: pid,
    host, command, since). Kept apart from the lock file, which some platforms do not let
    other processes read while it is locked."""
    target = Path(target)
    return target.parent / f".{target.name}.owner"


def _describe_owner(text: str) -> str:
    try:
        owner = json.loads(text)
        return (f"pid {owner.get('pid')} on host {owner.get('host')} "
                f"({owner.get('command', '?')}, since {owner.get('since', '?')})")
    except (json.JSONDecodeError, AttributeError):
        return "another process"


#: Lock files of the outputs this process claimed for a whole run (:func:`claim_output`):
#: the writers it calls re-enter them instead of being refused by their own process.
_CLAIMED: dict[str, int] = {}


def _still_locked_path(held, lock: Path) -> bool:
    """Whether the file ``held`` locked is still the one named ``lock``. A previous owner
    removes the lock file while releasing it, so a process that opened the file just before
    holds a lock on a removed file; it must lock the new one instead."""
    try:
        now = os.stat(lock)
    except FileNotFoundError:
        return False
    fd = getattr(getattr(held, "_context", None), "lock_file_fd", None)
    if isinstance(fd, int):
        try:
            return os.path.samestat(os.fstat(fd), now)
        except OSError:
            return True
    return True


@contextmanager
def exclusive_lock(target: str | os.PathLike, command: str = "") -> Iterator[Path]:
    """Hold an exclusive lock on the output ``target`` for the duration of the block.

    Cross-platform (:class:`filelock.FileLock`: ``flock`` on POSIX, ``msvcrt`` locking on
    Windows); the operating system drops the lock when its owner dies, even by ``SIGKILL``,
    so a lock left by a dead process is taken over, while a live owner makes this raise
    :class:`ArtefactLockedError` naming its pid, host and command (from the owner record,
    :func:`owner_path_for`). The lock file (:func:`lock_path_for`) and the owner record are
    removed when the block ends, however it ends. Within one process a second lock on the
    same output is refused too, unless the output was claimed for the whole run
    (:func:`claim_output`), which the writers it calls then re-enter.
    """
    from filelock import FileLock, Timeout

    resolved = Path(target).resolve()
    lock = lock_path_for(resolved)
    if str(lock) in _CLAIMED:
        yield lock
        return
    owner = owner_path_for(resolved)
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = None
    for _ in range(16):
        held = FileLock(str(lock), timeout=0)
        try:
            held.acquire()
        except Timeout:
            if not lock.exists():  # not held by anyone: the lock file cannot be created; say why
                os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o644))
                lock.unlink()
                held = None
                continue
            try:
                text = owner.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = ""
            raise ArtefactLockedError(
                f"{target} is in use by {_describe_owner(text)}: two writers on one output would mix "
                "or lose results. Wait for it to finish or choose another output") from None
        if _still_locked_path(held, lock):
            break
        held.release()
        held = None
    if held is None:
        raise ArtefactLockedError(f"{target} is being locked and released by other processes too often "
                                  "to take its lock; retry")
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        owner.write_text(json.dumps(info), encoding="utf-8")
        yield lock
    finally:
        # removed while still held: a process that opened the lock file meanwhile finds it
        # gone once it gets the lock (_still_locked_path) and locks a new one
        for path in (owner, lock):
            with suppress(OSError):
                path.unlink()
        held.release()


# ---------------------------------------------------------------------------
# whole-directory outputs: build beside the target, then swap it in
# ---------------------------------------------------------------------------


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _read_only(path: Path) -> bool:
    """No write permission on ``path`` for this process, or none in its mode at all (the
    owner protected it; root's access checks alone would not say so)."""
    return not os.access(path, os.W_OK | os.X_OK) or not path.stat().st_mode & 0o222


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError, OSError):  # no HOME and no password entry
        return None


def check_output_path(path: str | os.PathLike, argument: str = "path") -> Path:
    """Refuse an output path no command may ever replace, before any work; returns it resolved.

    Refused, whatever ``force``: an empty path (an unset shell variable), the current
    directory, the home directory, a file system root, any ancestor of the current
    directory, an existing file, a read-only directory, a path below a file, and a path
    whose nearest existing directory this process cannot write. The message names
    ``argument``, the path as given and why.
    """
    text = os.fspath(path)
    if not str(text).strip():
        raise ArtefactError(f"{argument} is empty ({str(text)!r}; an unset shell variable?): an empty path "
                            "would name the current directory, whose files would be replaced. Pass a new "
                            "directory path")
    given = f"{argument} {text}"
    resolved = Path(text).expanduser().resolve()
    cwd = Path.cwd().resolve()
    why = None
    if resolved == Path(resolved.anchor):
        why = "is the root of the file system"
    elif resolved == cwd:
        why = "is the current directory"
    elif resolved == _home():
        why = "is your home directory"
    elif resolved in cwd.parents:
        why = f"is an ancestor of the current directory ({cwd})"
    if why is not None:
        raise ArtefactError(f"{given} {why}: an output directory is replaced as a whole, so its files would "
                            "be lost. Pass a new directory path (e.g. ./out)")
    if resolved.exists() and not resolved.is_dir():
        raise ArtefactError(f"{given} is an existing file, not a directory; pass a directory path")
    if resolved.is_dir() and _read_only(resolved):
        raise ArtefactError(f"{given} is read-only (mode {resolved.stat().st_mode & 0o777:o}): a protected "
                            "directory is never replaced; choose another output directory (or make it "
                            "writable yourself)")
    existing = resolved.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ArtefactError(f"{given}: {existing} is a file, not a directory, so nothing can be created "
                            "below it; pass another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArtefactError(f"{given}: cannot write in {existing} (permission denied); choose a directory "
                            "you can write")
    return resolved


def check_replaceable(target: str | os.PathLike, kind: str, *, force: bool = False,
                      force_hint: str = "pass force=True", legacy_names: frozenset[str] = frozenset()) -> None:
    """Refuse to replace ``target`` unless it is absent, an empty directory, or a previous
    ``kind`` output: its manifest says so, or (written before manifests existed) it holds
    only entries named in ``legacy_names``. ``force`` also lets it replace a previous output
    of another tl-directional command (a directory with a valid manifest), never a directory
    holding files the library did not write."""
    target = Path(target)
    if not target.exists():
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
            p.name in legacy_names for p in target.iterdir() if not p.name.startswith(".")) and any(
            not p.name.startswith(".") for p in target.iterdir()):
        return
    if doc is not None and (doc.get("kind") == kind or force):
        return
    if doc is not None:
        raise ArtefactError(
            f"refusing to replace {target}: it is not empty and is not a previous {kind} output (it holds a "
            f"{doc.get('kind')} output), so its files would be lost. Choose a new or empty directory, or "
            f"{force_hint} to replace it")
    option = force_hint.removeprefix("pass ").split(" (")[0]
    never = f"; {option} never replaces files the library did not write" if option else ""
    raise ArtefactError(
        f"refusing to replace {target}: it is not empty and is not a previous {kind} output (no "
        f"{MANIFEST_FILE} of a tl-directional command), so its files would be lost{never}. Choose a new "
        "or empty directory")


def _by_age(paths) -> list[Path]:
    out = []
    for p in paths:
        with suppress(OSError):
            out.append((p.lstat().st_mtime, p))
    return [p for _, p in sorted(out)]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with suppress(OSError):
            path.unlink()


def _restore_interrupted_swap(target: Path) -> None:
    """Under ``target``'s lock: finish or undo a swap (:func:`_swap_in`) a crash cut short.

    A swap renames the complete new output to ``.NAME.new-PID``, the old one to
    ``.NAME.old-PID``, then the new one to ``NAME``. With ``NAME`` missing, the new output
    is put in place when it exists (the crash came after the old one was set aside), else
    the old one; every other leftover is removed."""
    news = _by_age(target.parent.glob(f".{target.name}.new-*"))
    olds = _by_age(target.parent.glob(f".{target.name}.old-*"))
    if not target.exists() and not target.is_symlink():
        if news:
            os.rename(news.pop(), target)
        elif olds:
            os.rename(olds.pop(), target)
    for stale in news + olds:
        _remove(stale)


def recover_interrupted_swap(target: str | os.PathLike) -> None:
    """For readers: when ``target`` is missing because a writer was killed in the middle of
    swapping it, put the complete new output (or the old one) back under ``target``.

    A no-op when ``target`` exists or no swap was cut short. Takes ``target``'s lock, so a
    swap still in progress raises :class:`ArtefactLockedError` naming its writer (retry
    once it has finished); a directory this process cannot write is left as it is."""
    target = Path(target).resolve()
    if target.exists() or target.is_symlink():
        return
    if not any(target.parent.glob(f".{target.name}.new-*")) and not any(
            target.parent.glob(f".{target.name}.old-*")):
        return
    try:
        with exclusive_lock(target, "recover an interrupted write"):
            _restore_interrupted_swap(target)
    except ArtefactLockedError as err:
        raise ArtefactLockedError(f"{target} is being replaced right now ({err}); retry when it has "
                                  "finished") from None
    except OSError:
        return


def _remove_stale_temporaries(target: Path) -> None:
    """Under ``target``'s lock (their writers are dead): the build folders beside ``target``
    and the temporary files an atomic write left inside it (``.NAME.XXXXXXXX.tmp``)."""
    for orphan in target.parent.glob(f".{target.name}.*.partial"):
        _remove(orphan)
    for orphan in target.parent.glob(f".{target.name}.*.tmp"):
        _remove(orphan)
    if target.is_dir():
        for orphan in target.glob(".*.tmp"):
            if orphan.is_file() and len(orphan.name.rsplit(".", 2)[-2]) == 8:  # mkstemp's 8 characters
                _remove(orphan)


@contextmanager
def claim_output(target: str | os.PathLike, kind: str, *, force: bool = False,
                 force_hint: str = "pass force=True", command: str = "",
                 legacy_names: frozenset[str] = frozenset(), argument: str = "path") -> Iterator[Path]:
    """Check the output ``target`` and hold its lock for the whole block; yields it resolved.

    Before any work: :func:`check_output_path` (paths never replaced, writability), then
    :func:`exclusive_lock` (a second writer is refused at once, naming this one), then an
    interrupted swap is recovered, :func:`check_replaceable` applied and stale temporaries
    removed. Writers called inside the block (:func:`replace_dir`, :func:`exclusive_lock`)
    on the same target re-enter the claim. When the block ends, however it ends, the lock
    files are removed, and so are the parent directories the claim created if ``target``
    was not written.
    """
    resolved = check_output_path(target, argument)
    key = str(lock_path_for(resolved))
    if key in _CLAIMED:  # re-entered by a writer inside the run that claimed it
        check_replaceable(resolved, kind, force=force, force_hint=force_hint, legacy_names=legacy_names)
        yield resolved
        return
    created = []
    parent = resolved.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    try:
        with ExitStack() as held:
            try:
                resolved.parent.mkdir(parents=True, exist_ok=True)
                held.enter_context(exclusive_lock(resolved, command or kind))
            except ArtefactLockedError as err:
                raise ArtefactLockedError(f"{argument} {err}") from None
            except OSError as err:
                raise ArtefactError(f"{argument} {os.fspath(target)}: cannot create files in {resolved.parent} "
                                    f"({err.strerror or err}); choose a directory you can write") from None
            _restore_interrupted_swap(resolved)
            check_replaceable(resolved, kind, force=force, force_hint=force_hint, legacy_names=legacy_names)
            _remove_stale_temporaries(resolved)
            _CLAIMED[key] = _CLAIMED.get(key, 0) + 1
            try:
                yield resolved
            finally:
                _CLAIMED[key] -= 1
                if not _CLAIMED[key]:
                    del _CLAIMED[key]
    finally:
        if not resolved.exists():
            for d in created:  # deepest first
                with suppress(OSError):
                    d.rmdir()


def _swap_in(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` directory to ``target``, replacing what is there.

    Every step leaves a state :func:`_restore_interrupted_swap` completes: ``tmp`` is first
    named ``.NAME.new-PID`` (complete, manifest written), the old output then set aside as
    ``.NAME.old-PID``, the new one renamed to ``NAME``, the old one removed."""
    ready = target.with_name(f".{target.name}.new-{os.getpid()}")
    _remove(ready)
    os.rename(tmp, ready)
    fault_point("replace_dir.ready")
    if _is_empty_dir(target):
        target.rmdir()
    aside = None
    if target.exists() or target.is_symlink():
        aside = target.with_name(f".{target.name}.old-{os.getpid()}")
        _remove(aside)
        os.rename(target, aside)
        fault_point("replace_dir.mid_swap")
    try:
        os.rename(ready, target)
    except OSError:
        if aside is not None and not target.exists():
            os.rename(aside, target)  # keep the previous output in place
        raise
    fault_point("replace_dir.after_swap")
    if aside is not None:
        _remove(aside)


@contextmanager
def replace_dir(target: str | os.PathLike, kind: str, *, force: bool = False,
                force_hint: str = "pass force=True", command: str = "",
                manifest_extra: dict | None = None, legacy_names: frozenset[str] = frozenset()) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``target`` to fill; on success write its
    manifest (kind ``kind``) and swap it in place of ``target``.

    Under :func:`claim_output` of ``target`` (re-entered when the caller claimed it for its
    whole run). A crash at any point leaves the previous output or the complete new one
    (an interrupted swap is completed by the next reader or writer, never a mixture), and
    the temporaries of earlier crashes are removed. ``target`` must be absent, empty, or a
    previous ``kind`` output (see :func:`check_replaceable`; ``force`` also replaces
    another command's output), and never one :func:`check_output_path` refuses.
    """
    with claim_output(target, kind, force=force, force_hint=force_hint, command=command,
                      legacy_names=legacy_names) as target:
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
            _remove(tmp)
            _remove(target.with_name(f".{target.name}.new-{os.getpid()}"))


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
    recover_interrupted_swap(p)
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
