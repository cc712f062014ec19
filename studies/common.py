"""The studies' one home for their plumbing: paths, git state, hashing, data manifests, the
command line a manifest records and the error exit.

* Paths: :data:`ROOT`, the repository root (``studies`` runs from a checkout: ``python -m studies``).
* Git: :func:`git_head`, :func:`git_state` (head, dirty code tree) and :func:`git_commit`
  (``head[+dirty]``, ``unknown`` outside a checkout). Only ``tl_directional/`` and ``studies/``
  count as dirty: the result pages a run rewrites do not make the code that wrote them dirty.
* Hashing and atomic writes: :func:`sha256_bytes` here; ``sha256_file``, ``atomic_write_bytes``
  and ``atomic_write_text`` are :mod:`tl_directional.io.atomic`'s and :mod:`tl_directional.io.records`'s (re-exported, loaded on first use).
* Data manifests (``docs/results/data/<stem>.manifest.json``): :func:`write_data` writes the data
  files and the manifest naming their sha256 (atomically, the manifest last);
  :func:`read_data_manifest` and :func:`checked_bytes` read them back, raising the caller's error
  class with a message that names the file and the fix.
* Errors: :func:`run_main` runs a script's ``main``; a user's mistake (``SystemExit("message")``,
  or the library's ``ValueError`` / ``TypeError`` / ``OSError``) prints one ``error: ...`` line
  and exits with status 2, through the CLI's one error path (:mod:`tl_directional.cli.errors`;
  ``TLD_TRACEBACK=1`` shows the traceback).
* Commands: :func:`invocation`, the command line that is running, as a manifest records it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["ROOT", "checked_bytes", "git_commit", "git_head", "git_state", "invocation", "model_manifest",
           "read_data_manifest", "refuse_dirty", "run_main", "sha256_bytes", "write_data", "write_pages"]

#: the code whose uncommitted changes make a run's data "dirty"
CODE_DIRS = ("tl_directional", "studies")


def __getattr__(name: str):
    # tl_directional (and torch) load on first use: the fetch scripts need neither
    if name in ("atomic_write_bytes", "atomic_write_text", "sha256_file"):
        from tl_directional.io import atomic, records

        return getattr(records if name == "sha256_file" else atomic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def invocation(fallback: str) -> str:
    """The command line that is running, as a run's manifest records it: ``python -m MODULE
    ARGS`` when a ``studies`` module runs as ``__main__`` (``python -m studies run NAME ...``,
    ``python -m studies.explore.NAME ...``), else ``fallback`` (a study's main called from Python,
    e.g. by the tests, whose ``sys.argv`` is not the study's)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", "") or ""
    if not name.startswith("studies"):
        return fallback
    return " ".join(["python -m " + name.removesuffix(".__main__"), *sys.argv[1:]])


def cache_root() -> Path:
    """Where studies keep what they can rebuild (corpora, training runs, generated items):
    ``$TL_DIRECTIONAL_CACHE``, else ``~/.cache/tl_directional``."""
    import os

    return Path(os.environ.get("TL_DIRECTIONAL_CACHE") or Path.home() / ".cache" / "tl_directional").expanduser()


def sha256_bytes(b: bytes) -> str:
    """Hex sha256 of ``b``."""
    return hashlib.sha256(b).hexdigest()


def git_head() -> str:
    """The short commit of ``HEAD`` ('' when git gives none)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def git_state(untracked: bool = True) -> tuple[str, bool]:
    """``(short HEAD, dirty)``: dirty when :data:`CODE_DIRS` have uncommitted changes (with
    ``untracked``, untracked files there count too)."""
    cmd = ["git", "status", "--porcelain"] + ([] if untracked else ["--untracked-files=no"]) + ["--", *CODE_DIRS]
    dirty = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return git_head(), bool(dirty)


def refuse_dirty(dirty: bool, allow_dirty: bool) -> int | None:
    """Exit status 2 (after one ``error:`` line) when a measuring run would write data from a
    dirty tree without ``--allow-dirty``; ``None`` when it may go on. Data must name the commit
    of the code that made it."""
    if dirty and not allow_dirty:
        print("error: tl_directional/ or studies/ has uncommitted changes; commit them first (data must name "
              "the code that made it)", file=sys.stderr)
        return 2
    return None


def git_commit() -> str:
    """``HEAD[+dirty]`` for a result's meta JSON (tracked files only), ``unknown`` without git."""
    try:
        subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, check=True, cwd=ROOT)
        head, dirty = git_state(untracked=False)
        return head + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"


