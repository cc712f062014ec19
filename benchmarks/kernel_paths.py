"""The harness's records under several CPU kernel paths (and code trees), alternating, in one command.

Usage (from the repository root)::

    python -m benchmarks.kernel_paths --model smollm2-135m --records profile_overhead,edit_overhead \\
        --setting 128x8 --rounds 3 --pairs 4 --json OUT.json
    # before / after: the same runs alternating between two checkouts of the repository
    python -m benchmarks.kernel_paths --trees /tmp/before,. --model smollm2-135m ... --json OUT.json

Why: on a CPU with AVX-512 / AMX, torch, MKL and oneDNN pick those kernels by default; a machine of
the same kind may run the AVX2 ones instead (another cloud instance type, a container that hides
the flags), and the elementwise passes a profile adds cost a different share of a forward on each.
A target that must hold on both paths needs both figures from the same machine at the same time.

How: a kernel path is fixed when the process starts (``ATEN_CPU_CAPABILITY``,
``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``; the Makefile's ``test-kernels`` forces AVX2
the same way), so every (tree, path) variant runs ``python -m benchmarks.run`` in its own
subprocess. ``--rounds`` rounds each run every variant once for ``--pairs`` paired timings, in
alternating order (forward in even rounds, reversed in odd ones), so load that drifts over minutes
on a shared machine hits every variant alike. The pairs of a variant are pooled over the rounds
and its ratio is their median with the seeded bootstrap ci95 of :mod:`benchmarks.timing`; each
round's own ratio stays in the JSON. Each subprocess reports the capability torch actually ran
(``machine.cpu_capability``), which the JSON keeps per variant: on a CPU without AVX-512 both paths
are AVX2, and the JSON says so rather than report a difference that is not there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .jsonout import write_json
from .run import KERNEL_ENV_VARS
from .timing import median_ci

#: Kernel path name -> the environment it sets (``None``: the variable is removed, torch's own choice).
PATHS: dict[str, dict[str, str | None]] = {
    "default": {k: None for k in KERNEL_ENV_VARS},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def variant_env(path: str, tree: Path) -> dict[str, str]:
    """The subprocess environment of kernel path ``path`` running the code of ``tree``."""
    env = dict(os.environ)
    for k, v in PATHS[path].items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    # the tree's own package first (the subprocess also runs in it: its benchmarks/ too)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def round_order(variants: list, r: int) -> list:
    """The variants in round ``r``'s order: as given in even rounds, reversed in odd ones."""
    return list(variants) if r % 2 == 0 else list(reversed(variants))


