"""Every quote of the paper in the docs names the commit it was read at (protocol sec. 12).

The paper's LaTeX reads differently at different commits, so a quote without its commit cannot be
checked. The convention, per sentence of prose or per table row (a row also counts as pinned when
its table's header names commits, as sec. 12's table of versions does): a unit that names one of
the paper's files, or that puts three or more words in double quotes and attributes them to the
paper or the revision outside the quotes, carries ``@`<hex>``` or ``commit `<hex>```.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAPER_FILE = re.compile(r"sections/[a-z_]+\.tex|figs/[\w/.-]+\.csv|emnlp_2026\.tex")
QUOTE = re.compile(r"\"[^\"\n]*\"")
ATTRIBUTION = re.compile(r"\b(?:the paper|the revision|paper's|revision's|its text)\b", re.IGNORECASE)
PIN = re.compile(r"(?:@`?|\bcommits? `)[0-9a-f]{7,40}\b")
COLUMN_COMMIT = re.compile(r"\| *`[0-9a-f]{7,40}` *\|")  # a table header whose column is a commit
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=[A-Z(*`-])")


def units(text: str) -> list[str]:
    """Prose sentences and table rows (a row under a header whose columns are commits counts as
    pinned and is left out); code and HTML blocks are skipped."""
    out, para, header, fence = [], [], "", False
    for ln in [*text.splitlines(), ""]:
        if ln.startswith("```"):
            fence = not fence
            continue
        if fence or ln.lstrip().startswith("<"):
            continue
        if ln.startswith("|"):
            if not header or set(ln.replace("|", "").strip()) <= set("-: "):
                header = header or ln
                continue
            if not COLUMN_COMMIT.search(header):
                out.append(ln)
            continue
        header = ""
        if ln.strip() and not ln.startswith("#"):
            para.append(ln.strip())
            continue
        if para:
            out += SENTENCE_END.split(" ".join(para))
            para = []
    return out


def quotes_the_paper(unit: str) -> bool:
    quoted = [q for q in QUOTE.findall(unit) if len(q.split()) >= 3]
    return bool(PAPER_FILE.search(unit) or (quoted and ATTRIBUTION.search(QUOTE.sub("", unit))))


def unpinned(text: str) -> list[str]:
    return [u for u in units(text) if quotes_the_paper(u) and not PIN.search(u)]


def test_the_convention_on_constructed_text():
    assert unpinned('The revision says it "leaves performance virtually intact".') != []
    assert unpinned('The revision (`sections/experiments.tex`@`28ae91f`) says "virtually intact here".') == []
    assert unpinned('The text of commit `28ae91f`: "by at most 1.3 points".') == []
    assert unpinned("A table `figs/a_b/c_sources.csv` gives +67.44 at 3.") != []
    assert unpinned('We call it "the paper\'s statistic" no longer.') == []  # the words are ours
    assert unpinned('Exclude-self "barely changes behaviour" here.') == []  # no attribution
    table = ("| claim | `28ae91f` | `8e5278e` |\n|---|---|---|\n"
             '| sweep (`sections/experiments.tex`) | "less than a point" | "only 0.46" |\n')
    assert unpinned(table) == []
    assert unpinned(table.replace("`28ae91f`", "a").replace("`8e5278e`", "b")) != []
    assert unpinned('```\nthe paper says "a b c d"\n```\n') == []


def test_every_paper_quote_in_the_docs_names_its_commit():
    pages = sorted(p for p in [*ROOT.glob("docs/**/*.md"), ROOT / "README.md"]
                   if p.is_file() and "data" not in p.relative_to(ROOT).parts)
    bad = [f"{p.relative_to(ROOT)}: {u[:200]}" for p in pages for u in unpinned(p.read_text())]
    assert not bad, ("a quote of the paper without the commit it was read at (write `file`@`<hex>` or "
                     "commit `<hex>`; protocol sec. 12):\n" + "\n".join(bad))
