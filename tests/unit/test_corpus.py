"""Tests for tl_directional.io.corpus and studies/data/fetch_corpus.py (the whole-book KJV split)."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from tl_directional.io.corpus import (
    SPLITS,
    CorpusIntegrityError,
    chunk_text,
    heldout_info,
    heldout_paths,
    heldout_text,
    iter_text_chunks,
    load_split,
)
from tl_directional.io.records import sha256_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fetch():
    """``python -m studies.data.fetch_corpus`` as a module."""
    from studies.data import fetch_corpus

    return fetch_corpus


@pytest.fixture()
def fake_bible(tmp_path, fetch) -> Path:
    """An executable that prints `bible -f` style output for all 66 books (with one wrapped
    continuation line), so the script is testable without bible-kjv."""
    lines = []
    for abbrev, _, _, _ in fetch.BOOKS:
        for chapter in (1, 2):
            for verse in (1, 2, 3):
                lines.append(f"{abbrev}{chapter}:{verse} Text of {abbrev} {chapter} {verse}.")
    lines.insert(1, "   which wrapped onto a continuation line.")
    data = tmp_path / "bible.txt"
    data.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "fake-bible"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(data)!r}).read())\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


# ----------------------------------------------------------------------------------------------
# Shipped held-out slice
# ----------------------------------------------------------------------------------------------


def test_heldout_text_is_verified_and_from_test_books(fetch):
    text = heldout_text()
    info = heldout_info()
    text_path, _ = heldout_paths()
    assert sha256_file(text_path) == info["sha256"]
    assert len(text.encode("utf-8")) == info["bytes"] <= 400_000
    assert info["bytes"] > 100_000
    assert info["split"] == "test"
    assert info["books"] and set(info["books"]) <= set(fetch.TEST_BOOKS)
    # Ruth 1:1 opens the slice: test books come in canonical order.
    assert text.startswith("Now it came to pass in the days when the judges ruled")
    assert "\r" not in text and text.endswith("\n")


def test_corrupt_heldout_gives_a_clear_error(tmp_path):
    text_path, meta_path = heldout_paths()
    shutil.copy(meta_path, tmp_path / meta_path.name)
    data = bytearray(text_path.read_bytes())
    data[100] ^= 1
    (tmp_path / text_path.name).write_bytes(bytes(data))
    with pytest.raises(CorpusIntegrityError, match="corrupt") as err:
        heldout_text(tmp_path)
    assert isinstance(err.value, ValueError)
    assert "studies.data.fetch_corpus" in str(err.value) and "kjv_heldout.txt" in str(err.value)


def test_missing_heldout_gives_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="kjv_heldout.json"):
        heldout_text(tmp_path)


def test_heldout_rereads_a_replaced_file(tmp_path):
    text_path, meta_path = heldout_paths()
    shutil.copy(text_path, tmp_path / text_path.name)
    shutil.copy(meta_path, tmp_path / meta_path.name)
    assert heldout_text(tmp_path) == heldout_text()
    (tmp_path / text_path.name).write_text("tampered\n")
    with pytest.raises(CorpusIntegrityError):
        heldout_text(tmp_path)


# ----------------------------------------------------------------------------------------------
# The split (book lists are fixed in the script)
# ----------------------------------------------------------------------------------------------


def test_split_is_by_whole_books_and_disjoint(fetch):
    parts = {split: set(fetch.books_of(split)) for split in SPLITS}
    assert parts["validation"] == set(fetch.VALIDATION_BOOKS)
    assert parts["test"] == set(fetch.TEST_BOOKS)
    assert not parts["train"] & parts["validation"]
    assert not parts["train"] & parts["test"]
    assert not parts["validation"] & parts["test"]
    assert set().union(*parts.values()) == set(fetch.BOOK_NAMES)
    assert len(fetch.BOOK_NAMES) == 66
    # Both held-out splits mix testaments.
    testament = {name: t for _, name, t, _ in fetch.BOOKS}
    for split in ("validation", "test"):
        assert {testament[b] for b in parts[split]} == {"OT", "NT"}
    with pytest.raises(ValueError, match="book"):
        fetch.split_of("Maccabees")


def test_fetch_script_with_fake_bible(tmp_path, fetch, fake_bible):
    out, data_dir = tmp_path / "corpus", tmp_path / "data"
    rc = fetch.main(
        ["--out", str(out), "--bible", str(fake_bible), "--heldout-slice", str(data_dir)]
    )
    assert rc == 0
    manifest = json.loads((out / "SPLIT.json").read_text())
    for split in SPLITS:
        entry = manifest["splits"][split]
        assert entry["books"] == fetch.books_of(split)
        text = load_split(out, split)
        assert len(text.encode()) == entry["bytes"]
        # Whole books: every verse of each listed book is there, and no other book's.
        for abbrev, name, _, _ in fetch.BOOKS:
            present = f"Text of {abbrev} 2 3." in text
            assert present == (name in entry["books"]), (split, name)
        assert entry["n_verses"] == 6 * len(entry["books"])
    train = load_split(out, "train")
    assert train.startswith("Text of Ge 1 1. which wrapped onto a continuation line.\n")
    assert not any(line[:3].strip().isdigit() and ":" in line[:8] for line in train.splitlines())
    # Held-out slice: the test split (small enough to fit whole), checksummed.
    meta = json.loads((data_dir / "kjv_heldout.json").read_text())
    assert meta["books"] == fetch.books_of("test") and meta["complete"]
    assert heldout_text(data_dir) == load_split(out, "test")
    # Deterministic: a second run writes identical bytes, and leaves no temp files.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert fetch.main(["--out", str(out), "--bible", str(fake_bible)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_heldout_slice_cuts_at_line_ends(tmp_path, fetch, fake_bible):
    data_dir = tmp_path / "data"
    argv = ["--out", str(tmp_path / "c"), "--bible", str(fake_bible)]
    assert fetch.main([*argv, "--heldout-slice", str(data_dir), "--heldout-bytes", "200"]) == 0
    text = heldout_text(data_dir)
    assert 0 < len(text.encode()) <= 200 and text.endswith(".\n")
    meta = heldout_info(data_dir)
    assert not meta["complete"] and meta["books"] == fetch.books_of("test")[: len(meta["books"])]


def test_missing_bible_command_says_how_to_install(tmp_path, fetch, capsys):
    rc = fetch.main(["--out", str(tmp_path), "--bible", str(tmp_path / "no-such-bible")])
    assert rc == 1
    assert "apt-get install bible-kjv" in capsys.readouterr().err


def test_parse_rejects_unknown_books(fetch):
    with pytest.raises(fetch.CorpusFetchError, match="abbreviation"):
        fetch.parse_bible_output("Xyz1:1 Not a book.\n")
    with pytest.raises(fetch.CorpusFetchError, match="66 books"):
        fetch.parse_bible_output("Ge1:1 Only Genesis.\n")


@pytest.mark.skipif(shutil.which("bible") is None, reason="needs `apt-get install bible-kjv`")
def test_real_bible_reproduces_the_shipped_slice(tmp_path, fetch):
    data_dir = tmp_path / "data"
    assert fetch.main(["--out", str(tmp_path / "c"), "--heldout-slice", str(data_dir)]) == 0
    assert heldout_info(data_dir)["sha256"] == heldout_info()["sha256"]
    fractions = json.loads((tmp_path / "c" / "SPLIT.json").read_text())["splits"]
    for split in ("validation", "test"):
        assert 0.04 < fractions[split]["fraction"] < 0.06


# ----------------------------------------------------------------------------------------------
# load_split errors
# ----------------------------------------------------------------------------------------------


def test_load_split_errors(tmp_path, fetch, fake_bible):
    with pytest.raises(ValueError, match="split"):
        load_split(tmp_path, "dev")
    with pytest.raises(FileNotFoundError, match="studies.data.fetch_corpus"):
        load_split(tmp_path / "nowhere", "train")
    with pytest.raises(FileNotFoundError, match="SPLIT.json"):
        load_split(tmp_path, "train")
    out = tmp_path / "corpus"
    assert fetch.main(["--out", str(out), "--bible", str(fake_bible)]) == 0
    with open(out / "validation.txt", "a") as f:
        f.write("extra\n")
    with pytest.raises(CorpusIntegrityError, match="validation.txt") as err:
        load_split(out, "validation")
    assert "studies.data.fetch_corpus --out" in str(err.value)
    (out / "test.txt").unlink()
    with pytest.raises(FileNotFoundError, match="test.txt"):
        load_split(out, "test")


# ----------------------------------------------------------------------------------------------
# Chunking
# ----------------------------------------------------------------------------------------------


def test_chunk_text_packs_whole_lines():
    lines = [f"verse number {i} " + "x" * (i % 7 + 1) for i in range(50)]
    text = "\n".join(lines) + "\n"
    chunks = chunk_text(text, 60)
    assert all(0 < len(c) <= 60 for c in chunks)
    assert "\n".join(chunks) == text.rstrip("\n")
    assert list(iter_text_chunks(text, 60)) == chunks
    # Greedy: no two neighbours could have been merged.
    assert all(
        len(a) + 1 + len(b.split("\n")[0]) > 60
        for a, b in zip(chunks[:-1], chunks[1:], strict=True)
    )


def test_chunk_text_skips_blank_lines_and_splits_long_lines():
    text = "short\n\n\n" + "word " * 30 + "\n" + "y" * 25 + "\n"
    chunks = chunk_text(text, 20)
    assert all(0 < len(c) <= 20 for c in chunks)
    assert "" not in chunks and chunks[0].startswith("short")
    assert "".join(chunks).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(
        " ", ""
    )


def test_chunk_text_on_heldout():
    chunks = chunk_text(heldout_text(), 2000)
    assert 100 < len(chunks) < 200 and max(map(len, chunks)) <= 2000


def test_chunk_text_rejects_bad_input():
    with pytest.raises(ValueError, match="n_chars"):
        chunk_text("abc", 0)
    with pytest.raises(TypeError, match="text"):
        chunk_text(b"abc", 10)
