"""Output paths and directories, checked and claimed for a command's whole run.

- Output paths checked before any work: never an empty path, the current or home
  directory, a root or an ancestor of the current directory, a read-only directory, or a
  directory holding files the library did not write (``--force`` or not).
- A claim holds the output's lock (:mod:`tl_directional.io.locks`) for the whole run;
  whole-directory outputs are built in a temporary sibling and swapped in, refusing to
  replace a directory that is not a previous output of the same command.

See docs/reliability.md for the guarantees and the tests that hold them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from .atomic import ArtefactError, ArtefactLockedError, fault_point, write_error
from .locks import (
    CLAIMED_OUTPUTS,
    exclusive_lock,
    is_empty_dir,
    lock_path_for,
    remove_path,
    restore_interrupted_swap,
    swap_in,
)
from .records import MANIFEST_FILE, read_manifest, write_manifest


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


def _only_lock_records(target: Path) -> bool:
    """Whether ``target`` holds nothing but the library's own lock files and owner records
    (``.NAME.lock`` / ``.NAME.owner``, :mod:`tl_directional.io.locks`): what a run killed before its
    first checkpoint leaves. Such a directory holds no result, so it is as good as empty."""
    entries = list(target.iterdir())
    return bool(entries) and all(
        p.is_file() and p.name.startswith(".") and p.name.endswith((".lock", ".owner")) for p in entries)


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
    if is_empty_dir(target) or _only_lock_records(target):
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


def _remove_stale_temporaries(target: Path) -> None:
    """Under ``target``'s lock (their writers are dead): the build folders beside ``target``
    and the temporary files an atomic write left inside it (``.NAME.XXXXXXXX.tmp``)."""
    for orphan in target.parent.glob(f".{target.name}.*.partial"):
        remove_path(orphan)
    for orphan in target.parent.glob(f".{target.name}.*.tmp"):
        remove_path(orphan)
    if target.is_dir():
        for orphan in target.glob(".*.tmp"):
            if orphan.is_file() and len(orphan.name.rsplit(".", 2)[-2]) == 8:  # mkstemp's 8 characters
                remove_path(orphan)


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
    if key in CLAIMED_OUTPUTS:  # re-entered by a writer inside the run that claimed it
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
            restore_interrupted_swap(resolved)
            check_replaceable(resolved, kind, force=force, force_hint=force_hint, legacy_names=legacy_names)
            _remove_stale_temporaries(resolved)
            CLAIMED_OUTPUTS[key] = CLAIMED_OUTPUTS.get(key, 0) + 1
            try:
                yield resolved
            finally:
                CLAIMED_OUTPUTS[key] -= 1
                if not CLAIMED_OUTPUTS[key]:
                    del CLAIMED_OUTPUTS[key]
    finally:
        if not resolved.exists():
            for d in created:  # deepest first
                with suppress(OSError):
                    d.rmdir()


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
            swap_in(tmp, target)
        except OSError as exc:
            if exc.filename is not None:
                raise
            raise write_error(exc, target) from exc
        finally:
            remove_path(tmp)
            remove_path(target.with_name(f".{target.name}.new-{os.getpid()}"))
