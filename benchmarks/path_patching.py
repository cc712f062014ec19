"""Path patching against TransformerLens's own direct path patching.

``path_patching_vs_transformer_lens``: :func:`tl_directional.path_patch` of one source head
(layer 0, head 0) into the query input of every later head (``receivers="q"``, ``parts="full"``) /
``transformer_lens.patching.get_act_patch_direct_path`` (TransformerLens 4.3) on the same prompt
pair and metric, both given the same caches to build (each call caches the clean and corrupted
runs itself), equal results checked (within the float32 round-off bound of
:func:`tl_directional.core.roundoff.roundoff_tolerance`). TransformerLens runs one full forward per later head
with per-head copies of every block's input (``use_split_qkv_input``); ``path_patch`` starts each
forward at the receiver's block, stacks the receivers of a block along the batch and computes
their inputs from one shadow copy. The parallel-only and perpendicular-only paths (which
TransformerLens cannot run) are timed once each after the pairs, in ``extra``. Queries only:
TransformerLens refuses key / value receivers on grouped-query models (``path_patch`` takes them
per key/value head).

The prompt pair: the first ``n = min(PATH_SEQ, seq)`` tokens of the setting's first sequence
(clean; at least :data:`~benchmarks.patching.MIN_PATCH_SEQ`) and the same tokens with the one at
position ``n // 2`` replaced (corrupted); the metric is the last position's logit difference
between two fixed tokens. TransformerLens's forwards are one per later head whatever ``n``; a
shorter prompt makes each forward cheaper.

``path_patching_late_sender_vs_transformer_lens``: the same body (one parameter) with the sender
at layer ``n_layers - 1 - LATE_RECEIVER_LAYERS`` on both sides, so both patch only the last
layers' heads: the scaling family's reduced workload, where the layer-0 record's ``(n_layers - 1)
n_heads`` TransformerLens forwards per call do not fit a CPU session at 360M-1.5B parameters.
"""

from __future__ import annotations

import importlib
import statistics
import time

import torch

from tl_directional.core.roundoff import roundoff_tolerance

from .patching import MIN_PATCH_SEQ
from .registry import Bench, NotAvailable, register

#: Most tokens in the patched prompt (a setting with shorter sequences patches all of its tokens).
PATH_SEQ = 15


def _pair(model, tokens: torch.Tensor):
    clean = tokens[:1, :PATH_SEQ].clone()
    corrupted = clean.clone()
    pos = clean.shape[1] // 2
    corrupted[0, pos] = (int(clean[0, pos]) + 1) % int(model.cfg.d_vocab)

    def metric(logits):
        return logits[0, -1, 1] - logits[0, -1, 2]

    return clean, corrupted, metric


#: Receiver layers of ``path_patching_late_sender_vs_transformer_lens``: the sender is head 0 of
#: layer ``n_layers - 1 - LATE_RECEIVER_LAYERS``, so both sides patch ``LATE_RECEIVER_LAYERS x
#: n_heads`` receivers (TransformerLens one full forward each) instead of ``(n_layers - 1) x n_heads``.
LATE_RECEIVER_LAYERS = 1

_BASELINE = ("transformer_lens.patching.get_act_patch_direct_path(model, corrupted, clean_cache, "
             "corrupted_cache, metric, {layer}, 0, 'q'): one full forward per later head, per-head block inputs")
_CANDIDATE = ("tl_directional.path_patch(model, clean, corrupted, metric, sender=('head', {layer}, 0), "
              "receivers='q', parts='full'): forwards from the receiver's block, receivers stacked, one shadow copy")


@register(
    "path_patching_vs_transformer_lens",
    target=0.25,
    op="<=",
    precision=0.05,
    primary_only=True,
    floor_pairs=3,
    baseline=_BASELINE.format(layer=0),
    candidate=_CANDIDATE.format(layer=0),
)
def path_patching_vs_transformer_lens(bench: Bench):
    """Direct path patching of one head into every later head's query: ``path_patch`` /
    TransformerLens's ``get_act_patch_direct_path``, equal results checked."""
    return _path_patching_timing(bench, receiver_layers=None)


