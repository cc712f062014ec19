"""The scaling family's committed JSON as the Markdown tables of ``docs/performance.md``.

Usage (from the repository root)::

    python -m benchmarks.scaling_table benchmarks/results/issue51_scaling_cpu_float32.json

What: one table per JSON written by :mod:`benchmarks.scaling`: a row per size and dtype (stored
parameters, in millions), a column per record with its ratio (candidate / baseline, median of the
pairs), the 95 % interval and the number of pairs; where the run measured peak memory, a second
table of each side's peak increment (MB) and their ratio. The page's tables are this command's
output, pasted whole; nothing in them is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _ratio(rec: dict) -> str:
    if rec.get("status") != "ok" or rec.get("ratio") is None:
        return f"{rec.get('status', '-')}"
    lo, hi = rec.get("ci95") or (None, None)
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    return f"{rec['ratio']:.2f}{ci} ({rec.get('n_pairs')})"


def _memory(rec: dict) -> str | None:
    peak = (rec.get("extra") or {}).get("peak_memory") or {}
    if "baseline" not in peak or "candidate" not in peak:
        return None
    b, c = peak["baseline"]["increment_mb"], peak["candidate"]["increment_mb"]
    ratio = f" ({c / b:.2f}x)" if b > 0 else ""
    return f"{c:.0f} / {b:.0f}{ratio}"


def tables(doc: dict) -> str:
    """The Markdown of one scaling JSON: the ratio table, then the memory table if any."""
    runs = doc["runs"]
    names = list(dict.fromkeys(rec["name"] for run in runs for rec in run["run"]["records"]))
    head = "| size | dtype | parameters (M) | " + " | ".join(names) + " |"
    rule = "|---|---|---|" + "---|" * len(names)
    rows = []
    mem_rows = []
    for run in runs:
        recs = {rec["name"]: rec for rec in run["run"]["records"]}
        lead = f"| {run['size']} | {run['dtype']} | {run['parameters'] / 1e6:.0f} | "
        rows.append(lead + " | ".join(_ratio(recs[n]) if n in recs else "-" for n in names) + " |")
        mems = [_memory(recs[n]) if n in recs else None for n in names]
        if any(mems):
            mem_rows.append(lead + " | ".join(m or "-" for m in mems) + " |")
    out = [f"Command: `{doc['command']}` (setting {doc.get('setting')}, device {doc.get('device')}); "
           "ratio [95 % interval] (pairs):", "", head, rule, *rows]
    if mem_rows:
        out += ["", "Peak memory increment during the call, candidate / baseline MB (ratio):", "", head, rule,
                *mem_rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling_table", description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", type=Path, help="scaling JSON files (python -m benchmarks.scaling --json)")
    args = p.parse_args(argv)
    for path in args.json:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            text = tables(doc)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"benchmarks.scaling_table: {path}: not a scaling JSON ({type(exc).__name__}: {exc}); "
                  "pass a file written by python -m benchmarks.scaling --json", file=sys.stderr)
            return 2
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
