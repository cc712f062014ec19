"""Extract a held-out slice of modern English prose from Debian's ``debian-reference-en``.

The Debian Reference (Osamu Aoki, GPL-2+) ships as HTML in
``/usr/share/debian-reference/``. This script reads its English chapters in a fixed
order, keeps the text of every ``<p>`` paragraph outside tables, tables of contents and
code blocks (stdlib :mod:`html.parser`, whitespace collapsed, one paragraph a line,
a blank line between chapters), and writes

* ``OUT/prose_heldout.txt``: at most ``--chapter-bytes`` of whole paragraphs from the
  start of each chapter (about 200 KB in all),
* ``OUT/prose_heldout.json``: source package, version, license and copyright notice,
  the chapters used, sha256 of the full extraction and of the slice.

The license (GPL-2+, "verbatim copies ... provided the copyright notice and this
permission notice are preserved") allows shipping the slice with its notice, which the
JSON carries verbatim (``copyright_notice``).

    apt-get install -y debian-reference-en
    python -m studies.data.fetch_prose --out tl_directional/data

``--check`` re-extracts and fails if the result differs from the pinned sha256 in
``OUT/prose_heldout.json`` (the extraction is deterministic for a given package version).
"""

from __future__ import annotations

import argparse
import html.parser
import json
import re
import subprocess
import sys
from pathlib import Path

from studies import common

SRC = Path("/usr/share/debian-reference")
COPYRIGHT = Path("/usr/share/doc/debian-reference-en/copyright")
# Preface, chapters 1-12, appendix: the book's reading order.
CHAPTERS = ["pr01"] + [f"ch{i:02d}" for i in range(1, 13)] + ["apa"]
SKIP_TAGS = {"table", "pre", "script", "style"}


class _Paragraphs(html.parser.HTMLParser):
    """Collect the text of ``<p>`` elements that are not inside a skipped element or a TOC."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, opens a skipped region)
        self.skip_depth = 0
        self.buf: list[str] | None = None
        self.paragraphs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "img", "meta", "link", "hr", "input", "col"):
            return
        cls = dict(attrs).get("class") or ""
        skip = tag in SKIP_TAGS or "toc" in cls.split() or "navheader" in cls or "navfooter" in cls
        self.stack.append((tag, skip))
        if skip:
            self.skip_depth += 1
        if tag == "p" and self.skip_depth == 0:
            self.buf = []

    def handle_endtag(self, tag):
        # pop to the matching tag (tolerates unclosed inline tags)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for t, skip in self.stack[i:]:
                    if skip:
                        self.skip_depth -= 1
                    if t == "p" and self.buf is not None:
                        text = re.sub(r"\s+", " ", "".join(self.buf)).strip()
                        if text and not text.startswith("Table of Contents"):
                            self.paragraphs.append(text)
                        self.buf = None
                del self.stack[i:]
                return

    def handle_data(self, data):
        if self.buf is not None and self.skip_depth == 0:
            self.buf.append(data)


def extract(path: Path) -> list[str]:
    """Paragraph texts of one HTML chapter, in document order."""
    p = _Paragraphs()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p.paragraphs


def package_version() -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", "debian-reference-en"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def build(chapter_bytes: int) -> tuple[str, str, dict]:
    """(full extraction, held-out slice, manifest) from the installed package."""
    if not SRC.is_dir():
        raise SystemExit(f"error: {SRC} not found; install it with `apt-get install -y debian-reference-en`")
    full_parts, slice_parts, used = [], [], []
    for ch in CHAPTERS:
        f = SRC / f"{ch}.en.html"
        if not f.is_file():
            raise SystemExit(f"error: {f} missing from debian-reference-en; reinstall the package")
        paras = extract(f)
        full_parts.append("\n".join(paras))
        take, size = [], 0
        for para in paras:
            n = len(para.encode("utf-8")) + 1
            if size + n > chapter_bytes:
                break
            take.append(para)
            size += n
        slice_parts.append("\n".join(take))
        used.append({"chapter": ch, "paragraphs_total": len(paras), "paragraphs_used": len(take), "bytes": size})
    full = "\n\n".join(full_parts) + "\n"
    sl = "\n\n".join(slice_parts) + "\n"
    manifest = {
        "source": {
            "package": "debian-reference-en (Debian)",
            "package_version": package_version(),
            "title": "Debian Reference (English original), Osamu Aoki",
            "files": [f"{SRC}/{c}.en.html" for c in CHAPTERS],
            "extraction": "scripts/fetch_prose.py: <p> text outside table/pre/toc, whitespace collapsed, "
                          "one paragraph a line, blank line between chapters",
            "full_extraction_sha256": common.sha256_bytes(full.encode("utf-8")),
            "full_extraction_bytes": len(full.encode("utf-8")),
        },
        "license": "GPL-2+ (see copyright_notice; full text /usr/share/common-licenses/GPL-2 or "
                   "https://www.gnu.org/licenses/old-licenses/gpl-2.0.txt)",
        "copyright_notice": COPYRIGHT.read_text(encoding="utf-8") if COPYRIGHT.is_file() else "",
        "chapters": used,
        "chapter_bytes": chapter_bytes,
        "bytes": len(sl.encode("utf-8")),
        "n_lines": sl.count("\n"),
        "sha256": common.sha256_bytes(sl.encode("utf-8")),
        "file": "prose_heldout.txt",
        "regenerate": "apt-get install -y debian-reference-en && python scripts/fetch_prose.py --out tl_directional/data",
        "note": "Public documentation: it may well be in either model's pretraining data (as the KJV is).",
    }
    return full, sl, manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tl_directional/data")
    ap.add_argument("--chapter-bytes", type=int, default=14000, help="bytes of whole paragraphs per chapter")
    ap.add_argument("--check", action="store_true", help="verify against the pinned manifest, write nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    _full, sl, manifest = build(args.chapter_bytes)
    if args.check:
        pinned = json.loads((out / "prose_heldout.json").read_text())
        if pinned["sha256"] != manifest["sha256"]:
            print(f"error: extraction sha256 {manifest['sha256']} != pinned {pinned['sha256']} "
                  f"(package version {manifest['source']['package_version']} vs "
                  f"{pinned['source']['package_version']})", file=sys.stderr)
            return 1
        print(f"ok: {manifest['sha256']}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "prose_heldout.txt").write_text(sl, encoding="utf-8")
    (out / "prose_heldout.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out / 'prose_heldout.txt'} ({manifest['bytes']} bytes, {manifest['n_lines']} lines, "
          f"sha256 {manifest['sha256']})")
    return 0


if __name__ == "__main__":
    common.run_main(main)
