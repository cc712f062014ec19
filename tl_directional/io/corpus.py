"""Text corpora for tl-directional: the shipped held-out KJV slice and the fetched KJV splits.

* :func:`heldout_text` returns ``tl_directional/data/kjv_heldout.txt``, a ~200 KB slice of the
  King James Bible's *test* split (Ruth, Proverbs, Amos, Mark, James) that ships inside the
  package, so tests and the demo need neither network nor ``apt``. Its sha256 is checked
  against ``kjv_heldout.json`` on every (cached) read.
* :func:`load_split` reads a split written by ``studies/data/fetch_corpus.py --out DIR`` (which needs
  Debian's ``bible-kjv``), checking it against ``DIR/SPLIT.json``.
* :func:`chunk_text` / :func:`iter_text_chunks` cut text into documents of at most ``n_chars``
  characters at line boundaries, ready to tokenize as a batch.

All text is one verse a line with a blank line between books.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.errors import TLDirectionalError

#: The three splits that ``studies/data/fetch_corpus.py`` writes.
SPLITS: tuple[str, ...] = ("train", "validation", "test")

HELDOUT_TEXT_FILE = "kjv_heldout.txt"
HELDOUT_META_FILE = "kjv_heldout.json"

_REGENERATE_HELDOUT = (
    "Reinstall tl-directional, or regenerate the file with "
    "`python -m studies.data.fetch_corpus --out DIR --heldout-slice tl_directional/data` "
    "(needs `apt-get install bible-kjv`)."
)
_REGENERATE_SPLIT = (
    "Regenerate the corpus with `python -m studies.data.fetch_corpus --out {dir}` "
    "(needs `apt-get install bible-kjv`)."
)


class CorpusIntegrityError(TLDirectionalError, ValueError):
    """A corpus file does not match the sha256 recorded in its manifest."""


def _read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} is missing. {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorpusIntegrityError(f"{what} {path} is not valid JSON ({err}). {fix}") from None
    if not isinstance(data, dict):
        raise CorpusIntegrityError(f"{what} {path} is not a JSON object. {fix}")
    return data


def _read_verified(path: Path, expected_sha256: str, fix: str) -> str:
    """Read ``path`` as UTF-8 after checking its sha256 against ``expected_sha256``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"corpus file {path} is missing. {fix}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise CorpusIntegrityError(
            f"corpus file {path} is corrupt or was modified: sha256 {actual} does not match "
            f"the recorded {expected_sha256}. {fix}"
        )
    return data.decode("utf-8")


