"""Measure what the real pretrained models cost here: conversion, load, forward, peak memory.

Each (model, phase) runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own:

* ``convert``: GGUF -> float32 HF directory into a temporary cache (only with ``--convert``;
  otherwise the figure recorded in the cache manifest is reported);
* ``forward``: ``load_model`` + one forward of ``batch x seq`` held-out tokens (logits);
* ``profile``: ``profile`` over those tokens (one batch);
* ``dla``: ``split_logit_attribution`` over them (answer = each sequence's last token);
* ``patch``: ``directional_patch`` of layer 0's attention (3 patched runs + 2 baselines).

Forward time is the median of ``--repeats`` forwards after one warm-up. Usage::

    python -m studies.explore.model_costs                       # both models, 8 x 128 tokens
    python -m studies.explore.model_costs --models smollm2-135m --convert --out costs.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from studies import common

PHASES = ("forward", "profile", "dla", "patch")


def _tokens(model, batch: int, seq: int):
    from tl_directional.model.inputs import load_text_sequences

    return load_text_sequences(model, None, max_sequences=batch, seq_len=seq).tokens


def run_phase(name: str, phase: str, batch: int, seq: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    from tl_directional.model.load import load_model

    out: dict = {"model": name, "phase": phase, "tokens": f"{batch}x{seq}"}
    t0 = time.perf_counter()
    if phase == "convert":
        from tl_directional.model.load.convert import real_model_dir

        real_model_dir(name, progress=False)
        out["seconds"] = time.perf_counter() - t0
    else:
        model = load_model(name)
        out["load_seconds"] = time.perf_counter() - t0
        tokens = _tokens(model, batch, seq)
        with torch.no_grad():
            if phase == "forward":
                model(tokens[:1, :8])  # warm-up
                times = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    model(tokens)
                    times.append(time.perf_counter() - t)
                out["seconds"] = statistics.median(times)
            elif phase == "profile":
                from tl_directional import profile

                t = time.perf_counter()
                profile(model, tokens, batch_size=batch, progress=False)
                out["seconds"] = time.perf_counter() - t
            elif phase == "dla":
                from tl_directional import split_logit_attribution

                t = time.perf_counter()
                split_logit_attribution(model, tokens, tokens[:, -1])
                out["seconds"] = time.perf_counter() - t
            elif phase == "patch":
                from tl_directional import directional_patch

                corrupted = tokens.clone()
                corrupted[:, seq // 2] = tokens[:, seq // 2 + 1]
                answer = tokens[:, -1]

                def metric(logits):
                    return logits[:, -1].gather(1, answer[:, None]).mean()

                t = time.perf_counter()
                directional_patch(model, tokens, corrupted, metric, components=("attn",), layers=[0])
                out["seconds"] = time.perf_counter() - t
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KB on Linux
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--convert", action="store_true", help="also time a fresh conversion (temporary cache)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        print(json.dumps(run_phase(args._child[0], args._child[1], args.batch, args.seq, args.repeats)))
        return 0

    import tl_directional

    rows = []
    for name in args.models.split(","):
        phases = args.phases.split(",")
        if args.convert:
            phases = ["convert"] + phases
        for phase in phases:
            env = dict(os.environ)
            tmp = None
            if phase == "convert":
                tmp = tempfile.mkdtemp(prefix="tl_directional_costs.")
                env["TL_DIRECTIONAL_CACHE"] = tmp
            cmd = [sys.executable, "-m", "studies.explore.model_costs", "--_child", name, phase, "--batch", str(args.batch),
                   "--seq", str(args.seq), "--repeats", str(args.repeats)]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=common.ROOT)
            if tmp:
                subprocess.run(["rm", "-rf", tmp], check=False)
            if res.returncode:
                print(res.stderr[-3000:], file=sys.stderr)
                return res.returncode
            row = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
        if not args.convert:
            man = common.model_manifest(name)
            rows.append({"model": name, "phase": "convert (manifest)", "seconds": man.get("convert_seconds"),
                         "tokens": "-", "peak_rss_gb": None})
    print(f"tl-directional {tl_directional.__version__}, torch threads {os.environ.get('OMP_NUM_THREADS', '2')}, "
          f"{os.cpu_count()} CPUs")
    print("| model | phase | tokens | seconds | load s | peak RSS GB |\n|---|---|---|---|---|---|")
    for r in rows:
        sec = "-" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        load = "-" if r.get("load_seconds") is None else f"{r['load_seconds']:.1f}"
        rss = "-" if r.get("peak_rss_gb") is None else f"{r['peak_rss_gb']:.2f}"
        print(f"| {r['model']} | {r['phase']} | {r['tokens']} | {sec} | {load} | {rss} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    common.run_main(main)