@register(
    "path_patching_late_sender_vs_transformer_lens",
    target=0.25,
    op="<=",
    precision=0.05,
    primary_only=True,
    floor_pairs=3,
    baseline=_BASELINE.format(layer=f"n_layers - {LATE_RECEIVER_LAYERS + 1}"),
    candidate=_CANDIDATE.format(layer=f"n_layers - {LATE_RECEIVER_LAYERS + 1}"),
)
def path_patching_late_sender_vs_transformer_lens(bench: Bench):
    """The same comparison with the sender moved late (the reduced workload of the scaling
    family's 1B+ builds): head 0 of layer ``n_layers - 1 - LATE_RECEIVER_LAYERS`` into every head
    of the last :data:`LATE_RECEIVER_LAYERS` layers, both sides the same sender and receivers.

    Not the same ratio as the layer-0 record: TransformerLens's forwards stay full forwards while
    ``path_patch`` starts each at the receiver's block (here the last), but with few receivers
    ``path_patch``'s fixed cost (its own clean and corrupted runs, the split) weighs more; on
    smollm2-135m, where both ran, the late sender's ratio is the higher one (docs/performance.md)."""
    return _path_patching_timing(bench, receiver_layers=LATE_RECEIVER_LAYERS)


def _path_patching_timing(bench: Bench, *, receiver_layers: int | None):
    """Time ``path_patch`` against ``get_act_patch_direct_path`` from head 0 of the sender layer:
    layer 0 when ``receiver_layers`` is None, else ``n_layers - 1 - receiver_layers`` (at least 0);
    the receivers are the query inputs of every head after it on both sides."""
    tl_patching = importlib.import_module("transformer_lens.patching")
    if not hasattr(tl_patching, "get_act_patch_direct_path"):
        raise NotAvailable(
            "transformer_lens.patching has no get_act_patch_direct_path here (needs 4.3)"
        )
    from tl_directional.evaluate.patching import path_patch
    from tl_directional.model.sites import resolve_sites
    from tl_directional.model.structure import is_sandwich_norm

    model = bench.model
    sites = resolve_sites(model, warn=False)
    if not sites.causal or sites.n_layers < 2:
        raise NotAvailable(f"{sites.model_name}: needs a causal LM with at least two blocks")
    if is_sandwich_norm(model):
        raise NotAvailable("TransformerLens refuses direct path patching on sandwich-norm models")
    tokens = bench.inputs.tokens.to(bench.device)
    if tokens.shape[1] < MIN_PATCH_SEQ:
        raise NotAvailable(f"the setting's sequences have {tokens.shape[1]} tokens; path patching needs at "
                           f"least {MIN_PATCH_SEQ}")
    clean, corrupted, metric = _pair(model, tokens)
    sender = 0 if receiver_layers is None else max(0, sites.n_layers - 1 - receiver_layers)

    def base():
        with torch.no_grad():
            _, c_cache = model.run_with_cache(clean)
            _, x_cache = model.run_with_cache(corrupted)
        return tl_patching.get_act_patch_direct_path(
            model, corrupted, c_cache, x_cache, metric, sender, 0, "q", verbose=False
        )

    def run(part="full"):
        res = path_patch(
            model, clean, corrupted, metric, sender=("head", sender, 0), receivers="q", parts=part
        )
        return res.values["q"][part][0] + res.corrupted_metric[0]

    if bench.check:
        t0 = time.perf_counter()
        want = base()
        tl_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = torch.as_tensor(run())
        ours_s = time.perf_counter() - t0
        # rows up to the sender's layer are TransformerLens's 0.0 placeholders and our NaN
        diff = float((got[sender + 1:] - want[sender + 1:].detach().cpu().double()).abs().max())
        # both sides are float32 forwards batched differently: the bound is their round-off
        limit = roundoff_tolerance(next(model.parameters()).dtype, float(want.abs().max()), model.cfg.d_model * sites.n_layers)
        if not diff <= limit:
            raise AssertionError(
                f"path_patch differs from get_act_patch_direct_path by {diff:g} (> {limit:.3g}, "
                "the float32 round-off bound)"
            )
        bench.extra.update(
            {
                "check_max_abs_diff_vs_transformer_lens": diff,
                "prompt_tokens": int(clean.shape[1]),
                "sender_layer": sender,
                "receivers": (sites.n_layers - 1 - sender) * sites.n_heads,
                "check_call_s": {"transformer_lens": tl_s, "path_patch_full": ours_s},
            }
        )
    timing = bench.measure(base, run)
    tl_median = statistics.median(timing.baseline_s)
    variants = {}
    for part in ("par", "perp"):
        t0 = time.perf_counter()
        run(part)
        s = time.perf_counter() - t0
        variants[part] = {"seconds": s, "over_transformer_lens_median": s / tl_median}
    bench.extra["variants_timed_once"] = variants
    return timing


__all__ = ["LATE_RECEIVER_LAYERS", "PATH_SEQ", "path_patching_late_sender_vs_transformer_lens",
           "path_patching_vs_transformer_lens"]
