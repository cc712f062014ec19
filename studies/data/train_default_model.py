#!/usr/bin/env python3
"""Train, export and report the bundled default model (``tl_directional/data/default_model``).

Usage (from the repository root)::

    python -m studies.data.train_default_model all --corpus /tmp/kjv --run runs/default-model
    python -m studies.data.train_default_model report          # re-measure the shipped model only

Stages:

* ``corpus``: fetch the KJV text into ``--corpus`` (runs ``studies/data/fetch_corpus.py``; needs
  ``apt-get install bible-kjv``) unless ``SPLIT.json`` is already there.
* ``train``: ``tl_directional.training`` with :data:`DEFAULT_MODEL_CONFIG` (the baseline variant; a
  byte-level BPE tokenizer of 8192 tokens trained on the train split) into ``--run``; resumes
  from the run's last checkpoint when interrupted.
* ``export``: write the trained model in float16 safetensors plus tokenizer to
  ``tl_directional/data/default_model`` (a plain Hugging Face GPT-2 directory).
* ``report``: measure the shipped model (validation / test perplexity when the corpus is there,
  perplexity on the shipped held-out slice always, a few greedy generations) and write
  ``tl_directional/data/default_model/report.json`` and ``docs/default_model_report.md``, which
  the model card (``docs/default_model.md``) links to.
* ``all``: the four in order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from studies import common

ROOT = common.ROOT

from tl_directional.training import (  # noqa: E402
    TOKENIZER_DIR,
    TrainConfig,
    evaluate_text,
    export_model,
    load_tokenizer,
    train,
)

#: The shipped model's training configuration.
DEFAULT_MODEL_CONFIG = dict(
    variant="baseline",
    seed=0,
    vocab_size=8192,
    n_layers=4,
    d_model=256,
    n_heads=4,
    n_ctx=256,
    batch_size=16,
    max_steps=480,
    lr=2e-3,
    min_lr_ratio=0.1,
    warmup_steps=24,
    weight_decay=0.1,
    grad_clip=1.0,
    eval_every=40,
    eval_windows=64,
    ckpt_every=20,
)

MODEL_DIR = ROOT / "tl_directional" / "data" / "default_model"
REPORT_MD = ROOT / "docs" / "default_model_report.md"
PROMPTS = (
    "In the beginning",
    "And the LORD said unto Moses,",
    "Blessed are the",
    "And Jesus answered and said unto them,",
)


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def stage_corpus(corpus: Path) -> None:
    if (corpus / "SPLIT.json").is_file():
        print(f"corpus: {corpus} already fetched")
        return
    subprocess.run([sys.executable, "-m", "studies.data.fetch_corpus", "--out", str(corpus)], cwd=ROOT,
                   check=True)


def stage_train(corpus: Path, run: Path, threads: int | None, max_steps: int | None = None):
    import torch

    if threads:
        torch.set_num_threads(threads)
    settings = dict(DEFAULT_MODEL_CONFIG, **({"max_steps": max_steps} if max_steps else {}))
    cfg = TrainConfig(corpus=str(corpus), **settings)
    t0 = time.time()
    result = train(cfg, run)
    print(f"trained to step {result.step} in {time.time() - t0:.0f} s this process "
          f"({result.tokens_per_s:.0f} tokens/s), final validation loss {result.final_val_loss:.4f}")
    return result


def stage_export(run: Path, result=None) -> None:
    import torch

    from tl_directional.model.load import load_model
    from tl_directional.training import (
        CHECKPOINT_DIR,
        INIT_DIR,
        checkpoint_paths,
        load_canonical_state_dict_,
        read_checkpoint,
    )

    tokenizer = load_tokenizer(run / TOKENIZER_DIR)
    ckpts = checkpoint_paths(run)
    if not ckpts:
        raise SystemExit(f"no checkpoint in {run / CHECKPOINT_DIR}; run the train stage first")
    meta, tensors = read_checkpoint(ckpts[-1])
    cfg = TrainConfig.from_dict(meta["config"])
    if meta["step"] != cfg.max_steps:
        raise SystemExit(f"{ckpts[-1]} is at step {meta['step']} of {cfg.max_steps}; finish training first")
    model = load_model(run / INIT_DIR)
    load_canonical_state_dict_(model, {k[6:]: v for k, v in tensors.items() if k.startswith("model/")},
                               source=str(ckpts[-1]))
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    info = {
        "name": "tl-directional default model",
        "train_config": meta["config"],
        "trained_steps": meta["step"],
        "tokens_seen": meta["tokens_seen"],
        "final_val_loss": meta["metrics"][-1]["val_loss"],
        "corpus": summary.get("corpus"),
        "tokenizer_sha256": meta["tokenizer_sha256"],
        "command": "python scripts/train_default_model.py all --corpus CORPUS_DIR --run RUN_DIR",
    }
    export_model(model, tokenizer, MODEL_DIR, dtype=torch.float16, extra_info=info, force=True)  # replaces the bundled copy
    # The validation curve travels with the model (small CSV).
    (MODEL_DIR / "training_curve.csv").write_text((run / "metrics.csv").read_text())
    os.chmod(MODEL_DIR / "training_curve.csv", 0o644)
    size = sum(f.stat().st_size for f in MODEL_DIR.iterdir())
    print(f"exported {MODEL_DIR} ({size / 1e6:.1f} MB)")


REFERENCE_PROMPT = "In the beginning God created the heaven and the earth."


def write_reference_logits(top_k: int = 8) -> None:
    """Plain-transformers logits of :data:`REFERENCE_PROMPT` (float32), top-k per position plus
    the logsumexp, so tests on either TransformerLens lane compare against the same numbers."""
    import torch

    from tl_directional.model.load import load_hf_model
    from tl_directional.training import load_tokenizer

    tok = load_tokenizer(MODEL_DIR)
    ids = [tok.bos_token_id] + tok.backend_tokenizer.encode(REFERENCE_PROMPT).ids
    hf = load_hf_model(MODEL_DIR)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].double()
    top = logits.topk(top_k, dim=-1)
    ref = {"prompt": REFERENCE_PROMPT, "tokens": ids, "source": "transformers GPT2LMHeadModel, float32",
           "top_ids": top.indices.tolist(), "top_logits": top.values.tolist(),
           "logsumexp": logits.logsumexp(-1).tolist()}
    (MODEL_DIR / "reference_logits.json").write_text(json.dumps(ref, indent=1) + "\n")


def stage_report(corpus: Path | None) -> dict:
    import torch

    from tl_directional.io.corpus import heldout_info, heldout_text, load_split
    from tl_directional.model.load import load_model, tl_lane

    model = load_model(MODEL_DIR)
    report: dict = {"model_dir": "tl_directional/data/default_model", "lane": tl_lane()}
    from safetensors import safe_open

    with safe_open(str(MODEL_DIR / "model.safetensors"), "pt") as f:  # tied weights stored once
        report["n_params"] = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    report["safetensors_bytes"] = (MODEL_DIR / "model.safetensors").stat().st_size
    report["heldout_slice"] = evaluate_text(model, heldout_text())
    report["heldout_slice_is_whole_test_split"] = bool(heldout_info().get("complete"))
    if corpus is not None and (corpus / "SPLIT.json").is_file():
        for split in ("validation", "test"):
            report[split] = evaluate_text(model, load_split(corpus, split))
    samples = []
    for i, prompt in enumerate(PROMPTS):
        # No KV cache: TransformerLens 4.3 bridges give wrong logits with it for GPT-2 (README).
        with torch.no_grad():
            greedy = model.generate(prompt, max_new_tokens=40, do_sample=False, use_past_kv_cache=False,
                                    verbose=False)
            torch.manual_seed(i)
            sampled = model.generate(prompt, max_new_tokens=40, do_sample=True, temperature=0.8, top_k=40,
                                     use_past_kv_cache=False, verbose=False)
        samples.append({"prompt": prompt, "greedy": greedy, "sampled": sampled})
    report["samples"] = samples
    write_reference_logits()
    info = json.loads((MODEL_DIR / "tl_directional_build.json").read_text())
    report["train"] = {k: info.get(k) for k in ("trained_steps", "tokens_seen", "final_val_loss")}
    (MODEL_DIR / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# Default model: measured numbers", "",
             "Generated by `python -m studies.data.train_default_model report --corpus CORPUS_DIR` "
             "from the shipped model; do not edit by hand.", "",
             "| text | windows | tokens scored | loss (nats/token) | perplexity |", "|---|---|---|---|---|"]
    for key, label in (("validation", "KJV validation split (8 books)"), ("test", "KJV test split (5 books)"),
                       ("heldout_slice", "shipped held-out slice (`kjv_heldout.txt`)")):
        if key in report:
            r = report[key]
            lines.append(f"| {label} | {r['windows']} | {r['tokens_scored']} | {r['loss']:.4f} | "
                         f"{r['perplexity']:.2f} |")
    if report.get("heldout_slice_is_whole_test_split"):
        lines += ["", "The shipped held-out slice is the whole test split (it is under the slice's "
                  "size limit), so those two rows agree."]
    lines += ["", f"Parameters: {report['n_params']:,}; `model.safetensors`: "
              f"{report['safetensors_bytes'] / 1e6:.2f} MB (float16).", "",
              "## Generations (40 new tokens; no KV cache)", "",
              "Greedy decoding of a model this small loops quickly; the sampled lines "
              "(temperature 0.8, top-k 40, `torch.manual_seed(i)` for prompt i) show more of what "
              "it learned. Newlines are shown as ` / `.", ""]
    for s in samples:
        lines.append(f"- greedy: {s['greedy'].replace(chr(10), ' / ')}")
        lines.append(f"- sampled: {s['sampled'].replace(chr(10), ' / ')}")
    REPORT_MD.parent.mkdir(parents=True, exist_ok=True)
    REPORT_MD.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("stage", choices=("corpus", "train", "export", "report", "all"))
    p.add_argument("--corpus", type=Path, default=None, help="KJV corpus directory (fetch_corpus.py --out)")
    p.add_argument("--run", type=Path, default=ROOT / "runs" / "default-model", help="training run directory")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None,
                   help=f"override the shipped model's {DEFAULT_MODEL_CONFIG['max_steps']} steps (experiments)")
    args = p.parse_args(argv)
    if args.stage in ("corpus", "train", "all") and args.corpus is None:
        p.error("--corpus DIR is needed for this stage")
    if args.stage in ("corpus", "all"):
        stage_corpus(args.corpus)
    if args.stage in ("train", "all"):
        stage_train(args.corpus, args.run, args.threads, args.max_steps)
    if args.stage in ("export", "all"):
        stage_export(args.run)
    if args.stage in ("report", "all"):
        stage_report(args.corpus)
    return 0


if __name__ == "__main__":
    common.run_main(main)
