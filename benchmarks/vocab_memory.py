"""Peak memory of sweep's metric computation at a 262k vocabulary (Gemma-3's), one subprocess
per way, on a seeded 2-layer GPT-2 with ``vocab_size=262144`` built offline::

    python -m benchmarks.vocab_memory --batch 8 --seq 128

Reports the peak RSS increment, in units of one ``[batch, pos, vocab]`` float32 tensor, of
three ways to get one edited setting's metrics once the baseline's logits exist:

* ``hidden`` (what ``sweep`` runs now for an edited setting): the edited forward stops at the
  unembedding's input (``tl_directional.model.handle.unembedding``) and
  ``BaselineStats.compare_hidden`` forms the logits a chunk of positions at a time, so no
  edited ``[batch, pos, vocab]`` tensor exists; the edited forward is inside the measurement;
* ``chunked``: ``BaselineStats(base).compare(logits)`` on edited logits that already exist
  (the path where the unembedding is not one linear map of a hook point, e.g. softcapped
  logits); the edited forward is outside the measurement;
* ``unchunked``: the formula chunking replaced (log-softmax of every predicted position at
  once, probabilities kept), on the same existing logits.

The baseline's logits (and, for the last two, the edited logits) exist before the
measurement starts and are not counted; ``BaselineStats`` is built inside it.
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
    from tl_directional.evaluate.sweeps import BaselineStats
    from tl_directional.model.handle import StopForward, unembedding
    from tl_directional.model.load import load_model

    torch.set_num_threads(1)
    model = load_model(model_dir).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=g)
    mask = torch.ones_like(tokens)
    unembed = unembedding(model)
    if way == "hidden" and unembed is None:
        raise RuntimeError("the model's logits are not one unembedding of a hook point")
    with torch.no_grad():
        base = model(tokens, attention_mask=mask)
        edited = None
        if way != "hidden":
            with apply_edits(model, ValueScale(s_par=0.0)):
                edited = model(tokens, attention_mask=mask)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kb("VmRSS")
        if way == "hidden":  # as sweep's _edited_forward + compare_hidden
            got: dict = {}

            def grab(t, hook):  # noqa: ARG001 - TL hook signature
                got["hidden"] = t
                raise StopForward

            stats = BaselineStats(base, tokens, mask)
            with apply_edits(model, ValueScale(s_par=0.0)), model.hooks(fwd_hooks=[(unembed.hook, grab)]):
                try:
                    model(tokens, attention_mask=mask)
                except StopForward:
                    pass
            stats.compare_hidden(got.pop("hidden"), unembed)
        elif way == "chunked":
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
    p.add_argument("--worker", choices=("hidden", "chunked", "unchunked"))
    p.add_argument("--model-dir")
    p.add_argument("--ways", default="hidden,chunked,unchunked")
    p.add_argument("--json", metavar="OUT", help="also write the results (and the command) as JSON")
    a = p.parse_args(argv)
    if a.worker:
        print(MARKER + json.dumps(worker(a.worker, a.model_dir, a.batch, a.seq)), flush=True)
        return 0
    from tl_directional.model.load import build_tiny_hf_model

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "vocab262k"
        build_tiny_hf_model("gpt2", d, vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2,
                            n_ctx=max(128, a.seq))
        env = {"MALLOC_MMAP_THRESHOLD_": "65536"}
        import os

        env = dict(os.environ, **env)
        results = []
        for way in a.ways.split(","):
            out = subprocess.run([sys.executable, "-m", "benchmarks.vocab_memory", "--worker", way,
                                  "--model-dir", str(d), "--batch", str(a.batch), "--seq", str(a.seq)],
                                 capture_output=True, text=True, env=env, check=False)
            line = [x for x in out.stdout.splitlines() if x.startswith(MARKER)]
            if not line:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(line[-1][len(MARKER):])
            results.append(r)
            print(f"{way:10s} batch {a.batch} x seq {a.seq}, vocab {VOCAB}: peak +{r['peak_increment_mb']:.0f} MB"
                  f" = {r['in_bpv_tensors']:.2f} x one [batch, pos, vocab] float32 tensor "
                  f"({r['bpv_tensor_mb']:.0f} MB)")
    if a.json:
        import platform
        import subprocess as sp

        commit = sp.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
        doc = {"command": "python -m benchmarks.vocab_memory " + " ".join(sys.argv[1:] if argv is None else argv),
               "git_commit": commit or None, "python": platform.python_version(),
               "model": "seeded GPT-2, 2 layers, d_model 64, 4 heads, vocab 262144",
               "method": "fresh subprocess per way: VmHWM after - VmRSS before (VmHWM reset via "
                         "/proc/self/clear_refs); glibc MALLOC_MMAP_THRESHOLD_=65536",
               "results": results}
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
