"""Checksummed records on disk: manifests and sealed JSON.

- Manifests: an artefact directory lists the sha256 and size of each of its files in
  ``manifest.json``, written last; loaders verify it and name the failing file.
- Sealed JSON records: a record carries the sha256 of its own content.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .atomic import ArtefactError, atomic_write_text
from .locks import recover_interrupted_swap

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


def seal(obj: dict) -> dict:
    """``obj`` with its ``record_sha256`` added (for writers with their own JSON layout;
    :func:`sealed_json_loads` checks it)."""
    return {**obj, SEAL_KEY: _seal_of(obj)}
