"""studies/data/build_pass_corpus.py's pure parts: text normalisation, the seeded split by document,
reading one unpacked package (globs, excludes, gzip), the pinned records' shape."""

from __future__ import annotations

import gzip
import json

from studies.data import build_pass_corpus as B


def test_normalise():
    assert B.normalise("a  \r\nb\r\n\r\n\r\n\r\nc \n\n") == "a\nb\n\nc"
    assert B.normalise("\n\n x\t\n") == "x"


def test_split_is_seeded_and_by_document():
    ids = [f"pkg:doc{i}" for i in range(4000)]
    val = [d for d in ids if B.in_validation(0, d, 0.02)]
    assert val == [d for d in ids if B.in_validation(0, d, 0.02)]  # deterministic
    assert 40 <= len(val) <= 120  # about 2% of 4000
    assert val != [d for d in ids if B.in_validation(1, d, 0.02)]  # the seed matters


def test_read_documents(tmp_path):
    doc = tmp_path / "usr" / "share" / "doc" / "p"
    (doc / "translations").mkdir(parents=True)
    (doc / "a.rst.txt").write_text("alpha\r\n")
    (doc / "translations" / "b.rst.txt").write_text("beta")
    (doc / "c.rst.txt.gz").write_bytes(gzip.compress(b"gamma  \n"))
    src = {"package": "p", "globs": ["usr/share/doc/p/**/*.rst.txt", "usr/share/doc/p/*.gz"],
           "exclude": ["/translations/"]}
    assert B.read_documents(src, tmp_path) == [("p:usr/share/doc/p/a.rst.txt", "alpha"),
                                               ("p:usr/share/doc/p/c.rst.txt.gz", "gamma")]


def test_pinned_records_name_every_source():
    sources = json.loads(B.SOURCES_JSON.read_text())["sources"]
    assert [s["package"] for s in sources] == [s["package"] for s in B.SOURCES]
    for s in sources:
        assert s["version"] and s["licence"] and len(s["deb_sha256"]) == 64 and len(s["copyright_sha256"]) == 64
    expected = json.loads(B.EXPECTED_JSON.read_text())
    assert expected["splits"]["train"]["tokens"] >= 8_000_000
    assert set(expected["sha256"]) == {"train.bin", "validation.bin", "tokenizer/tokenizer.json", "docs.json"}
