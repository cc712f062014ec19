"""Peak memory of sweep's metric computation at a 262k vocabulary (Gemma-3's), one subprocess
per way, on a seeded 2-layer GPT-2 with ``vocab_size=262144`` built offline::

    python -m benchmarks.vocab_memory --batch 8 --seq 128

Reports the peak RSS increment of ``BaselineStats(base).compare(logits)`` (the current,
position-chunked code) and of the unchunked formula it replaced (log-softmax of every
predicted position at once, probabilities kept), in units of one ``[batch, pos, vocab]``
float32 tensor. The model's own logits (two of them: baseline and edited) exist before the
measurement starts and are not counted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MARKER = "BENCH_VOCAB_JSON "
VOCAB = 262144


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _unchunked(base_logits, logits, tokens, attention_mask):
    """The formula before chunking (kept here only as the memory reference)."""
    import torch.nn.functional as F

    m = attention_mask.bool()
    mask = m[:, :-1] & m[:, 1:]
    target = tokens[:, 1:][mask][:, None]
    base_lp = F.log_softmax(base_logits[:, :-1][mask].float(), dim=-1)
    p = base_lp.exp()
    p_log_p = (p * base_lp).sum()
    lp = F.log_softmax(logits[:, :-1][mask].float(), dim=-1)
    return float(-lp.gather(-1, target).sum()), float(p_log_p - (p * lp).sum())


def worker(way: str, model_dir: str, batch: int, seq: int) -> dict:
    import torch

    from tl_directional import ValueScale, apply_edits
    from tl_directional.models import load_model
    from tl_directional.sweep import BaselineStats

    torch.set_num_threads(1)
    model = load_model(model_dir).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=g)
    mask = torch.ones_like(tokens)
    with torch.no_grad():
        base = model(tokens, attention_mask=mask)
        with apply_edits(model, ValueScale(s_par=0.0)):
            edited = model(tokens, attention_mask=mask)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kb("VmRSS")
        if way == "chunked":
            BaselineStats(base, tokens, mask).compare(edited)
        else:
            _unchunked(base, edited, tokens, mask)
        peak = _status_kb("VmHWM")
    unit_mb = batch * seq * VOCAB * 4 / 2**20
    inc = (peak - before) / 1024
    return {"way": way, "batch": batch, "seq": seq, "vocab": VOCAB, "peak_increment_mb": inc,
            "bpv_tensor_mb": unit_mb, "in_bpv_tensors": inc / unit_mb}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vocab_memory")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--worker", choices=("chunked", "unchunked"))
    p.add_argument("--model-dir")
    p.add_argument("--ways", default="chunked,unchunked")
    a = p.parse_args(argv)
    if a.worker:
        print(MARKER + json.dumps(worker(a.worker, a.model_dir, a.batch, a.seq)), flush=True)
        return 0
    from tl_directional.models import build_tiny_hf_model

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "vocab262k"
        build_tiny_hf_model("gpt2", d, vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2,
                            n_ctx=max(128, a.seq))
        env = {"MALLOC_MMAP_THRESHOLD_": "65536"}
        import os

        env = dict(os.environ, **env)
        for way in a.ways.split(","):
            out = subprocess.run([sys.executable, "-m", "benchmarks.vocab_memory", "--worker", way,
                                  "--model-dir", str(d), "--batch", str(a.batch), "--seq", str(a.seq)],
                                 capture_output=True, text=True, env=env, check=False)
            line = [x for x in out.stdout.splitlines() if x.startswith(MARKER)]
            if not line:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(line[-1][len(MARKER):])
            print(f"{way:10s} batch {a.batch} x seq {a.seq}, vocab {VOCAB}: peak +{r['peak_increment_mb']:.0f} MB"
                  f" = {r['in_bpv_tensors']:.2f} x one [batch, pos, vocab] float32 tensor "
                  f"({r['bpv_tensor_mb']:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
