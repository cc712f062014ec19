"""Activation patching against TransformerLens's own helper.

``patching_vs_transformer_lens``: :func:`tl_directional.evaluate.patching.patching.directional_patch` full-update
patching of the residual stream (``components=("resid_pre",)``, ``which="full"``) at every layer
and every position / ``transformer_lens.patching.get_act_patch_resid_pre`` on the same prompt
pair and metric (one forward per layer x position), equal results checked (within the float32 round-off bound of
:func:`tl_directional.core.roundoff.roundoff_tolerance`). The
parallel-only and perpendicular-only variants (which TransformerLens cannot run) are timed
once each after the pairs, as ratios to the median TransformerLens time, in ``extra``.

The prompt pair: the first ``n = min(PATCH_SEQ, seq)`` tokens of the setting's first sequence
(clean; ``--setting 8x1`` patches an 8-token prompt, which is how the scaling family keeps
TransformerLens's ``n_layers x n`` forwards affordable on the 1B+ builds) and the same tokens with
the one at position ``n // 2`` replaced (corrupted); the
metric is the last position's logit difference between the clean run's top token and the
corrupted run's top token (the clean run's second when they agree). The record runs on the
primary setting only: one TransformerLens call is ``n_layers x PATCH_SEQ`` forwards (450 on
SmolLM2-135M, minutes on one loaded core); ``--warmup 0 --min-pairs 2 --max-pairs 2`` keeps
a real-model run to a few pairs (the equality check has already called both once).
"""

from __future__ import annotations

import importlib
import statistics
import time

import torch

from tl_directional.core.roundoff import roundoff_tolerance

from .registry import Bench, NotAvailable, register

#: Most tokens in the patched prompt (15 x 30 layers = 450 TransformerLens forwards on SmolLM2);
#: a setting with shorter sequences patches all of its tokens.
PATCH_SEQ = 15
#: Fewest tokens a patched prompt may have (a corrupted position with tokens on both sides).
MIN_PATCH_SEQ = 3


def _prompt_pair(model, tokens: torch.Tensor):
    """``(clean, corrupted, metric, corrupted_position)`` from one token row: its first
    ``min(PATCH_SEQ, len)`` tokens, the middle one replaced in the corrupted prompt."""
    if tokens.shape[1] < MIN_PATCH_SEQ:
        raise NotAvailable(f"the setting's sequences have {tokens.shape[1]} tokens; patching needs at least "
                           f"{MIN_PATCH_SEQ}")
    clean = tokens[:1, :PATCH_SEQ].clone()
    pos = clean.shape[1] // 2
    corrupted = clean.clone()
    d_vocab = int(model.cfg.d_vocab)
    corrupted[0, pos] = (int(clean[0, pos]) + 1) % d_vocab
    with torch.no_grad():
        top_c = model(clean)[0, -1].topk(2).indices.tolist()
        top_x = int(model(corrupted)[0, -1].argmax())
    a = top_c[0]
    b = top_x if top_x != a else top_c[1]

    def metric(logits):
        return logits[0, -1, a] - logits[0, -1, b]

    return clean, corrupted, metric, pos


@register(
    "patching_vs_transformer_lens", target=0.20, op="<=", precision=0.05, primary_only=True,
    floor_pairs=3,
    baseline="transformer_lens.patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric): "
             "one full forward per layer x position",
    candidate="directional_patch(model, clean, corrupted, metric, components=('resid_pre',), "
              "per_position=True, which='full'): cached runs, forwards from block L, stacked patches",
)
def patching_vs_transformer_lens(bench: Bench):
    """Full-update activation patching of the residual stream at every layer and position of
    one prompt pair: ``directional_patch`` / TransformerLens's ``get_act_patch_resid_pre``
    (clean cache included in both calls), equal results checked; the parallel-only and
    perpendicular-only variants timed beside it."""
    try:
        tl_patching = importlib.import_module("transformer_lens.patching")
    except ImportError as exc:
        raise NotAvailable(f"transformer_lens.patching cannot be imported here: {exc}") from None
    from tl_directional.evaluate.patching import directional_patch
    from tl_directional.model.sites import resolve_sites

    model = bench.model
    sites = resolve_sites(model, warn=False)
    if not sites.causal:
        raise NotAvailable(f"{sites.model_name} is not a causal LM: the record's metric is a next-token "
                           "logit difference")
    missing = [f"blocks.{L}.hook_resid_pre" for L in range(sites.n_layers)
               if f"blocks.{L}.hook_resid_pre" not in model.hook_dict]
    if missing:
        raise NotAvailable(f"the model has no {missing[0]} hook point (TransformerLens's resid_pre patching "
                           "needs one per block)")
    tokens = bench.inputs.tokens.to(bench.device)
    clean, corrupted, metric, pos = _prompt_pair(model, tokens)

    def base():
        with torch.no_grad():
            _, cache = model.run_with_cache(clean)
        return tl_patching.get_act_patch_resid_pre(model, corrupted, cache, metric)

    def run(which):
        return directional_patch(model, clean, corrupted, metric, components=("resid_pre",),
                                 per_position=True, which=which)[0]["resid_pre"][which]

    if bench.check:
        t0 = time.perf_counter()
        want = base()
        tl_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = run("full")
        full_s = time.perf_counter() - t0
        diff = float((got - want.detach().cpu().float()).abs().max())
        # both sides are float32 forwards batched differently: the bound is their round-off
        limit = roundoff_tolerance(next(model.parameters()).dtype, float(want.abs().max()), model.cfg.d_model * sites.n_layers)
        if not diff <= limit:
            raise AssertionError(
                f"directional_patch differs from get_act_patch_resid_pre by {diff:g} (> {limit:.3g}, "
                "the float32 round-off bound)"
            )
        with torch.no_grad():
            _, c_cache = model.run_with_cache(clean)
            _, x_cache = model.run_with_cache(corrupted)
        same = sum(int(torch.equal(c_cache[f"blocks.{L}.hook_resid_pre"][:, p], x_cache[f"blocks.{L}.hook_resid_pre"][:, p]))
                   for L in range(sites.n_layers) for p in range(clean.shape[1]))
        del c_cache, x_cache
        bench.extra.update({
            "check_max_abs_diff_vs_transformer_lens": diff,
            "prompt_tokens": int(clean.shape[1]),
            "corrupted_position": pos,
            "n_layers": sites.n_layers,
            "patched_runs": sites.n_layers * int(clean.shape[1]),
            "runs_equal_to_corrupted_run": same,
            "note_runs_equal_to_corrupted_run": "(layer, position) pairs where clean and corrupted resid_pre "
                                                "agree bitwise: the patch changes nothing, so directional_patch "
                                                "takes the corrupted run's metric without a forward",
            "check_call_s": {"transformer_lens": tl_s, "directional_patch_full": full_s},
        })
    timing = bench.measure(base, lambda: run("full"))
    tl_median = statistics.median(timing.baseline_s)
    variants = {}
    for which in ("par", "perp"):
        t0 = time.perf_counter()
        run(which)
        s = time.perf_counter() - t0
        variants[which] = {"seconds": s, "over_transformer_lens_median": s / tl_median}
    bench.extra["variants_timed_once"] = variants
    return timing


__all__ = ["MIN_PATCH_SEQ", "PATCH_SEQ", "patching_vs_transformer_lens"]