def heldout_paths(data_dir: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """Paths of the held-out text and its JSON manifest.

    Args:
        data_dir: Directory holding ``kjv_heldout.txt`` and ``kjv_heldout.json``; default the
            package's ``tl_directional/data``.
    """
    if data_dir is None:
        # as_file is unnecessary: the package is installed from a directory (no zip imports).
        base = Path(str(resources.files("tl_directional") / "data"))
    else:
        base = Path(data_dir)
    return base / HELDOUT_TEXT_FILE, base / HELDOUT_META_FILE


def heldout_text(data_dir: str | os.PathLike[str] | None = None) -> str:
    """The shipped held-out KJV slice (test-split books), checksum-verified.

    Args:
        data_dir: Read ``kjv_heldout.txt`` / ``.json`` from this directory instead of the
            package data (used by tests and by anyone regenerating the slice).

    Returns:
        The text (~200 KB, one verse a line, a blank line between books, final newline).

    Raises:
        CorpusIntegrityError: (a ``ValueError``) the file's sha256 does not match the manifest.
        FileNotFoundError: the file or its manifest is missing.
    """
    text_path, meta_path = heldout_paths(data_dir)
    return _heldout_cached(str(text_path), str(meta_path), *_stat_key(text_path))


def _stat_key(path: Path) -> tuple[int, int]:
    # Cache keyed on size and mtime so a file replaced on disk is re-verified.
    try:
        st = path.stat()
    except FileNotFoundError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _heldout_cached(text_path: str, meta_path: str, _size: int, _mtime: int) -> str:
    meta = _read_json(Path(meta_path), "held-out manifest", _REGENERATE_HELDOUT)
    expected = meta.get("sha256")
    if not isinstance(expected, str):
        raise CorpusIntegrityError(
            f"held-out manifest {meta_path} has no 'sha256' entry. {_REGENERATE_HELDOUT}"
        )
    return _read_verified(Path(text_path), expected, _REGENERATE_HELDOUT)


def heldout_info(data_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The held-out manifest (``source``, ``books``, ``bytes``, ``sha256``, ...)."""
    _, meta_path = heldout_paths(data_dir)
    return _read_json(meta_path, "held-out manifest", _REGENERATE_HELDOUT)


PROSE_TEXT_FILE = "prose_heldout.txt"
PROSE_META_FILE = "prose_heldout.json"
_REGENERATE_PROSE = (
    "Reinstall tl-directional, or regenerate the file with "
    "`python -m studies.data.fetch_prose --out tl_directional/data` (needs `apt-get install debian-reference-en`)."
)


def prose_heldout_text(data_dir: str | os.PathLike[str] | None = None) -> str:
    """The shipped held-out slice of modern English prose (Debian Reference, GPL-2+), checksum-verified.

    About 160 KB of whole paragraphs (one a line, a blank line between chapters) written by
    ``studies/data/fetch_prose.py``; ``prose_heldout.json`` records source, version, license,
    copyright notice and sha256.

    Args:
        data_dir: Read the files from this directory instead of the package data.
    """
    base = heldout_paths(data_dir)[0].parent
    text_path, meta_path = base / PROSE_TEXT_FILE, base / PROSE_META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"prose manifest {meta_path} is missing. {_REGENERATE_PROSE}")
    meta = _read_json(meta_path, "prose manifest", _REGENERATE_PROSE)
    expected = meta.get("sha256")
    if not isinstance(expected, str):
        raise CorpusIntegrityError(f"prose manifest {meta_path} has no 'sha256' entry. {_REGENERATE_PROSE}")
    return _read_verified(text_path, expected, _REGENERATE_PROSE)


def split_manifest(corpus_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``SPLIT.json`` of a corpus directory written by ``studies/data/fetch_corpus.py``."""
    corpus_dir = Path(corpus_dir)
    fix = _REGENERATE_SPLIT.format(dir=corpus_dir)
    manifest = _read_json(corpus_dir / "SPLIT.json", "split manifest", fix)
    if not isinstance(manifest.get("splits"), dict):
        raise CorpusIntegrityError(
            f"split manifest {corpus_dir / 'SPLIT.json'} has no 'splits' table. {fix}"
        )
    return manifest


def load_split(corpus_dir: str | os.PathLike[str], split: str) -> str:
    """Read one split of a fetched corpus, verifying its sha256 against ``SPLIT.json``.

    Args:
        corpus_dir: The ``--out`` directory of ``studies/data/fetch_corpus.py``.
        split: ``"train"``, ``"validation"`` or ``"test"``.

    Returns:
        The split's text.

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: ``corpus_dir``, ``SPLIT.json`` or the split file is missing (the
            message says how to regenerate them).
        CorpusIntegrityError: (a ``ValueError``) the file does not match its recorded sha256.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    if not isinstance(corpus_dir, (str, os.PathLike)):
        raise TypeError(f"corpus_dir must be a str or os.PathLike, got {corpus_dir!r}.")
    corpus_dir = Path(corpus_dir)
    fix = _REGENERATE_SPLIT.format(dir=corpus_dir)
    if not corpus_dir.is_dir():
        raise FileNotFoundError(f"corpus directory {corpus_dir} does not exist. {fix}")
    entry = split_manifest(corpus_dir)["splits"].get(split)
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise CorpusIntegrityError(
            f"split manifest {corpus_dir / 'SPLIT.json'} has no sha256 for split {split!r}. {fix}"
        )
    return _read_verified(corpus_dir / entry.get("file", f"{split}.txt"), entry["sha256"], fix)


def iter_text_chunks(text: str, n_chars: int) -> Iterator[str]:
    """Yield documents of at most ``n_chars`` characters, cut at line boundaries.

    Consecutive lines are packed greedily into one document (joined by ``"\\n"``, no trailing
    newline, trailing spaces of each line dropped). Blank lines (the book separators) are
    skipped, so a document may span two books. A single line longer than ``n_chars`` is cut at
    its last space before the limit (or hard, when it has none), so every document fits.

    When no line is longer than ``n_chars`` and the text has no blank lines,
    ``"\\n".join(chunks) == text.rstrip("\\n")``.

    Args:
        text: The text to split.
        n_chars: Maximum document length in characters (> 0).

    Yields:
        Non-empty documents, in order.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}.")
    if isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars <= 0:
        raise ValueError(f"n_chars must be a positive int, got {n_chars!r}.")
    buf: list[str] = []
    size = 0  # characters in "\n".join(buf)
    for raw_line in text.splitlines():
        line = raw_line.rstrip()
        if not line:
            continue
        for piece in _split_long_line(line, n_chars):
            extra = len(piece) + (1 if buf else 0)
            if buf and size + extra > n_chars:
                yield "\n".join(buf)
                buf, size = [], 0
                extra = len(piece)
            buf.append(piece)
            size += extra
    if buf:
        yield "\n".join(buf)


def _split_long_line(line: str, n_chars: int) -> Iterator[str]:
    while len(line) > n_chars:
        cut = line.rfind(" ", 1, n_chars + 1)
        if cut <= 0:
            cut = n_chars
        yield line[:cut].rstrip()
        line = line[cut:].lstrip()
    if line:
        yield line


def chunk_text(text: str, n_chars: int) -> list[str]:
    """``list(iter_text_chunks(text, n_chars))``: documents of at most ``n_chars`` characters."""
    return list(iter_text_chunks(text, n_chars))


__all__ = [
    "SPLITS",
    "CorpusIntegrityError",
    "chunk_text",
    "heldout_info",
    "heldout_paths",
    "heldout_text",
    "iter_text_chunks",
    "load_split",
    "prose_heldout_text",
    "split_manifest",
]