def run_variant(tree: Path, path: str, args: argparse.Namespace, out: Path) -> dict:
    """One harness run (its own process) of ``tree``'s code under kernel path ``path``."""
    cmd = [sys.executable, "-m", "benchmarks.run", "--model", args.model, "--dtype", args.dtype,
           "--records", args.records, "--setting", args.setting, "--no-memory", "--no-wide",
           "--no-peak-memory", "--min-pairs", str(args.pairs), "--max-pairs", str(args.pairs),
           "--warmup", str(args.warmup), "--threads", str(args.threads), "--json", str(out)]
    started = time.time()
    proc = subprocess.run(cmd, cwd=tree, env=variant_env(path, tree), capture_output=True, text=True)
    if not out.exists():
        return {"status": "error", "returncode": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
    doc = json.loads(out.read_text())
    doc["driver_seconds"] = time.time() - started
    return doc


def pool(runs: list[dict], seed: int) -> list[dict]:
    """One row per record and setting: the pairs of every run pooled, their median ratio and ci95."""
    rows: dict[tuple, dict] = {}
    for r, doc in enumerate(runs):
        for rec in doc.get("records", []):
            key = (rec["name"], rec["setting"])
            row = rows.setdefault(key, {"name": rec["name"], "setting": rec["setting"], "target": rec["target"],
                                        "baseline_s": [], "candidate_s": [], "round_ratios": [],
                                        "statuses": []})
            row["statuses"].append(rec["status"])
            if rec["status"] != "ok" or not rec.get("times"):
                continue
            row["baseline_s"] += rec["times"]["baseline_s"]
            row["candidate_s"] += rec["times"]["candidate_s"]
            row["round_ratios"].append({"round": r, "ratio": rec["ratio"], "ci95": rec["ci95"]})
    out = []
    for row in rows.values():
        ratios = [c / b for b, c in zip(row["baseline_s"], row["candidate_s"], strict=True)]
        ratio, (lo, hi) = median_ci(ratios, seed=seed) if ratios else (None, (None, None))
        out.append({**row, "ratio": ratio, "ci95": [lo, hi], "n_pairs": len(ratios)})
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernel_paths", description=__doc__.split("\n")[0])
    p.add_argument("--paths", default="default,avx2", help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--trees", default=".",
                   help="comma-separated repository checkouts whose code runs (e.g. a clean clone of the "
                        "commit before a change, then '.'); default: this one")
    p.add_argument("--model", default="default", help="anything benchmarks.run --model takes")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--records", default="profile_overhead,edit_overhead")
    p.add_argument("--setting", default="128x8", help="SEQxBATCH, one workload")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every variant, order alternating")
    p.add_argument("--pairs", type=int, default=4, help="timed pairs per record, variant and round")
    p.add_argument("--warmup", type=int, default=1, help="warm-up pairs per record and run")
    p.add_argument("--threads", type=int, default=1, help="torch threads (benchmarks.run --threads)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--json", required=True, metavar="OUT")
    return p.parse_args(argv)


def _usage(msg: str) -> int:
    print(f"python -m benchmarks.kernel_paths: error: {msg}", file=sys.stderr)
    return 2


def _capabilities(runs: list[dict]) -> list:
    return sorted({str((d.get("machine") or {}).get("cpu_capability")) for d in runs})


def main(argv: list[str] | None = None) -> int:
    """Run every (tree, path) variant ``--rounds`` times, alternating; write one JSON; print the
    table. Exit 1 if a run or record errored, 2 on a usage error."""
    args = parse_args(argv)
    paths = [s.strip() for s in args.paths.split(",") if s.strip()]
    unknown = [s for s in paths if s not in PATHS]
    if unknown or not paths:
        return _usage(f"--paths has unknown name(s) {unknown}; known: {list(PATHS)}")
    trees = [Path(t.strip()).expanduser().resolve() for t in args.trees.split(",") if t.strip()]
    missing = [str(t) for t in trees if not (t / "benchmarks" / "run.py").is_file()]
    if missing or not trees:
        return _usage(f"--trees {missing} hold no benchmarks/run.py; pass repository checkouts")
    if args.rounds < 1 or args.pairs < 1:
        return _usage(f"--rounds and --pairs must be >= 1, got {args.rounds} and {args.pairs}")
    variants = [(t, p) for t in trees for p in paths]
    label = {v: (f"{v[0].name or v[0]}:" if len(trees) > 1 else "") + v[1] for v in variants}
    work = Path(tempfile.mkdtemp(prefix="tl_directional_kernel_paths_"))
    runs: dict[tuple, list[dict]] = {v: [] for v in variants}
    order_log = []
    for r in range(args.rounds):
        for v in round_order(variants, r):
            print(f"kernel_paths: round {r + 1}/{args.rounds}, {label[v]} ...", file=sys.stderr, flush=True)
            runs[v].append(run_variant(v[0], v[1], args, work / f"r{r}-{len(order_log)}.json"))
            order_log.append({"round": r, "variant": label[v]})
    doc = {
        "command": "python -m benchmarks.kernel_paths " + " ".join(sys.argv[1:] if argv is None else argv),
        "setting": args.setting, "model": args.model, "dtype": args.dtype, "rounds": args.rounds,
        "pairs_per_round": args.pairs, "order": order_log,
        "method": "each (tree, kernel path) in its own benchmarks.run subprocess per round, rounds in "
                  "alternating order; a variant's pairs pooled over the rounds, median ratio and "
                  "seeded bootstrap ci95",
        "variants": [{"label": label[v], "tree": str(v[0]), "path": v[1], "env": PATHS[v[1]],
                      "cpu_capability": _capabilities(runs[v]),
                      "git_commit": sorted({str((d.get("machine") or {}).get("git_commit")) for d in runs[v]}),
                      "records": pool(runs[v], args.seed),
                      "runs": runs[v]} for v in variants],
    }
    write_json(args.json, doc)
    print(format_table(doc))
    failed = any(d.get("status") == "error" or any(r.get("status") == "error" for r in d.get("records", []))
                 for v in variants for d in runs[v])
    return 1 if failed else 0


def format_table(doc: dict) -> str:
    """Plain text: one line per variant and record (ratio, ci95, pairs, the capability torch ran)."""
    lines = [f"{'variant':28s} {'capability':12s} {'record':24s} {'ratio':>7s}  ci95              pairs"]
    for v in doc["variants"]:
        for rec in v["records"]:
            lo, hi = rec["ci95"]
            ci = "-" if lo is None else f"[{lo:.3f}, {hi:.3f}]"
            ratio = "-" if rec["ratio"] is None else f"{rec['ratio']:.3f}"
            lines.append(f"{v['label']:28s} {','.join(v['cpu_capability']):12s} {rec['name']:24s} "
                         f"{ratio:>7s}  {ci:16s}  {rec['n_pairs']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