def model_manifest(name: str) -> dict:
    """The manifest of catalogue model ``name``'s converted directory in the cache
    (:data:`tl_directional.model.load.catalog.MANIFEST_FILE`), ``{}`` when it is not converted."""
    from tl_directional.io.records import read_manifest
    from tl_directional.model.load.catalog import MANIFEST_FILE, entry_dir

    return read_manifest(entry_dir(name), name=MANIFEST_FILE, strict=False) or {}


def write_data(data: Path, files: dict[str, bytes], manifest: dict, manifest_name: str) -> None:
    """Write each of ``files`` (name -> bytes) into ``data``, record its sha256 in
    ``manifest["files"]``, then write ``manifest`` as ``data/manifest_name`` (indented JSON),
    every file atomically and the manifest last."""
    from tl_directional.io.atomic import atomic_write_bytes

    data.mkdir(parents=True, exist_ok=True)
    for name, b in files.items():
        atomic_write_bytes(data / name, b)
        manifest["files"][name] = sha256_bytes(b)
    atomic_write_bytes(data / manifest_name, (json.dumps(manifest, indent=1) + "\n").encode())


def read_data_manifest(path: Path, shown: str, error: type[Exception],
                       wording: str = "cannot read the manifest") -> dict:
    """The JSON manifest at ``path``; an unreadable one raises ``error`` naming ``shown`` (the
    path as the message gives it)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise error(f"{shown}: {wording} ({e})") from None


def checked_bytes(path: Path, want: str, shown: str, manifest_name: str, error: type[Exception]) -> bytes:
    """The bytes of a data file the manifest ``manifest_name`` lists with sha256 ``want``;
    raises ``error`` naming ``shown`` when it is missing or its sha256 differs."""
    if not path.is_file():
        raise error(f"{shown}: missing (named by {manifest_name}); restore it from git")
    b = path.read_bytes()
    if sha256_bytes(b) != want:
        raise error(f"{shown}: sha256 {sha256_bytes(b)[:12]} does not match the manifest's "
                    f"{want[:12]}: the file is corrupt or was edited; restore it from git or rerun")
    return b


def write_pages(pages: dict, check: bool, root: Path, command: str) -> int:
    """Write every built page (atomically), or with ``check`` compare each with the file on disk
    and fail (exit status 1), naming the pages that differ and ``command`` to rebuild them."""
    from tl_directional.io.atomic import atomic_write_text

    bad = []
    for path, text in pages.items():
        if check:
            if not path.is_file() or path.read_text() != text:
                bad.append(str(path.relative_to(root)))
        else:
            atomic_write_text(path, text)
            print(f"wrote {path.relative_to(root)}")
    if bad:
        print(
            "error: these pages differ from what the committed data builds (edited by hand, or data changed "
            f"without a rebuild): {', '.join(bad)}; run `{command}`",
            file=sys.stderr,
        )
        return 1
    return 0


def run_main(main: Callable[[], int | None]) -> None:
    """Run a script's ``main()`` and exit with its status; a user's mistake exits 2 with one
    ``error:`` line (no traceback), through :func:`tl_directional.cli.errors.report_user_error`."""
    from tl_directional.cli.errors import USER_ERRORS, UsageError, report_user_error

    try:
        rc = main()
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        text = e.code[len("error:"):].strip() if e.code.startswith("error:") else e.code
        sys.exit(report_user_error(UsageError(text)))
    except USER_ERRORS as e:
        sys.exit(report_user_error(e))
    sys.exit(rc if isinstance(rc, int) else 0)


def interval_verdict(stat: dict) -> str:
    """The paired-difference rule of protocol secs. 8, 10 and 15: **held** if the 95% interval
    (``ci95_low``, ``ci95_high``) lies below 0, **failed** if above 0, **not decided** otherwise."""
    if stat["ci95_high"] < 0:
        return "**held**"
    if stat["ci95_low"] > 0:
        return "**failed**"
    return "**not decided**"
