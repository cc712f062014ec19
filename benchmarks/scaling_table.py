"""The scaling family's committed JSON as the Markdown tables of ``docs/performance.md``.

Usage (from the repository root)::

    python -m benchmarks.scaling_table benchmarks/results/issue51_scaling_cpu_float32.json

What: one table per JSON written by :mod:`benchmarks.scaling`: a row per size and dtype (stored
parameters, in millions), a column per record with its ratio (candidate / baseline, median of the
pairs), the 95 % interval and the number of pairs; where the run measured peak memory, a second
table of each side's peak increment (MB) and their ratio. The page's tables are this command's
output, pasted whole; nothing in them is typed by hand.

``--merge`` puts the records of several such JSONs (record groups run as separate calls, each at
its own workload) into one table per dtype, a column per record headed by its workload, each JSON's
command and the machine's load average (1-minute, at the start and end of each size's run) listed
above it; where a JSON's run measured peak memory (``--peak-memory``), a table of each side's peak
increment per size and dtype follows.

``--corpus-memory`` prints instead the corpus-length memory of JSONs run with
``python -m benchmarks.scaling --corpus-memory naive|handwritten``: per size and dtype, the
streaming profile's and the comparison side's peak increment at each corpus multiplier (MB), the
growth from the smallest to the largest, whether the streaming growth meets the target, and the
memory model's prediction over the measurement per point; a point not run says why.
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
    names = list(dict.fromkeys(rec["name"] for run in runs for rec in run["run"].get("records", [])))
    head = "| size | dtype | parameters (M) | " + " | ".join(names) + " |"
    rule = "|---|---|---|" + "---|" * len(names)
    rows = []
    mem_rows = []
    for run in runs:
        recs = {rec["name"]: rec for rec in run["run"].get("records", [])}
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


def _load(doc: dict) -> str:
    """The 1-minute load average over a JSON's runs: lowest start to highest end."""
    starts = [r["run"]["machine"]["loadavg_at_start"][0] for r in doc["runs"]
              if (r["run"].get("machine") or {}).get("loadavg_at_start")]
    ends = [r["run"]["loadavg_at_end"][0] for r in doc["runs"] if r["run"].get("loadavg_at_end")]
    if not starts or not ends:
        return "load not recorded"
    return f"load {min(starts):.2f}-{max(starts):.2f} at start, {min(ends):.2f}-{max(ends):.2f} at end"


def _cost(rec: dict) -> str | None:
    """One pair's cost as the record's check measured it: TransformerLens's call and ours, in
    seconds, with TransformerLens's forwards (one per patched run or receiver)."""
    extra = rec.get("extra") or {}
    calls = extra.get("check_call_s")
    if not calls:
        return None
    tl = calls.get("transformer_lens")
    ours = next(v for k, v in calls.items() if k != "transformer_lens")
    runs = extra.get("patched_runs") or extra.get("receivers")
    return f"{tl:.1f} + {ours:.1f} s" + (f" ({runs} forwards)" if runs else "")


