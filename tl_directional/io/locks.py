"""Exclusive locks on outputs, and the directory swap that runs under them.

- Exclusive locks (a cross-platform :mod:`filelock` lock, with an owner record), held for a
  command's whole run, so two processes never write one output; a dead owner's lock is taken
  over; lock files are removed however the run ends.
- A whole-directory output is swapped in by renames that every step of which a crash may cut
  short: the next reader or writer completes or undoes it (:func:`recover_interrupted_swap`).

See docs/reliability.md for the guarantees and the tests that hold them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .atomic import ArtefactLockedError, fault_point

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
CLAIMED_OUTPUTS: dict[str, int] = {}


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
    if str(lock) in CLAIMED_OUTPUTS:
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
# the directory swap: the new output beside the target, renamed into place
# ---------------------------------------------------------------------------


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _by_age(paths) -> list[Path]:
    out = []
    for p in paths:
        with suppress(OSError):
            out.append((p.lstat().st_mtime, p))
    return [p for _, p in sorted(out)]


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with suppress(OSError):
            path.unlink()


def restore_interrupted_swap(target: Path) -> None:
    """Under ``target``'s lock: finish or undo a swap (:func:`swap_in`) a crash cut short.

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
        remove_path(stale)


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
            restore_interrupted_swap(target)
    except ArtefactLockedError as err:
        raise ArtefactLockedError(f"{target} is being replaced right now ({err}); retry when it has "
                                  "finished") from None
    except OSError:
        return


def swap_in(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` directory to ``target``, replacing what is there.

    Every step leaves a state :func:`restore_interrupted_swap` completes: ``tmp`` is first
    named ``.NAME.new-PID`` (complete, manifest written), the old output then set aside as
    ``.NAME.old-PID``, the new one renamed to ``NAME``, the old one removed."""
    ready = target.with_name(f".{target.name}.new-{os.getpid()}")
    remove_path(ready)
    os.rename(tmp, ready)
    fault_point("replace_dir.ready")
    if is_empty_dir(target):
        target.rmdir()
    aside = None
    if target.exists() or target.is_symlink():
        aside = target.with_name(f".{target.name}.old-{os.getpid()}")
        remove_path(aside)
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
        remove_path(aside)
