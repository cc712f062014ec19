"""Build ``pass8m``: a deduplicated, offline, redistributable corpus of about 12M training tokens
for a single training pass (docs/results/protocol.md sec. 10), tokenised once.

Sources: the English documentation *sources* shipped in four Debian packages (fetched with
``apt-get download PACKAGE=VERSION``, unpacked with ``dpkg-deb -x``, never installed), each file one
document:

* ``linux-doc-6.1``: the kernel's reStructuredText (``html/_sources/**/*.rst.txt``, translations
  excluded), GPL-2;
* ``python3.11-doc``: the Python 3.11 documentation (``html/_sources/**/*.rst.txt``), PSF-2.0;
* ``perl-doc``: the Perl 5.36 manual (``pod/*.pod``), GPL-1+ or Artistic;
* ``git-doc``: git's manual pages and guides (AsciiDoc ``*.txt``), GPL-2.

Steps, all deterministic for the pinned package versions and ``--seed``:

1. download each pinned ``.deb`` (cached in ``--debs``) and check its sha256 against
   ``docs/results/data/pass8m.sources.json`` (the committed record of package, version, licence,
   ``.deb`` and copyright-file sha256);
2. read the documents (UTF-8, CRLF to LF, trailing spaces and runs of blank lines trimmed), drop
   those under ``MIN_CHARS`` characters and every later copy of an identical text (document-level
   sha256);
3. split by document: a document is in validation when ``sha256("pass8m:SEED:" + doc_id)`` falls
   under ``--val-fraction`` (no validation text is seen in training); the training documents are
   put in a seeded order;
4. train the project's byte-level BPE (:func:`tl_directional.model.load.train_tokenizer`,
   ``--vocab-size`` tokens) on the training documents, encode every document once and write each
   split as one stream of uint16 token ids (little endian), documents joined by
   ``<|endoftext|>`` (id 0);
5. write ``OUT/{train.bin,validation.bin,tokenizer/,docs.json,tokens.json}`` (into a temporary
   folder renamed into place) and compare the output hashes with the committed
   ``docs/results/data/pass8m.expected.json``: a rebuild that differs fails.

    python -m studies.data.build_pass_corpus                      # build + verify (make pass-corpus); a no-op when
                                                             # OUT already matches; --force rebuilds
    python -m studies.data.build_pass_corpus --write-expected     # (maintainers) pin the hashes anew

``OUT`` defaults to ``$TL_DIRECTIONAL_CACHE/corpora/pass8m`` (``~/.cache/tl_directional`` when the
variable is unset). The tokens are never committed: this script rebuilds them. The training
side reads ``OUT`` through :func:`tl_directional.training.prepare_data` (``--corpus OUT``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from studies import common

ROOT = common.ROOT
NAME = "pass8m"
SOURCES_JSON = ROOT / "docs" / "results" / "data" / f"{NAME}.sources.json"
EXPECTED_JSON = ROOT / "docs" / "results" / "data" / f"{NAME}.expected.json"
MIN_CHARS = 256
DTYPE = "uint16"

#: (package, pinned version, licence, path globs inside the package, path substrings to exclude)
SOURCES: tuple[dict, ...] = (
    {"package": "linux-doc-6.1", "version": "6.1.192-3", "licence": "GPL-2 (Linux kernel documentation)",
     "globs": ["usr/share/doc/linux-doc-6.1/html/_sources/**/*.rst.txt"], "exclude": ["/translations/"]},
    {"package": "python3.11-doc", "version": "3.11.2-6+deb12u9", "licence": "PSF-2.0",
     "globs": ["usr/share/doc/python3.11/html/_sources/**/*.rst.txt"], "exclude": []},
    {"package": "perl-doc", "version": "5.36.0-7+deb12u4", "licence": "GPL-1+ or Artistic",
     "globs": ["usr/share/perl/5.36.0/pod/*.pod"], "exclude": []},
    {"package": "git-doc", "version": "1:2.39.5-0+deb12u3", "licence": "GPL-2",
     "globs": ["usr/share/doc/git-doc/*.txt"], "exclude": []},
)


def default_out() -> Path:
    return common.cache_root() / "corpora" / NAME


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_deb(src: dict, debs: Path) -> Path:
    """The pinned ``.deb`` of ``src`` in ``debs`` (downloaded with ``apt-get download`` when absent)."""
    debs.mkdir(parents=True, exist_ok=True)
    pattern = f"{src['package']}_{src['version'].replace(':', '%3a')}_*.deb"
    found = sorted(debs.glob(pattern))
    if not found:
        proc = subprocess.run(["apt-get", "download", f"{src['package']}={src['version']}"], cwd=debs,
                              capture_output=True, text=True, check=False)
        found = sorted(debs.glob(pattern))
        if proc.returncode != 0 or not found:
            raise SystemExit(
                f"error: `apt-get download {src['package']}={src['version']}` failed ({proc.stderr.strip()[-300:]}); "
                "run `apt-get update` first, or, if Debian no longer carries this version, fetch the same .deb "
                f"from a Debian snapshot into {debs} (its sha256 is checked)")
    return found[0]


def normalise(text: str) -> str:
    """CRLF to LF, trailing spaces removed, three or more newlines cut to two, outer blanks stripped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def read_documents(src: dict, root: Path) -> list[tuple[str, str]]:
    """``[(doc_id, text)]`` of one unpacked package, in sorted path order."""
    paths = sorted({p for g in src["globs"] for p in root.glob(g) if p.is_file()})
    docs = []
    for p in paths:
        rel = p.relative_to(root).as_posix()
        if any(x in "/" + rel for x in src["exclude"]):
            continue
        raw = p.read_bytes()
        if rel.endswith(".gz"):
            raw = gzip.decompress(raw)
        docs.append((f"{src['package']}:{rel}", normalise(raw.decode("utf-8", errors="replace"))))
    return docs


