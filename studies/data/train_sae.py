#!/usr/bin/env python3
"""Train the bundled SAE with SAELens's own training API (issue 48).

Usage (from the repository root, in a legacy-lane venv with SAELens: ``make venv LANE=legacy``)::

    python -m studies.data.train_sae              # train, save, measure (a few CPU minutes)
    python -m studies.data.train_sae --measure    # re-measure the shipped SAE only

What it builds: a standard (ReLU, L1-penalised) sparse autoencoder on the residual stream of the
bundled default model (``tld.load_model()``, a 4-layer GPT-2, d_model 256) at
``blocks.2.hook_resid_pre``, trained by ``sae_lens.LanguageModelSAETrainingRunner`` (its
``LanguageModelSAERunnerConfig``; the model and the tokenised dataset are handed to the runner,
everything else is SAELens's loop: activation store, mixing buffer, Adam, L1 warm-up, activation
norm scaling folded into the weights at the end). Seeded (``torch.manual_seed`` before the SAE
is initialised and the buffer shuffled), CPU, float32.

Data: the bundled King James held-out slice (``tl_directional/data/kjv_heldout.txt``, which
the default model never trained on), cut by line: the first :data:`TRAIN_FRACTION` of its
lines train the SAE, the rest is held out for the quality figures. Windows of
:data:`CONTEXT` tokens, each starting with the model's BOS token; BOS positions (the attention
sink, METHOD.md sec. 1) are excluded from training (SAELens ``exclude_special_tokens``) and from
the figures.

Output, in SAELens's saved format, into :data:`OUT_DIR` (package data, so every lane finds it):
``sae_weights.safetensors`` + ``cfg.json`` (what ``SAE.load_from_disk`` reads),
``sparsity.safetensors`` and ``runner_cfg.json`` (what the runner writes beside them), and
``quality.json``: explained variance, L0, dead features and the cross-entropy with the SAE
spliced in, on the held-out and the training windows, the sha256 of every file, the versions
and the command. The model was loaded unprocessed (tl_directional's loader: no folding, no
centring), which the cfg records in ``metadata.model_from_pretrained_kwargs``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from studies import common

ROOT = common.ROOT

#: Where the SAE is written (inside the package: ``tl_directional.measure.sae.BUNDLED_SAE``).
OUT_DIR = ROOT / "tl_directional" / "data" / "sae" / "default-blocks.2.hook_resid_pre"
LAYER = 2
HOOK = f"blocks.{LAYER}.hook_resid_pre"
D_SAE = 512
CONTEXT = 128
TRAIN_FRACTION = 0.85
SEED = 0
#: SAELens's training settings (every other field keeps SAELens's default).
TRAINING = dict(
    training_tokens=600_000,
    train_batch_size_tokens=1024,
    store_batch_size_prompts=16,
    n_batches_in_buffer=16,
    lr=1e-3,
    lr_warm_up_steps=20,
    lr_scheduler_name="constant",
    n_batches_for_norm_estimate=16,
    feature_sampling_window=200,
    dead_feature_window=200,
)
L1_COEFFICIENT = 4.0
L1_WARM_UP_STEPS = 60
#: How tl_directional's loader builds the model (every TransformerLens processing step off);
#: recorded in the SAE's cfg as SAELens records ``from_pretrained`` keywords.
UNPROCESSED = {"fold_ln": False, "center_writing_weights": False, "center_unembed": False,
               "fold_value_biases": False, "refactor_factored_attn_matrices": False}


def split_text() -> tuple[str, str]:
    """``(train, heldout)``: the bundled held-out KJV slice cut by line at TRAIN_FRACTION."""
    from tl_directional.io.corpus import heldout_text

    lines = heldout_text().splitlines(keepends=True)
    cut = int(len(lines) * TRAIN_FRACTION)
    return "".join(lines[:cut]), "".join(lines[cut:])


def windows(model, text: str):
    """``[n, CONTEXT]`` token windows of ``text``, each BOS + ``CONTEXT - 1`` tokens."""
    import torch

    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    step = CONTEXT - 1
    n = len(ids) // step
    body = torch.tensor(ids[: n * step], dtype=torch.long).reshape(n, step)
    bos = torch.full((n, 1), int(model.tokenizer.bos_token_id), dtype=torch.long)
    return torch.cat([bos, body], dim=1)


def train(model, train_tokens, out: Path) -> float:
    """Run SAELens's training runner; returns the seconds it took."""
    import torch
    from datasets import Dataset
    from sae_lens import (
        LanguageModelSAERunnerConfig,
        LanguageModelSAETrainingRunner,
        LoggingConfig,
        StandardTrainingSAEConfig,
    )

    torch.manual_seed(SEED)
    dataset = Dataset.from_dict({"tokens": train_tokens.tolist()})
    cfg = LanguageModelSAERunnerConfig(
        sae=StandardTrainingSAEConfig(d_in=int(model.cfg.d_model), d_sae=D_SAE,
                                      l1_coefficient=L1_COEFFICIENT, l1_warm_up_steps=L1_WARM_UP_STEPS,
                                      normalize_activations="expected_average_only_in"),
        model_name="default", model_class_name="HookedTransformer", hook_name=HOOK,
        dataset_path="tl_directional/data/kjv_heldout.txt (first 85% of lines)",
        is_dataset_tokenized=True, streaming=False, context_size=CONTEXT, prepend_bos=True,
        exclude_special_tokens=True, device="cpu", seed=SEED, dtype="float32",
        model_from_pretrained_kwargs=dict(UNPROCESSED), logger=LoggingConfig(log_to_wandb=False),
        checkpoint_path=None, output_path=str(out), verbose=False, **TRAINING)
    t0 = time.time()
    LanguageModelSAETrainingRunner(cfg, override_dataset=dataset, override_model=model).run()
    return time.time() - t0


