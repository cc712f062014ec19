#!/usr/bin/env python3
"""Fetch the King James Bible from Debian's ``bible-kjv`` and split it by whole books.

Usage::

    python -m studies.data.fetch_corpus --out DIR [--heldout-slice tl_directional/data]

Writes into ``DIR``:

* ``train.txt``, ``validation.txt``, ``test.txt``: the text of each split. Books appear in canonical
  order; within a book one verse per line (verse labels such as ``Ge1:1`` stripped); books are
  separated by one blank line.
* ``SPLIT.json``: per split the file name, book list, verse count, byte count and sha256.

With ``--heldout-slice DATA_DIR`` it also writes the package's shipped held-out text,
``DATA_DIR/kjv_heldout.txt`` (the test split, cut at a verse boundary to at most
``--heldout-bytes`` bytes) and ``DATA_DIR/kjv_heldout.json`` (source, books, sha256).

The split is fixed and deterministic: whole books, listed in ``VALIDATION_BOOKS`` and
``TEST_BOOKS`` below, each about 5% of the text and each mixing Old and New Testament books of
several genres. Every file is written atomically (temp file in the same directory, then rename),
so an interrupted run never leaves a half-written file behind.

The script needs only the Python standard library and the ``bible`` command
(``apt-get install bible-kjv``); it deliberately does not import ``tl_directional``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from studies import common

# (abbreviation printed by `bible`, full name, testament, genre), in canonical order.
BOOKS: tuple[tuple[str, str, str, str], ...] = (
    ("Ge", "Genesis", "OT", "law"),
    ("Exo", "Exodus", "OT", "law"),
    ("Lev", "Leviticus", "OT", "law"),
    ("Num", "Numbers", "OT", "law"),
    ("Deu", "Deuteronomy", "OT", "law"),
    ("Josh", "Joshua", "OT", "history"),
    ("Jdgs", "Judges", "OT", "history"),
    ("Ruth", "Ruth", "OT", "history"),
    ("1Sm", "1 Samuel", "OT", "history"),
    ("2Sm", "2 Samuel", "OT", "history"),
    ("1Ki", "1 Kings", "OT", "history"),
    ("2Ki", "2 Kings", "OT", "history"),
    ("1Chr", "1 Chronicles", "OT", "history"),
    ("2Chr", "2 Chronicles", "OT", "history"),
    ("Ezra", "Ezra", "OT", "history"),
    ("Neh", "Nehemiah", "OT", "history"),
    ("Est", "Esther", "OT", "history"),
    ("Job", "Job", "OT", "wisdom"),
    ("Psa", "Psalms", "OT", "wisdom"),
    ("Prv", "Proverbs", "OT", "wisdom"),
    ("Eccl", "Ecclesiastes", "OT", "wisdom"),
    ("SSol", "Song of Solomon", "OT", "wisdom"),
    ("Isa", "Isaiah", "OT", "major prophets"),
    ("Jer", "Jeremiah", "OT", "major prophets"),
    ("Lam", "Lamentations", "OT", "major prophets"),
    ("Eze", "Ezekiel", "OT", "major prophets"),
    ("Dan", "Daniel", "OT", "major prophets"),
    ("Hos", "Hosea", "OT", "minor prophets"),
    ("Joel", "Joel", "OT", "minor prophets"),
    ("Amos", "Amos", "OT", "minor prophets"),
    ("Obad", "Obadiah", "OT", "minor prophets"),
    ("Jonah", "Jonah", "OT", "minor prophets"),
    ("Mic", "Micah", "OT", "minor prophets"),
    ("Nahum", "Nahum", "OT", "minor prophets"),
    ("Hab", "Habakkuk", "OT", "minor prophets"),
    ("Zep", "Zephaniah", "OT", "minor prophets"),
    ("Hag", "Haggai", "OT", "minor prophets"),
    ("Zec", "Zechariah", "OT", "minor prophets"),
    ("Mal", "Malachi", "OT", "minor prophets"),
    ("Mat", "Matthew", "NT", "gospels"),
    ("Mark", "Mark", "NT", "gospels"),
    ("Luke", "Luke", "NT", "gospels"),
    ("John", "John", "NT", "gospels"),
    ("Acts", "Acts", "NT", "history"),
    ("Rom", "Romans", "NT", "pauline epistles"),
    ("1Cor", "1 Corinthians", "NT", "pauline epistles"),
    ("2Cor", "2 Corinthians", "NT", "pauline epistles"),
    ("Gal", "Galatians", "NT", "pauline epistles"),
    ("Eph", "Ephesians", "NT", "pauline epistles"),
    ("Phi", "Philippians", "NT", "pauline epistles"),
    ("Col", "Colossians", "NT", "pauline epistles"),
    ("1Th", "1 Thessalonians", "NT", "pauline epistles"),
    ("2Th", "2 Thessalonians", "NT", "pauline epistles"),
    ("1Tim", "1 Timothy", "NT", "pauline epistles"),
    ("2Tim", "2 Timothy", "NT", "pauline epistles"),
    ("Titus", "Titus", "NT", "pauline epistles"),
    ("Phmn", "Philemon", "NT", "pauline epistles"),
    ("Heb", "Hebrews", "NT", "general epistles"),
    ("Jas", "James", "NT", "general epistles"),
    ("1Pet", "1 Peter", "NT", "general epistles"),
    ("2Pet", "2 Peter", "NT", "general epistles"),
    ("1Jn", "1 John", "NT", "general epistles"),
    ("2Jn", "2 John", "NT", "general epistles"),
    ("3Jn", "3 John", "NT", "general epistles"),
    ("Jude", "Jude", "NT", "general epistles"),
    ("Rev", "Revelation", "NT", "apocalyptic"),
)
BOOK_NAMES: tuple[str, ...] = tuple(name for _, name, _, _ in BOOKS)
ABBREV_TO_NAME: dict[str, str] = {abbrev: name for abbrev, name, _, _ in BOOKS}

# The fixed split. Sizes (bytes of stripped text, bible-kjv 4.x): validation ~212 KB (5.1%),
# test ~206 KB (5.0%), train ~3.72 MB (89.9%). Each mixes OT and NT and several genres.
VALIDATION_BOOKS: tuple[str, ...] = (
    "Esther",  # OT history
    "Ecclesiastes",  # OT wisdom
    "Lamentations",  # OT poetry / major prophets
    "Jonah",  # OT minor prophet (narrative)
    "Galatians",  # NT Pauline epistle
    "Hebrews",  # NT general epistle
    "1 Peter",  # NT general epistle
    "Revelation",  # NT apocalyptic
)
TEST_BOOKS: tuple[str, ...] = (
    "Ruth",  # OT history (narrative)
    "Proverbs",  # OT wisdom
    "Amos",  # OT minor prophet
    "Mark",  # NT gospel
    "James",  # NT general epistle
)
SPLITS: tuple[str, ...] = ("train", "validation", "test")

BIBLE_RANGE = "Gen1:1-Rev22:21"
DEFAULT_HELDOUT_BYTES = 300_000
HELDOUT_NAME = "kjv_heldout"

# A verse line: book abbreviation (optionally with a leading 1-3), chapter:verse, space, text.
_VERSE_RE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


class CorpusFetchError(RuntimeError):
    """The ``bible`` command is missing or printed something this script cannot parse."""


def split_of(book: str) -> str:
    """The split (``"train"``, ``"validation"`` or ``"test"``) that a full book name belongs to."""
    if book not in BOOK_NAMES:
        raise ValueError(f"book must be one of the 66 KJV book names, got {book!r}.")
    if book in VALIDATION_BOOKS:
        return "validation"
    if book in TEST_BOOKS:
        return "test"
    return "train"


def books_of(split: str) -> list[str]:
    """The books of ``split`` in canonical order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    return [b for b in BOOK_NAMES if split_of(b) == split]


