"""Run the ```python blocks of a docs page, in order, in one namespace, and print their output.

This is how the example output shown on the docs pages is produced, and how
``tests/integration/test_docs.py`` checks that the pages' code runs::

    python docs/run_snippets.py docs/quickstart.md                  # the default model
    python docs/run_snippets.py docs/quickstart.md --model DIR      # any model directory
    python docs/run_snippets.py --update docs/*.md                  # refresh the shown output

Conventions for a page whose code is run:

* every fenced block whose info string is exactly ``python`` is executed; output shown
  on the page goes in ``text`` blocks, which are not;
* a ``text`` block that directly follows a ``python`` block (only blank lines between)
  is that block's output: ``--update`` rewrites it with what the block prints on the
  default model, so the numbers on a page always come from this command;
* a page that loads a model does so from one line ``MODEL = "default"``; ``--model``
  (or ``run_page(..., model=...)``) replaces that line's value, so tests can use a tiny
  model built with ``tl_directional.model.load.build_tiny_hf_model`` (pages without such a
  line run unchanged).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
OUTPUT = re.compile(r"[ \t]*\n(?:[ \t]*\n)*```text[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
MODEL_LINE = re.compile(r'^MODEL = "default"(?=\s|#|$)', re.M)


def python_blocks(text: str) -> list[str]:
    """The code of every top-level ```python fence of a Markdown page, in order."""
    return [m.group(1) for m in FENCE.finditer(text)]


def run_page(path: str | Path, *, model: str | None = None, echo: bool = False) -> list[str]:
    """Execute the page's python blocks in one namespace; return each block's stdout.

    ``model`` replaces the value of the page's ``MODEL = "default"`` line (pages without
    one run unchanged).
    ``echo`` also prints each block's output as it runs.
    """
    path = Path(path)
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    if not blocks:
        raise ValueError(f"{path} has no ```python blocks")
    if model is not None:
        hits = sum(len(MODEL_LINE.findall(b)) for b in blocks)
        if hits > 1:
            raise ValueError(f'{path} has {hits} lines MODEL = "default"; a page may have one')
        blocks = [MODEL_LINE.sub(f"MODEL = {str(model)!r}", b) for b in blocks]
    namespace: dict = {"__name__": "__docs__"}
    outputs = []
    for i, code in enumerate(blocks, 1):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"{path}:block{i}", "exec"), namespace)  # noqa: S102 - our own docs
        outputs.append(buf.getvalue())
        if echo:
            print(f"--- {path} block {i}")
            print(buf.getvalue(), end="")
    return outputs


def update_page(path: str | Path) -> bool:
    """Run the page on the default model and rewrite each python block's output block.

    Returns whether the file changed.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    outputs = run_page(path)
    spans = []
    for m, out in zip(FENCE.finditer(text), outputs, strict=True):
        shown = OUTPUT.match(text, m.end())
        if shown is None:
            if out.strip():
                print(f"note: {path}: a block prints output but has no text block after it", file=sys.stderr)
            continue
        spans.append((shown.start(1), shown.end(1), out if out.endswith("\n") or not out else out + "\n"))
    new = text
    for start, end, out in reversed(spans):
        new = new[:start] + out + new[end:]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pages", nargs="+", help="Markdown pages under docs/")
    parser.add_argument("--model", default=None, help='value for the page\'s MODEL line (default: keep "default")')
    parser.add_argument("--update", action="store_true",
                        help="rewrite the output blocks on the pages (default model only)")
    args = parser.parse_args(argv)
    if args.update and args.model is not None:
        parser.error("--update writes the default model's output; drop --model")
    for page in args.pages:
        if args.update:
            print(f"{page}: {'updated' if update_page(page) else 'unchanged'}")
        else:
            run_page(page, model=args.model, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