def merged(docs: list[dict]) -> str:
    """One table per dtype of the records of several scaling JSONs: a row per size (in
    :data:`benchmarks.scaling.SIZES` order), a column per record and workload."""
    from .scaling import SIZES

    cols: list[tuple[str, str]] = []
    cells: dict[tuple[str, str], dict[tuple[str, str], str]] = {}
    costs: dict[tuple[str, str], dict[tuple[str, str], str]] = {}
    mems: dict[tuple[str, str], dict[tuple[str, str], str]] = {}
    params: dict[str, float] = {}
    out = ["Commands (device, workload, the machine's load):", ""]
    for doc in docs:
        note = "" if doc.get("complete", True) else " (stopped early: complete false)"
        out.append(f"* `{doc['command']}` ({doc.get('device')}, {doc.get('setting')}, {_load(doc)}){note}")
        for run in doc["runs"]:
            params[run["size"]] = run["parameters"] / 1e6
            for rec in run["run"].get("records", []):
                col = (rec["name"], doc.get("setting", "?"))
                if col not in cols:
                    cols.append(col)
                cells.setdefault((run["size"], run["dtype"]), {})[col] = _ratio(rec)
                if _cost(rec):
                    costs.setdefault((run["size"], run["dtype"]), {})[col] = _cost(rec)
                if _memory(rec):
                    mems.setdefault((run["size"], run["dtype"]), {})[col] = _memory(rec)
    order = {n: i for i, n in enumerate(SIZES)}
    for dtype in dict.fromkeys(d for _, d in cells):
        rows = sorted((k for k in cells if k[1] == dtype), key=lambda k: order.get(k[0], len(order)))
        out += ["", f"{dtype}: ratio [95 % interval] (pairs)", "",
                "| size | parameters (M) | " + " | ".join(f"{n} ({s})" for n, s in cols) + " |",
                "|---|---:|" + "---|" * len(cols)]
        out += [f"| {k[0]} | {params[k[0]]:.0f} | " + " | ".join(cells[k].get(c, "-") for c in cols) + " |"
                for k in rows]
    cost_cols = [c for c in cols if any(c in v for v in costs.values())]
    if cost_cols:
        out += ["", "One pair's cost in the record's check: TransformerLens's call + ours, seconds "
                "(TransformerLens's forwards):", "",
                "| size | dtype | " + " | ".join(f"{n} ({s})" for n, s in cost_cols) + " |",
                "|---|---|" + "---|" * len(cost_cols)]
        keys = sorted(costs, key=lambda k: (k[1], order.get(k[0], len(order))))
        out += [f"| {k[0]} | {k[1]} | " + " | ".join(costs[k].get(c, "-") for c in cost_cols) + " |" for k in keys]
    mem_cols = [c for c in cols if any(c in v for v in mems.values())]
    if mem_cols:
        # by dtype, then size: read down a column, the increment against the parameter count
        out += ["", "Peak memory increment during one call (a fresh process per side), candidate / baseline "
                "MB (ratio):", "",
                "| size | dtype | parameters (M) | " + " | ".join(f"{n} ({s})" for n, s in mem_cols) + " |",
                "|---|---|---:|" + "---|" * len(mem_cols)]
        keys = sorted(mems, key=lambda k: (k[1], order.get(k[0], len(order))))
        out += [f"| {k[0]} | {k[1]} | {params[k[0]]:.0f} | " + " | ".join(mems[k].get(c, "-") for c in mem_cols)
                + " |" for k in keys]
    return "\n".join(out) + "\n"


def _growth(g: float | None, over: list[int] | None) -> str:
    if g is None:
        return "-"
    return f"{g:.2f}" + (f" ({over[1]}x/{over[0]}x)" if over else "")


