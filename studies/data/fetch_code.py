"""Build the third held-out text, ``code``: Python source from CPython 3.11's standard library
(``difflib``, ``fractions``, ``textwrap``; PSF License 2.0, redistributable with its notice),
concatenated verbatim with one header line per file. A different kind of text from the KJV and
prose slices (code, identifiers, indentation).

    python -m studies.data.fetch_code            # write tl_directional/data/code_heldout.txt + .json
    python -m studies.data.fetch_code --check    # compare with the pinned sha256 only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies import common

ROOT = common.ROOT
FILES = ("difflib.py", "fractions.py", "textwrap.py")
OUT = ROOT / "tl_directional" / "data" / "code_heldout.txt"
PINNED = ROOT / "tl_directional" / "data" / "code_heldout.json"


def build(libdir: Path) -> str:
    parts = []
    for name in FILES:
        path = libdir / name
        if not path.is_file():
            raise SystemExit(f"error: {path} not found; pass --libdir with CPython 3.11's Lib directory")
        parts.append(f"# ---- file: Lib/{name} (CPython 3.11, PSF-2.0) ----\n" + path.read_text())
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libdir", default="/usr/lib/python3.11")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = build(Path(args.libdir))
    sha = common.sha256_bytes(text.encode())
    if args.check:
        want = json.loads(PINNED.read_text())["sha256"]
        print("ok" if sha == want else f"mismatch: {sha} != {want}")
        return 0 if sha == want else 1
    OUT.write_text(text)
    PINNED.write_text(json.dumps({"source": {"package": "CPython 3.11 standard library (Debian python3.11)",
                                             "files": [f"Lib/{n}" for n in FILES]},
                                  "license": "PSF-2.0 (Python Software Foundation License Version 2)",
                                  "sha256": sha, "bytes": len(text.encode())}, indent=2) + "\n")
    print(f"wrote {OUT} ({len(text)} chars, sha256 {sha})")
    return 0


if __name__ == "__main__":
    common.run_main(main)