def quality(model, sae, tokens) -> dict:
    """Reconstruction figures of ``sae`` on ``tokens`` (BOS positions excluded)."""
    import torch

    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=HOOK)
        x = cache[HOOK][:, 1:].reshape(-1, int(model.cfg.d_model)).double()
        acts = sae.encode(x.float())
        x_hat = sae.decode(acts).double()
        resid = ((x - x_hat) ** 2).sum()
        total = ((x - x.mean(0)) ** 2).sum()
        l0 = (acts > 0).sum(-1).double()
        fired = (acts > 0).any(0)
        clean = float(model(tokens, return_type="loss"))
        spliced = float(model.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(
            HOOK, lambda a, hook: torch.cat([a[:, :1], sae.decode(sae.encode(a[:, 1:]))], 1))]))
        zeroed = float(model.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(
            HOOK, lambda a, hook: torch.cat([a[:, :1], torch.zeros_like(a[:, 1:])], 1))]))
    return {
        "tokens": int(x.shape[0]),
        "explained_variance": float(1 - resid / total),
        "relative_mse": float(resid / (x * x).sum()),
        "l0_mean": float(l0.mean()),
        "l0_median": float(l0.median()),
        "dead_features": int((~fired).sum()),
        "ce_loss_clean": clean,
        "ce_loss_with_sae": spliced,
        "ce_loss_zero_ablation": zeroed,
        "ce_loss_recovered": (zeroed - spliced) / (zeroed - clean),
    }


#: The reference tokens (``reference`` in quality.json): this many tokens of this many held-out windows.
REFERENCE_SHAPE = (2, 24)


def hooked_sae_model(model):
    """``model`` (a legacy ``HookedTransformer``) as SAELens's ``HookedSAETransformer``: the same
    config and weights, the same tokenizer."""
    from sae_lens import HookedSAETransformer

    hooked = HookedSAETransformer(model.cfg, tokenizer=model.tokenizer)
    hooked.load_state_dict(model.state_dict(), strict=False)
    return hooked.eval()


