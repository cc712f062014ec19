"""Peer records: the same job done with another library a user might pick instead.

``peer_nnsight``: ``profile(components=("attn", "mlp"))`` / the same per-layer residual
statistics (``alpha``, ``par_frac``, ``par_perp_ratio``, ``rel_update``: mean, std, five
quantiles; energy ratio) computed inside an nnsight 0.8.1 trace of the same Hugging Face model
on the same tokens. nnsight is an optional, benchmark-only dependency (``pip install -e
'.[bench]'``); its pins may clash with the lanes' constraints, so it usually lives in its own
venv. The record then runs this module as a worker with that venv's interpreter::

    BENCH_NNSIGHT_PYTHON=/path/to/venv-nnsight/bin/python python -m benchmarks.run

(the worker imports this checkout through ``PYTHONPATH``). Where nnsight is neither importable
here nor reachable through ``BENCH_NNSIGHT_PYTHON``, the record is ``skipped`` with that message.
The worker uses the harness's paired timing and prints one JSON line prefixed by
``BENCH_PEER_JSON``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from .registry import Bench, Skipped, register
from .timing import PairedTiming, median_ci, paired_timing

MARKER = "BENCH_PEER_JSON "
REPO_ROOT = Path(__file__).resolve().parent.parent
NNSIGHT_VERSION = "0.8.1"
PEER_COMPONENTS = ("attn", "mlp")


def _hf_dir(source: str) -> Path:
    if source == "default":
        from tl_directional.models import default_model_dir

        return Path(default_model_dir())
    return Path(source)


def nnsight_stats(nn_model, tokens, attention_mask) -> list:
    """Per layer, ``split_by_hand`` of the attention and MLP updates of a GPT-2-shaped HF
    model, computed inside one nnsight trace (what a user of nnsight writes)."""
    import torch

    from .workloads import split_by_hand

    out: list = []
    mask = attention_mask.bool()
    with torch.no_grad(), nn_model.trace(tokens, attention_mask=attention_mask):
        for block in nn_model.transformer.h:
            resid_pre = block.input
            attn_out = block.attn.output[0]
            mlp_out = block.mlp.output
            resid_mid = resid_pre + attn_out
            out.append({"attn": split_by_hand(attn_out[mask], resid_pre[mask]),
                        "mlp": split_by_hand(mlp_out[mask], resid_mid[mask])})
    return out


def measure_nnsight(model_source: str, seq: int, batch: int, *, warmup: int, min_pairs: int,
                    max_pairs: int, max_seconds: float, target: float, precision: float,
                    seed: int, threads: int = 1) -> dict:
    """Paired timing of nnsight (baseline) and ``profile`` (candidate) in this process."""
    import torch
    from nnsight import NNsight

    from tl_directional import profile
    from tl_directional.models import load_hf_model, load_model

    from .workloads import text_batch

    if threads:
        torch.set_num_threads(threads)
    model = load_model(model_source).eval()
    hf = load_hf_model(_hf_dir(model_source))
    nn_model = NNsight(hf)
    inputs = text_batch(model, batch, seq)

    def base():
        return nnsight_stats(nn_model, inputs.tokens, inputs.attention_mask)

    def cand():
        return profile(model, inputs, batch_size=len(inputs), components=PEER_COMPONENTS,
                       verify=False, progress=False, exclude_first_token=False)  # every token, as the hand-written and peer computations count them

    prof, peer = cand(), base()
    row = prof.residual.query("layer == 0 and component == 'mlp'").iloc[0]
    check = abs(float(row["par_frac_mean"]) - float(peer[0]["mlp"]["par_frac"]["mean"]))

    def done(ratios):
        _, (lo, hi) = median_ci(ratios, seed=seed)
        return hi <= target or lo > target or (hi - lo) <= precision

    t = paired_timing(base, cand, warmup=warmup, min_pairs=min_pairs, max_pairs=max_pairs,
                      max_seconds=max_seconds, done=done)
    import nnsight

    return {"baseline_s": t.baseline_s, "candidate_s": t.candidate_s, "warmup": t.warmup_pairs,
            "stop_reason": t.stop_reason, "check_par_frac_mean_diff": check,
            "nnsight_version": getattr(nnsight, "__version__", "?"),
            "torch_version": torch.__version__, "python": sys.executable}


@register(
    "peer_nnsight", target=0.85, op="<=", precision=0.05, models=("main",),
    baseline=f"nnsight {NNSIGHT_VERSION} trace of the same HF model and tokens computing the same "
             "per-layer residual statistics (attn, mlp)",
    candidate="profile(model, batch, components=('attn', 'mlp'), verify=False, progress=False)",
)
def peer_nnsight(bench: Bench):
    """``profile`` of the attention and MLP updates / the same statistics with nnsight on the
    same Hugging Face model and tokens (nnsight runs the full forward, as its users do)."""
    cfg = bench.harness.config
    if bench.device.type != "cpu":
        raise Skipped("peer_nnsight runs on CPU only (the worker loads its own copies)")
    if bench.setting.model != "main":
        raise Skipped("peer_nnsight runs on the main model only")
    kwargs = dict(seq=bench.setting.seq, batch=bench.setting.batch, warmup=cfg.warmup,
                  min_pairs=cfg.min_pairs, max_pairs=cfg.max_pairs, max_seconds=cfg.max_seconds,
                  target=bench.spec.target, precision=bench.spec.precision, seed=bench.seed,
                  threads=cfg.threads)
    python = os.environ.get("BENCH_NNSIGHT_PYTHON")
    if importlib.util.find_spec("nnsight") is not None:
        res = measure_nnsight(bench.model_source, **kwargs)
    elif python:
        res = _run_worker(python, bench.model_source, kwargs)
    else:
        raise Skipped(f"nnsight is not installed here and BENCH_NNSIGHT_PYTHON is not set: install "
                      f"nnsight=={NNSIGHT_VERSION} in its own venv (pip install -e '.[bench]') and "
                      "point BENCH_NNSIGHT_PYTHON at its python")
    bench.extra.update({k: res[k] for k in ("check_par_frac_mean_diff", "nnsight_version",
                                             "torch_version", "python")})
    bench.extra["components"] = list(PEER_COMPONENTS)
    return PairedTiming(res["baseline_s"], res["candidate_s"], res["warmup"], res["stop_reason"])


def _run_worker(python: str, source: str, kwargs: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [python, "-m", "benchmarks.peers", "--model", str(source), "--json-args", json.dumps(kwargs)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise RuntimeError(f"nnsight worker failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                       f"{(proc.stderr or proc.stdout)[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--json-args", required=True, help="keyword arguments of measure_nnsight")
    a = p.parse_args(argv)
    res = measure_nnsight(a.model, **json.loads(a.json_args))
    print(MARKER + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
