"""Atomic file writes, the artefact errors every io module raises, and the crash-test hook.

Every writer goes to a temporary file in the target's directory, fsyncs it, then renames it
over the target (``os.replace`` is atomic on POSIX), so an interruption leaves either the old
file or the new one. All user-facing failures raise :class:`ArtefactError` (a ``ValueError``).
See docs/reliability.md for the guarantees and the tests that hold them.
"""

from __future__ import annotations

import errno
import os
import tempfile
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
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise write_error(exc, path) from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_error(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` (a write error that names no file, such as a full disk or a quota) as an
    ``OSError`` naming ``path``, what was being written, and the fix where there is one."""
    fix = "; free space there or write elsewhere" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return OSError(exc.errno, f"{exc.strerror or exc}{fix}", str(path))


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

        if parts[2:] != ["sigint"]:
            os.kill(os.getpid(), signal.SIGKILL)
            return
        # Run the process's SIGINT handler here and now, where the test wants the Ctrl-C, not at
        # whatever later bytecode a self-sent signal would be handled; a process that ignores
        # SIGINT (a shell's background job) gets the signal and ignores it, as it would a Ctrl-C.
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, None)
        else:
            os.kill(os.getpid(), signal.SIGINT)
