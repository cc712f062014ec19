"""Full parallel / perpendicular removal inside the MLP (the two carrier sites) against the residual
MLP edit, on a real model: the revision's "MLP-Internal Geometry" table (Qwen3-0.6B on C4:
+0.1165 residual MLP, +0.0301 carrier input site, +0.0037 carrier block site for No-Para) restated
on this library's models and held-out text.

Each window is one sequence of the held-out KJV slice; the loss is the token-weighted mean
next-token NLL of the window, and each edit's change is edited minus unedited, per window. Printed:
the mean over windows with a 95% t interval, and the carrier blocks' parallel share per layer
(mean over layers). A quick look, not a committed result (no rule written before the run).

    TL_DIRECTIONAL_CACHE=... python -m studies.explore.mlp_carrier_removal --model smollm2-135m --windows 8
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import tl_directional as tld
from tl_directional.core.student_t import t_quantile
from tl_directional.io.corpus import chunk_text, heldout_text
from tl_directional.measure.carrier import carrier_profile

EDITS = {
    "resid-mlp": lambda sp, sq: tld.ResidualScale("mlp", sp, sq),
    "mlp-carrier-input": lambda sp, sq: tld.MLPCarrierScale(sp, sq, site="input"),
    "mlp-carrier-block": lambda sp, sq: tld.MLPCarrierScale(sp, sq, site="block"),
}


def window_losses(model, batch, edit=None) -> torch.Tensor:
    """Per-window mean next-token NLL, ``[windows]``, float64."""
    with torch.no_grad():
        if edit is None:
            logits = model(batch.tokens, attention_mask=batch.attention_mask)
        else:
            with tld.apply_edits(model, edit):
                logits = model(batch.tokens, attention_mask=batch.attention_mask)
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    nll = -logp.gather(-1, batch.tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    m = (batch.attention_mask[:, 1:] * batch.attention_mask[:, :-1]).double()
    return (nll * m).sum(-1) / m.sum(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--chars", type=int, default=600, help="characters per window")
    args = ap.parse_args()
    t0 = time.process_time()
    torch.manual_seed(0)
    model = tld.load_model(args.model).eval()
    texts = chunk_text(heldout_text(), args.chars)[: args.windows]
    batch = tld.prepare_inputs(model, texts)
    base = window_losses(model, batch)
    n = len(texts)
    q = t_quantile(0.975, n - 1)
    print(f"model {args.model}: d_model {model.cfg.d_model}, d_mlp {model.blocks[0].mlp.W_out.shape[0]}, "
          f"{n} windows, {int(batch.attention_mask.sum())} tokens, base loss {base.mean():.4f}")
    print(f"{'edit':<20} {'No-Para dloss':>28} {'No-Perp dloss':>28}")
    for name, make in EDITS.items():
        cells = []
        for sp, sq in ((0.0, 1.0), (1.0, 0.0)):
            d = window_losses(model, batch, make(sp, sq)) - base
            half = q * float(d.std(unbiased=True)) / math.sqrt(n)
            cells.append(f"{float(d.mean()):+.4f} [{float(d.mean()) - half:+.4f}, {float(d.mean()) + half:+.4f}]")
        print(f"{name:<20} {cells[0]:>28} {cells[1]:>28}")
    table = carrier_profile(model, texts)
    print(f"carrier parallel share, mean over layers: input site {table['carrier_input_par_share'].mean():.4f}, "
          f"block site {table['carrier_block_par_share'].mean():.4f} (1/d_model = {1 / model.cfg.d_model:.4f})")
    print(f"CPU time {time.process_time() - t0:.0f} s")


if __name__ == "__main__":
    main()