def in_validation(seed: int, doc_id: str, fraction: float) -> bool:
    h = hashlib.sha256(f"{NAME}:{seed}:{doc_id}".encode()).hexdigest()
    return int(h[:16], 16) / 2**64 < fraction


def collect(debs: Path, work: Path, pinned: dict | None) -> tuple[list[dict], list[tuple[str, str]]]:
    """Download, check and unpack every source; return (source records, documents in source order)."""
    records, docs = [], []
    for src in SOURCES:
        deb = fetch_deb(src, debs)
        deb_sha = sha256_file(deb)
        want = (pinned or {}).get(src["package"], {}).get("deb_sha256")
        if want is not None and want != deb_sha:
            raise SystemExit(f"error: {deb} has sha256 {deb_sha}, but {SOURCES_JSON.name} pins {want}; "
                             "delete the file and download the pinned version again")
        root = work / src["package"]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        copyright_files = sorted(root.glob("usr/share/doc/*/copyright"))
        own = [c for c in copyright_files if c.parent.name == src["package"]] or copyright_files
        got = read_documents(src, root)
        records.append({
            "package": src["package"], "version": src["version"], "licence": src["licence"],
            "deb": deb.name, "deb_sha256": deb_sha,
            "copyright_file": own[0].relative_to(root).as_posix() if own else None,
            "copyright_sha256": sha256_file(own[0]) if own else None,
            "globs": src["globs"], "exclude": src["exclude"], "files": len(got),
            "bytes": sum(len(t.encode()) for _, t in got),
        })
        docs += got
    return records, docs


def up_to_date(out: Path) -> bool:
    """Whether ``out`` already holds the corpus that ``EXPECTED_JSON`` pins (every file hashed)."""
    if not (EXPECTED_JSON.is_file() and (out / "tokens.json").is_file()):
        return False
    want = json.loads(EXPECTED_JSON.read_text())["sha256"]
    return all((out / name).is_file() and sha256_file(out / name) == sha for name, sha in want.items())


