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

from .peak_measure import MARKER as PEAK_MARKER
from .peak_measure import peak_of
from .registry import Bench, NotAvailable, Skipped, register
from .timing import PairedTiming, median_ci, paired_timing

MARKER = "BENCH_PEER_JSON "
REPO_ROOT = Path(__file__).resolve().parent.parent
NNSIGHT_VERSION = "0.8.1"
PEER_COMPONENTS = ("attn", "mlp")


def _hf_dir(source: str) -> Path:
    """The Hugging Face directory ``load_model(source)`` reads: the bundled default model, a
    catalogue model's converted cache entry (:func:`tl_directional.model.load.convert.real_model_dir`,
    converting on first use) or ``source`` itself (a directory)."""
    from tl_directional.model.load import catalog, convert, default_model_dir

    if source == "default":
        return Path(default_model_dir())
    if source in catalog.REAL_MODELS:
        return Path(convert.real_model_dir(source, progress=False))
    return Path(source)


class PeerLayoutError(ValueError):
    """The HF model's module layout is not one :func:`nnsight_stats` knows."""


def peer_layout(hf_model) -> str:
    """Which module layout the HF model has: ``"gpt2"`` (``transformer.h[i]``, ``attn``,
    ``mlp``), ``"llama"`` (``model.layers[i]``, ``self_attn``, ``mlp``, pre-norm) or
    ``"gemma3"`` (``model.layers[i]`` with sandwich norms: ``post_attention_layernorm`` /
    ``post_feedforward_layernorm`` after the sub-layers)."""
    inner = getattr(hf_model, "transformer", None)
    if inner is not None and hasattr(inner, "h"):
        return "gpt2"
    inner = getattr(hf_model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is not None and len(layers):
        first = layers[0]
        if hasattr(first, "post_feedforward_layernorm") and hasattr(first, "post_attention_layernorm"):
            return "gemma3"
        if hasattr(first, "self_attn") and hasattr(first, "mlp"):
            return "llama"
    raise PeerLayoutError(
        f"peer_nnsight knows the GPT-2 (transformer.h), Llama (model.layers, self_attn, mlp) and "
        f"Gemma-3 (model.layers with post_feedforward_layernorm) layouts; {type(hf_model).__name__} "
        "has none of them")


def layout_of_dir(path: str | Path) -> str:
    """:func:`peer_layout` of the HF model in directory ``path``, built on the meta device (no
    weights are read or allocated), so the record knows before starting a worker."""
    import torch
    import transformers

    from tl_directional.model.lanes import quiet_transformers

    config = transformers.AutoConfig.from_pretrained(str(path))
    with quiet_transformers(), torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return peer_layout(model)


def nnsight_stats(nn_model, tokens, attention_mask, layout: str | None = None) -> list:
    """Per layer, ``split_by_hand`` of the attention and MLP residual updates, computed inside
    one nnsight trace (what a user of nnsight writes for each layout, see :func:`peer_layout`).

    The updates are the ones ``profile`` reads at ``hook_attn_out`` / ``hook_mlp_out``:

    * GPT-2 and Llama (pre-norm): the attention update is the attention module's output, added
      to the block's input (``resid_pre``); the MLP update is the MLP's output, added to
      ``resid_mid = resid_pre + attention update``.
    * Gemma-3 (sandwich norms): a norm follows each sub-layer before the add, so the attention
      update is the ``post_attention_layernorm`` output and the MLP update the
      ``post_feedforward_layernorm`` output (their inputs are not what reaches the stream).
    """
    import torch

    from .workloads import split_by_hand

    layout = layout or peer_layout(nn_model._model if hasattr(nn_model, "_model") else nn_model)
    out: list = []
    mask = attention_mask.bool()
    with torch.no_grad(), nn_model.trace(tokens, attention_mask=attention_mask):
        # Where each layout's residual updates leave the block (see the docstring).
        if layout == "gpt2":
            blocks, attn_of, mlp_of = nn_model.transformer.h, (lambda b: b.attn.output[0]), (lambda b: b.mlp.output)
        elif layout == "llama":
            blocks, attn_of, mlp_of = nn_model.model.layers, (lambda b: b.self_attn.output[0]), (lambda b: b.mlp.output)
        elif layout == "gemma3":
            blocks = nn_model.model.layers
            attn_of, mlp_of = (lambda b: b.post_attention_layernorm.output), (lambda b: b.post_feedforward_layernorm.output)
        else:
            raise PeerLayoutError(f"layout={layout!r}; known: 'gpt2', 'llama', 'gemma3'")
        for block in blocks:
            resid_pre = block.input
            attn_out, mlp_out = attn_of(block), mlp_of(block)
            resid_mid = resid_pre + attn_out
            out.append({"attn": split_by_hand(attn_out[mask], resid_pre[mask]),
                        "mlp": split_by_hand(mlp_out[mask], resid_mid[mask])})
    return out


#: Largest relative difference between the peer's and ``profile``'s per-layer means that the
#: record accepts (float32 round-off of the same forward is ~1e-6; a wrong module is ~1).
PEER_CHECK_TOLERANCE = 1e-3


def compare_with_profile(prof, peer: list) -> dict:
    """Max relative difference, over every layer and both components, between ``profile``'s
    ``alpha_mean`` / ``par_frac_mean`` / ``rel_update_mean`` and the peer's."""
    worst, where = 0.0, None
    for L, comps in enumerate(peer):
        for comp, stats in comps.items():
            row = prof.residual.query(f"layer == {L} and component == '{comp}'").iloc[0]
            for metric in ("alpha", "par_frac", "rel_update"):
                a, b = float(row[f"{metric}_mean"]), float(stats[metric]["mean"])
                d = abs(a - b) / max(1.0, abs(b))
                d = d if d == d else float("inf")  # NaN: as bad as it gets
                if d > worst:
                    worst, where = d, f"layer {L} {comp} {metric}_mean: profile {a!r}, peer {b!r}"
    return {"max_rel_diff": worst, "where": where, "layers": len(peer)}


def measure_nnsight(model_source: str, seq: int, batch: int, *, warmup: int, min_pairs: int,
                    max_pairs: int, max_seconds: float, target: float, precision: float,
                    seed: int, threads: int = 1) -> dict:
    """Paired timing of nnsight (baseline) and ``profile`` (candidate) in this process."""
    import torch
    from nnsight import NNsight

    from tl_directional import profile
    from tl_directional.model.load import load_hf_model, load_model

    from .workloads import text_batch

    if threads:
        torch.set_num_threads(threads)
    model = load_model(model_source).eval()
    hf = load_hf_model(_hf_dir(model_source))
    layout = peer_layout(hf)
    nn_model = NNsight(hf)
    inputs = text_batch(model, batch, seq)

    def base():
        return nnsight_stats(nn_model, inputs.tokens, inputs.attention_mask, layout)

    def cand():
        return profile(model, inputs, batch_size=len(inputs), components=PEER_COMPONENTS,
                       verify=False, progress=False, exclude_first_token=False)  # every token, as the hand-written and peer computations count them

    prof, peer = cand(), base()
    row = prof.residual.query("layer == 0 and component == 'mlp'").iloc[0]
    check = abs(float(row["par_frac_mean"]) - float(peer[0]["mlp"]["par_frac"]["mean"]))
    every = compare_with_profile(prof, peer)
    if not every["max_rel_diff"] <= PEER_CHECK_TOLERANCE:
        raise AssertionError(
            f"the nnsight statistics ({layout} layout) differ from profile's by "
            f"{every['max_rel_diff']:.3g} (> {PEER_CHECK_TOLERANCE:g}) at {every['where']}: the peer "
            "reads other modules than profile's hook_attn_out / hook_mlp_out")

    def done(ratios):
        _, (lo, hi) = median_ci(ratios, seed=seed)
        return hi <= target or lo > target or (hi - lo) <= precision

    t = paired_timing(base, cand, warmup=warmup, min_pairs=min_pairs, max_pairs=max_pairs,
                      max_seconds=max_seconds, done=done)
    import nnsight

    return {"baseline_s": t.baseline_s, "candidate_s": t.candidate_s, "warmup": t.warmup_pairs,
            "stop_reason": t.stop_reason, "check_par_frac_mean_diff": check,
            "check_max_rel_diff_every_layer": every["max_rel_diff"], "layout": layout,
            "nnsight_version": getattr(nnsight, "__version__", "?"),
            "torch_version": torch.__version__, "python": sys.executable}


@register(
    "peer_nnsight", target=0.80, op="<=", precision=0.05, models=("main",),
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
    try:
        layout_of_dir(_hf_dir(bench.model_source))
    except (PeerLayoutError, ValueError, OSError) as exc:
        raise NotAvailable(f"peer_nnsight cannot run on {bench.model_source}: {exc}") from None
    kwargs = dict(seq=bench.setting.seq, batch=bench.setting.batch, warmup=cfg.warmup,
                  min_pairs=cfg.min_pairs, max_pairs=cfg.max_pairs, max_seconds=cfg.max_seconds,
                  target=bench.spec.target, precision=bench.spec.precision, seed=bench.seed,
                  threads=cfg.threads)
    python = os.environ.get("BENCH_NNSIGHT_PYTHON")
    if importlib.util.find_spec("nnsight") is not None:
        try:
            res = measure_nnsight(bench.model_source, **kwargs)
        except PeerLayoutError as exc:
            res = {"not_available": str(exc)}
    elif python:
        res = _run_worker(python, bench.model_source, kwargs)
    else:
        raise Skipped(f"nnsight is not installed here and BENCH_NNSIGHT_PYTHON is not set: install "
                      f"nnsight=={NNSIGHT_VERSION} in its own venv (pip install -e '.[bench]') and "
                      "point BENCH_NNSIGHT_PYTHON at its python")
    if "not_available" in res:
        raise NotAvailable(res["not_available"])
    bench.extra.update({k: res[k] for k in ("check_par_frac_mean_diff", "check_max_rel_diff_every_layer",
                                             "layout", "nnsight_version", "torch_version", "python")})
    bench.extra["check_tolerance"] = PEER_CHECK_TOLERANCE
    bench.extra["components"] = list(PEER_COMPONENTS)
    return PairedTiming(res["baseline_s"], res["candidate_s"], res["warmup"], res["stop_reason"])


def probe_nnsight(model_source: str, seq: int, batch: int, side: str, threads: int = 1) -> dict:
    """Peak memory of one call of ``side`` (``"baseline"``: the nnsight trace; ``"candidate"``:
    ``profile``) in this process (a fresh worker, see :mod:`benchmarks.peak_memory`)."""
    import torch
    from nnsight import NNsight

    from tl_directional import profile
    from tl_directional.model.load import load_hf_model, load_model

    from .workloads import text_batch

    if threads:
        torch.set_num_threads(threads)
    model = load_model(model_source).eval()
    hf = load_hf_model(_hf_dir(model_source))
    layout = peer_layout(hf)
    nn_model = NNsight(hf)
    inputs = text_batch(model, batch, seq)
    small = inputs.tokens[:1, :8], inputs.attention_mask[:1, :8]
    with torch.no_grad():  # one-off lazy set-up of both stacks, on 8 tokens
        model(small[0], attention_mask=small[1], return_type=None)
        hf(input_ids=small[0], attention_mask=small[1])
    if side == "baseline":
        res = peak_of(lambda: nnsight_stats(nn_model, inputs.tokens, inputs.attention_mask, layout), "cpu")
    else:
        res = peak_of(lambda: profile(model, inputs, batch_size=len(inputs), components=PEER_COMPONENTS,
                                      verify=False, progress=False, exclude_first_token=False), "cpu")
    res["side"] = side
    res["note"] = "the worker holds both the TransformerLens model and nnsight's HF model"
    return res


def _probe_command(model_source: str, seq: int, batch: int, side: str, threads: int) -> list[str] | None:
    """The command line of a fresh nnsight worker probing ``side`` (None without nnsight)."""
    python = sys.executable if importlib.util.find_spec("nnsight") is not None else os.environ.get(
        "BENCH_NNSIGHT_PYTHON")
    if not python:
        return None
    args = {"seq": seq, "batch": batch, "side": side, "threads": threads}
    return [python, "-m", "benchmarks.peers", "--model", str(model_source), "--probe",
            json.dumps(args)]


peer_nnsight.probe_command = _probe_command


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
    p.add_argument("--json-args", help="keyword arguments of measure_nnsight")
    p.add_argument("--probe", help="keyword arguments of probe_nnsight (a peak-memory probe)")
    a = p.parse_args(argv)
    if a.probe:

        print(PEAK_MARKER + json.dumps(probe_nnsight(a.model, **json.loads(a.probe))), flush=True)
        return 0
    if not a.json_args:
        p.error("--json-args or --probe is required")
    try:
        res = measure_nnsight(a.model, **json.loads(a.json_args))
    except PeerLayoutError as exc:
        res = {"not_available": str(exc)}
    print(MARKER + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