def run_bible(bible: str = "bible", verse_range: str = BIBLE_RANGE) -> str:
    """Run ``bible -f RANGE`` and return its standard output.

    Raises:
        CorpusFetchError: ``bible`` is not installed or fails.
    """
    exe = shutil.which(bible)
    if exe is None:
        raise CorpusFetchError(
            f"the {bible!r} command was not found. Install the King James text with "
            "`apt-get install bible-kjv` (Debian/Ubuntu), or pass --bible PATH."
        )
    # A very wide COLUMNS so `bible -f` never wraps a verse onto continuation lines (they are
    # handled anyway); LC_ALL=C for byte-stable output.
    env = {**os.environ, "COLUMNS": "100000", "LC_ALL": "C"}
    proc = subprocess.run([exe, "-f", verse_range], capture_output=True, env=env, check=False)
    if proc.returncode != 0:
        raise CorpusFetchError(
            f"`{exe} -f {verse_range}` failed with exit code {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout.decode("utf-8")


def parse_bible_output(raw: str) -> dict[str, list[str]]:
    """Parse ``bible -f`` output into ``{full book name: [verse text, ...]}``.

    Lines look like ``Ge1:1 In the beginning ...`` (abbreviations such as ``Ge``, ``1Sm``,
    ``SSol``, ``Phmn``). A non-empty line without a label continues the previous verse (the
    wrapped form of long verses); runs of spaces are collapsed to one.

    Raises:
        CorpusFetchError: an unknown book abbreviation, text before the first label, or books
            missing / out of canonical order.
    """
    books: dict[str, list[str]] = {}
    current: list[str] | None = None
    for lineno, line in enumerate(raw.splitlines(), start=1):
        line = line.rstrip()
        if not line.strip():
            continue
        m = _VERSE_RE.match(line)
        if m is None:
            if current is None or not current:
                raise CorpusFetchError(f"line {lineno}: text before the first verse: {line!r}")
            current[-1] = f"{current[-1]} {line.strip()}"
            continue
        abbrev, text = m.group(1), m.group(4)
        name = ABBREV_TO_NAME.get(abbrev)
        if name is None:
            raise CorpusFetchError(f"line {lineno}: unknown book abbreviation {abbrev!r}")
        current = books.setdefault(name, [])
        current.append(text.strip())
    books = {name: [" ".join(v.split()) for v in verses] for name, verses in books.items()}
    if list(books) != list(BOOK_NAMES):
        missing = [b for b in BOOK_NAMES if b not in books]
        raise CorpusFetchError(
            f"expected all 66 books in canonical order; missing {missing}, got {list(books)[:5]}..."
        )
    return books


def render(books: dict[str, list[str]], names: Sequence[str]) -> str:
    """Text of ``names``: one verse a line, a blank line between books, final newline."""
    return "\n\n".join("\n".join(books[name]) for name in names) + "\n"


def heldout_slice(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` that ends at a line end and is at most ``max_bytes`` UTF-8
    bytes long (a blank book separator at the cut is dropped)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}.")
    out: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode("utf-8"))
        if size + n > max_bytes:
            break
        out.append(line)
        size += n
    while out and out[-1] == "\n":
        out.pop()
    if not out:
        raise ValueError(f"max_bytes={max_bytes} is smaller than the first line.")
    return "".join(out)


sha256_bytes = common.sha256_bytes


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`tl_directional.io.atomic.atomic_write_bytes`)."""
    common.atomic_write_bytes(path, data)


def _json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def bible_kjv_version() -> str | None:
    """Installed ``bible-kjv`` package version (from dpkg), or None when unknown."""
    if shutil.which("dpkg-query") is None:
        return None
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "bible-kjv"], capture_output=True, check=False
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().strip() or None


def write_corpus(books: dict[str, list[str]], out: Path, *, source: dict) -> dict:
    """Write the three split files and ``SPLIT.json`` into ``out``; return the manifest."""
    manifest: dict = {
        "source": source,
        "format": "one verse per line, verse labels stripped; a blank line between books; "
        "books in canonical order; UTF-8",
        "split_rule": "whole books; validation and test are fixed book lists (~5% each)",
        "splits": {},
    }
    total = 0
    for split in SPLITS:
        names = books_of(split)
        data = render(books, names).encode("utf-8")
        write_atomic(out / f"{split}.txt", data)
        manifest["splits"][split] = {
            "file": f"{split}.txt",
            "books": names,
            "n_verses": sum(len(books[n]) for n in names),
            "bytes": len(data),
            "sha256": sha256_bytes(data),
        }
        total += len(data)
    for split in SPLITS:
        entry = manifest["splits"][split]
        entry["fraction"] = round(entry["bytes"] / total, 4)
    write_atomic(out / "SPLIT.json", _json_bytes(manifest))
    return manifest


def write_heldout(
    books: dict[str, list[str]], data_dir: Path, *, max_bytes: int, source: dict
) -> dict:
    """Write ``kjv_heldout.txt`` / ``kjv_heldout.json`` (test-split slice) into ``data_dir``."""
    full = render(books, books_of("test"))
    text = heldout_slice(full, max_bytes)
    data = text.encode("utf-8")
    # Books whose text starts inside the slice (the last one may be cut at a verse boundary).
    covered: list[str] = []
    offset = 0
    for name in books_of("test"):
        if offset >= len(text):
            break
        covered.append(name)
        offset += len("\n".join(books[name])) + 2  # the book's last newline + the blank line
    meta = {
        "source": source,
        "split": "test",
        "books": covered,
        "complete": text == full,
        "max_bytes": max_bytes,
        "bytes": len(data),
        "n_lines": text.count("\n"),
        "sha256": sha256_bytes(data),
        "file": f"{HELDOUT_NAME}.txt",
        "regenerate": "python scripts/fetch_corpus.py --out DIR --heldout-slice tl_directional/data",
    }
    write_atomic(data_dir / f"{HELDOUT_NAME}.txt", data)
    write_atomic(data_dir / f"{HELDOUT_NAME}.json", _json_bytes(meta))
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fetch the KJV text (Debian bible-kjv) and split it by whole books."
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument(
        "--heldout-slice",
        type=Path,
        default=None,
        metavar="DATA_DIR",
        help="also write kjv_heldout.txt/.json (a slice of the test split) into DATA_DIR, "
        "e.g. tl_directional/data",
    )
    parser.add_argument(
        "--heldout-bytes",
        type=int,
        default=DEFAULT_HELDOUT_BYTES,
        help=f"maximum size of the held-out slice in bytes (default {DEFAULT_HELDOUT_BYTES})",
    )
    parser.add_argument("--bible", default="bible", help="the bible command (default: bible)")
    args = parser.parse_args(argv)
    if args.heldout_bytes <= 0:
        parser.error("--heldout-bytes must be positive")

    try:
        raw = run_bible(args.bible)
        books = parse_bible_output(raw)
    except CorpusFetchError as err:
        print(f"fetch_corpus: error: {err}", file=sys.stderr)
        return 1
    source = {
        "package": "bible-kjv (Debian)",
        "package_version": bible_kjv_version(),
        "command": f"bible -f {BIBLE_RANGE}",
        "text": "King James Version (public domain)",
        "raw_sha256": sha256_bytes(raw.encode("utf-8")),
    }
    manifest = write_corpus(books, args.out, source=source)
    for split, entry in manifest["splits"].items():
        print(
            f"{split:>10}: {len(entry['books']):2d} books, {entry['n_verses']:5d} verses, "
            f"{entry['bytes']:8d} bytes ({100 * entry['fraction']:.1f}%)"
        )
    if args.heldout_slice is not None:
        meta = write_heldout(books, args.heldout_slice, max_bytes=args.heldout_bytes, source=source)
        print(f"   heldout: {meta['bytes']} bytes, books {meta['books']} -> {args.heldout_slice}")
    return 0


if __name__ == "__main__":
    common.run_main(main)