def corpus_memory_table(docs: list[dict]) -> str:
    """The corpus-length memory of scaling JSONs (``corpus_memory`` of each size and dtype) as
    Markdown: a row per size and dtype, the streaming and comparison increments (MB) per corpus
    multiplier with the memory model's prediction / measured in brackets, the growths, the
    target's reading; a skipped point shows its predicted need. Runs of the live count
    (``--corpus-count live``) get a table of their own, captioned."""
    from .memory import STREAMING_GROWTH_TARGET

    out = ["Commands:", ""]
    # one table per set of multipliers (a long-corpus run has other columns)
    groups: dict[tuple, list[str]] = {}
    for doc in docs:
        note = "" if doc.get("complete", True) else " (stopped early: complete false)"
        out.append(f"* `{doc['command']}`{note}")
        for run in doc["runs"]:
            mem = run.get("corpus_memory")
            if mem is None:
                continue
            lead = f"| {run['size']} | {run['dtype']} | {run['parameters'] / 1e6:.0f} | "
            if mem.get("status") != "ok":
                groups.setdefault(("error",), []).append(lead + f"{mem.get('status')}: {mem.get('reason')} |")
                continue
            other, mults, count = mem["compared_with"], mem["multipliers"], mem.get("count", "rss")
            rows = groups.setdefault((count, other, *mults), [])
            if not rows:
                if count == "live":  # not VmHWM: said above its table (a VmHWM table has no caption)
                    rows += ["Live tensor bytes (`--corpus-count live`), not VmHWM:", ""]
                cols = [f"streaming {m}x" for m in mults] + ["streaming growth", f"<= {STREAMING_GROWTH_TARGET:g}"]
                cols += [f"{other} {m}x" for m in mults] + [f"{other} growth"]
                rows += ["| size | dtype | parameters (M) | " + " | ".join(cols) + " |",
                         "|---|---|---:|" + "---:|" * len(mults) + "---:|---|" + "---:|" * (len(mults) + 1)]
            skipped = {(s["mode"], s["multiplier"]): s["reason"] for s in mem.get("skipped", [])}
            failed = {(f["mode"], f["multiplier"]): f["reason"].split(":")[0] for f in mem.get("failed", [])}

            def cells(mode, key, mem=mem, mults=mults, skipped=skipped, failed=failed, run=run):
                pred = _corpus_predictions(run, mem, mode)
                got = []
                for i, (m, v) in enumerate(zip(mults, mem[key], strict=True)):
                    if v is None and (mode, m) in failed:
                        got.append("failed: " + failed[(mode, m)])
                    elif v is None:
                        reason = skipped.get((mode, m), "not run")
                        got.append("skipped: " + (reason.split(" (")[0] if reason.startswith("predicted") else reason))
                    else:
                        got.append(f"{v:.1f}" + (f" ({pred[i] / v:.2f})" if pred and v > 0 else ""))
                return got

            over = mem.get("growth_multipliers", {})
            s_growth = mem["streaming_growth"]
            reading = "-" if s_growth is None else ("met" if s_growth <= STREAMING_GROWTH_TARGET else "missed")
            rows.append(lead + " | ".join(cells("streaming", "streaming_peak_increment_mb")
                                          + [_growth(s_growth, over.get("streaming")), reading]
                                          + cells(other, "naive_peak_increment_mb")
                                          + [_growth(mem["naive_growth"], over.get(other))]) + " |")
    out += ["", "Peak memory increment, MB (the memory model's prediction, as it is now / measured):"]
    for rows in groups.values():
        out += ["", *rows]
    return "\n".join(out) + "\n"


def _corpus_predictions(run: dict, mem: dict, mode: str) -> list[float] | None:
    """The memory model's predictions (bytes) of a corpus-memory run's points, from the model as
    it is now (a pure function of the point), so an older JSON is read against the current
    model; the JSON's own (the model when it ran) for a size the family no longer has."""
    from .memory_model import MB
    from .scaling import SIZES, corpus_prediction

    if run["size"] not in SIZES:
        return mem.get("predicted_mb", {}).get(mode)
    return [corpus_prediction(run["size"], mode, run["dtype"], mem["seq"], mem["batch_size"], m,
                              mem.get("count", "rss")) / MB for m in mem["multipliers"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling_table", description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", type=Path, help="scaling JSON files (python -m benchmarks.scaling --json)")
    p.add_argument("--merge", action="store_true", help="one table per dtype of all the JSONs' records")
    p.add_argument("--corpus-memory", action="store_true",
                   help="the corpus-length memory table of JSONs run with --corpus-memory")
    args = p.parse_args(argv)
    if args.corpus_memory:
        try:
            sys.stdout.write(corpus_memory_table([json.loads(path.read_text(encoding="utf-8"))
                                                  for path in args.json]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"benchmarks.scaling_table: no corpus memory ({type(exc).__name__}: {exc}); pass files "
                  "written by python -m benchmarks.scaling --corpus-memory naive|handwritten --json", file=sys.stderr)
            return 2
        return 0
    if args.merge:
        try:
            sys.stdout.write(merged([json.loads(path.read_text(encoding="utf-8")) for path in args.json]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"benchmarks.scaling_table: not scaling JSONs ({type(exc).__name__}: {exc}); pass files "
                  "written by python -m benchmarks.scaling --json", file=sys.stderr)
            return 2
        return 0
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