def build(out: Path, *, debs: Path, seed: int, vocab_size: int, val_fraction: float,
          write_expected: bool) -> dict:
    import numpy as np

    from tl_directional.model.load import ENDOFTEXT, train_tokenizer

    t0 = time.perf_counter()
    if not write_expected and up_to_date(out):
        print(f"{out}: up to date (every file's sha256 equals {EXPECTED_JSON.name}); --force rebuilds it")
        return json.loads(EXPECTED_JSON.read_text())
    pinned = None
    if SOURCES_JSON.is_file() and not write_expected:
        pinned = {s["package"]: s for s in json.loads(SOURCES_JSON.read_text())["sources"]}
    with tempfile.TemporaryDirectory(prefix="pass8m-unpack-") as tmp:
        records, docs = collect(debs, Path(tmp), pinned)
    seen: set[str] = set()
    kept: list[tuple[str, str, str]] = []
    short = dupes = 0
    for doc_id, text in docs:
        if len(text) < MIN_CHARS:
            short += 1
            continue
        h = hashlib.sha256(text.encode()).hexdigest()
        if h in seen:
            dupes += 1
            continue
        seen.add(h)
        kept.append((doc_id, text, h))
    val = [d for d in kept if in_validation(seed, d[0], val_fraction)]
    train = [d for d in kept if not in_validation(seed, d[0], val_fraction)]
    random.Random(seed).shuffle(train)
    print(f"{len(docs)} documents read, {short} under {MIN_CHARS} chars, {dupes} duplicates dropped; "
          f"{len(train)} train / {len(val)} validation documents", flush=True)

    tokenizer = train_tokenizer([t for _, t, _ in train], vocab_size)
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    backend = tokenizer.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()

    def stream(split_docs):
        ids: list[int] = []
        spans = []
        for enc, (doc_id, _text, h) in zip(backend.encode_batch([t for _, t, _ in split_docs],
                                                               add_special_tokens=False), split_docs, strict=True):
            spans.append({"id": doc_id, "sha256": h, "start": len(ids), "tokens": len(enc.ids)})
            ids += enc.ids
            ids.append(eot)
        return np.asarray(ids, dtype="<u2"), spans

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(stage, 0o755)  # mkdtemp makes 0700
    try:
        files = {}
        splits = {}
        for name, split_docs in (("train", train), ("validation", val)):
            arr, spans = stream(split_docs)
            (stage / f"{name}.bin").write_bytes(arr.tobytes())
            files[f"{name}.bin"] = sha256_file(stage / f"{name}.bin")
            splits[name] = {"file": f"{name}.bin", "documents": len(split_docs), "tokens": int(arr.size),
                            "bytes_text": sum(len(t.encode()) for _, t, _ in split_docs),
                            "sha256": files[f"{name}.bin"], "docs": spans}
        tokenizer.save_pretrained(str(stage / "tokenizer"))
        files["tokenizer/tokenizer.json"] = sha256_file(stage / "tokenizer" / "tokenizer.json")
        docs_doc = {name: s.pop("docs") for name, s in splits.items()}
        (stage / "docs.json").write_text(json.dumps(docs_doc, indent=0) + "\n")
        files["docs.json"] = sha256_file(stage / "docs.json")
        summary = {
            "name": NAME, "format": f"one stream of {DTYPE} little-endian token ids per split; documents "
            "joined by <|endoftext|>; read by tl_directional.training.prepare_data",
            "dtype": DTYPE, "eot_id": int(eot), "vocab_size": len(tokenizer), "seed": seed,
            "val_fraction": val_fraction, "min_chars": MIN_CHARS,
            "documents_read": len(docs), "documents_short": short, "documents_duplicate": dupes,
            "splits": splits, "sha256": files,
        }
        (stage / "tokens.json").write_text(json.dumps(summary, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.rename(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

    result = {k: summary[k] for k in ("name", "dtype", "eot_id", "vocab_size", "seed", "val_fraction",
                                      "documents_read", "documents_short", "documents_duplicate")}
    result["splits"] = {n: {k: v for k, v in s.items() if k != "file"} for n, s in splits.items()}
    result["sha256"] = files
    if write_expected:
        sources = {"name": NAME, "built_by": "scripts/build_pass_corpus.py",
                   "note": "Debian main packages (DFSG-free, redistributable); documentation sources only",
                   "sources": records}
        common.atomic_write_text(SOURCES_JSON, json.dumps(sources, indent=2) + "\n")
        common.atomic_write_text(EXPECTED_JSON, json.dumps(result, indent=2) + "\n")
        print(f"pinned {SOURCES_JSON.relative_to(ROOT)} and {EXPECTED_JSON.relative_to(ROOT)}")
    else:
        if not EXPECTED_JSON.is_file():
            raise SystemExit(f"error: {EXPECTED_JSON} is missing; pin it with --write-expected")
        want = json.loads(EXPECTED_JSON.read_text())
        if want != result:
            bad = sorted(k for k in set(want) | set(result) if want.get(k) != result.get(k))
            raise SystemExit(f"error: the rebuilt corpus in {out} differs from {EXPECTED_JSON.name} in {bad}: "
                             f"got sha256 {files}, expected {want.get('sha256')}")
        print(f"verified against {EXPECTED_JSON.relative_to(ROOT)}")
    print(f"{out}: train {splits['train']['tokens']:,} tokens ({splits['train']['documents']} documents), "
          f"validation {splits['validation']['tokens']:,} tokens ({splits['validation']['documents']} documents), "
          f"vocab {len(tokenizer)}, {time.perf_counter() - t0:.0f} s")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="default: $TL_DIRECTIONAL_CACHE/corpora/pass8m")
    ap.add_argument("--debs", type=Path, default=None, help="where the .deb files are kept (default: OUT/../debs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--val-fraction", type=float, default=0.02)
    ap.add_argument("--force", action="store_true", help="rebuild even when OUT already matches the expected hashes")
    ap.add_argument("--write-expected", action="store_true",
                    help="write the sources and expected-hash json files instead of checking against them")
    args = ap.parse_args(argv)
    out = args.out or default_out()
    if not 0 < args.val_fraction < 0.5:
        raise SystemExit(f"error: --val-fraction must be in (0, 0.5), got {args.val_fraction}")
    if args.vocab_size > 65536:
        raise SystemExit(f"error: --vocab-size {args.vocab_size} does not fit the uint16 token files (max 65536)")
    if args.force and out.exists():
        shutil.rmtree(out)
    build(out, debs=args.debs or out.parent / "debs", seed=args.seed, vocab_size=args.vocab_size,
          val_fraction=args.val_fraction, write_expected=args.write_expected)
    return 0


if __name__ == "__main__":
    common.run_main(main)