def reference(model, sae, tokens) -> dict:
    """What SAELens's ``HookedSAETransformer`` computes at the SAE's hook on a few held-out tokens
    (``hook_sae_recons``, ``hook_sae_error`` with ``use_error_term=True``): per token the norms
    of the stream, the reconstruction and the error, and the reconstruction's ``alpha`` against
    the stream. The bridge lane, without SAELens, is checked against these numbers
    (tests/integration/test_sae.py)."""
    import torch

    tokens = tokens[: REFERENCE_SHAPE[0], : REFERENCE_SHAPE[1]]
    with torch.no_grad():
        _, cache = hooked_sae_model(model).run_with_cache_with_saes(tokens, saes=[sae], use_error_term=True)
    x = cache[f"{HOOK}.hook_sae_input"].double()
    recon = cache[f"{HOOK}.hook_sae_recons"].double()
    error = cache[f"{HOOK}.hook_sae_error"].double()
    alpha = (recon * x).sum(-1) / (x * x).sum(-1)
    return {"tokens": tokens.tolist(),
            **{name: [[float(f"{v:.7g}") for v in row] for row in t.tolist()] for name, t in (
                ("stream_norm", x.norm(dim=-1)), ("recon_norm", recon.norm(dim=-1)),
                ("error_norm", error.norm(dim=-1)), ("recon_alpha", alpha))}}


def measure(model, out: Path, seconds: float | None) -> dict:
    """Load the saved SAE with SAELens and write ``quality.json`` beside it."""
    from importlib.metadata import version

    import torch
    from sae_lens import SAE

    train_text, heldout = split_text()
    sae = SAE.load_from_disk(str(out), device="cpu")
    if seconds is None and (out / "quality.json").is_file():  # re-measuring: keep the training's time
        seconds = json.loads((out / "quality.json").read_text())["training"].get("seconds")
    report = {
        "what": f"SAELens standard SAE on the bundled default model's {HOOK}",
        "command": "python -m studies.data.train_sae",
        "definitions": {
            "explained_variance": "1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2 over non-BOS tokens",
            "relative_mse": "sum ||x - x_hat||^2 / sum ||x||^2",
            "l0": "features with activation > 0 per token",
            "ce_loss_recovered": "(zero-ablation CE - CE with SAE) / (zero-ablation CE - clean CE), BOS kept",
        },
        "heldout": quality(model, sae, windows(model, heldout)),
        "reference": reference(model, sae, windows(model, heldout)),
        "train": quality(model, sae, windows(model, train_text)),
        "training": {"seed": SEED, "d_sae": D_SAE, "context_size": CONTEXT,
                     "l1_coefficient": L1_COEFFICIENT, "train_fraction_of_lines": TRAIN_FRACTION,
                     **TRAINING, "seconds": None if seconds is None else round(seconds, 1),
                     "threads": torch.get_num_threads()},
        "versions": {name: version(name).split("+")[0] for name in ("sae-lens", "transformer-lens", "torch")},
        "files": {p.name: common.sha256_bytes(p.read_bytes()) for p in sorted(out.iterdir())
                  if p.name != "quality.json"},
    }
    (out / "quality.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: the bundled SAE's)")
    parser.add_argument("--measure", action="store_true", help="only re-measure the saved SAE")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    import torch

    from tl_directional.model.load import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model("default", lane="legacy")
    seconds = None
    if not args.measure:
        train_tokens = windows(model, split_text()[0])
        seconds = train(model, train_tokens, args.out)
        # the runner's config holds the machine's paths and the run's own name; keep what it says
        # about the SAE and the data, drop the absolute output path
        runner = json.loads((args.out / "runner_cfg.json").read_text())
        runner["output_path"] = os.path.relpath(args.out, ROOT)
        (args.out / "runner_cfg.json").write_text(json.dumps(runner, indent=1, sort_keys=True) + "\n")
    report = measure(model, args.out, seconds)
    print(json.dumps({k: report[k] for k in ("heldout", "train")}, indent=1))
    return 0


if __name__ == "__main__":
    common.run_main(main)
