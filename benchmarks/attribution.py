"""Directional attribution patching against TransformerLens's own ``attribution_patch``.

``attribution_vs_transformer_lens``: :func:`tl_directional.attribution_patch` over every node type
(``resid``, ``attn``, ``mlp``, ``head``, ``value``, each split into parallel and perpendicular
parts) / ``transformer_lens.tools.analysis.attribution_patching.attribution_patch`` at node
granularity (embed, heads, MLPs; no split) on the same prompt pairs and metric. Equal node scores
are checked (the full estimate of heads and MLPs, and ``resid`` at layer 0 for TL's embed node).

The pairs: the first :data:`ATTRIB_PAIRS` rows of the setting's tokens cut to :data:`ATTRIB_SEQ`
tokens (clean) and the same rows with the token at ``ATTRIB_SEQ // 2`` replaced (corrupted); the
metric is the last position's logit difference between two fixed tokens. TransformerLens runs one
pair at a time (two forwards and one backward each); tl_directional runs the pairs as one batch.
The target is the issue's: at most 1.2x TransformerLens's time, although it also computes the split.
"""

from __future__ import annotations

import importlib

import torch

from tl_directional.core.roundoff import roundoff_tolerance

from .registry import Bench, NotAvailable, register

#: Prompt pairs and tokens per prompt.
ATTRIB_PAIRS = 4
ATTRIB_SEQ = 16


def _pairs(model, tokens: torch.Tensor):
    clean = tokens[:ATTRIB_PAIRS, :ATTRIB_SEQ].clone()
    corrupted = clean.clone()
    pos = clean.shape[1] // 2
    corrupted[:, pos] = (corrupted[:, pos] + 1) % int(model.cfg.d_vocab)
    a, b = 1, 2

    def metric(logits):  # one number per pair
        return logits[:, -1, a] - logits[:, -1, b]

    return clean, corrupted, metric


#: What every record here compares with: TransformerLens's own attribution patching.
TL_BASELINE = ("transformer_lens.tools.analysis.attribution_patching.attribution_patch(model, clean, corrupt, "
               "metric_fn): node granularity, two forwards and one backward per pair, no split")


@register(
    "attribution_vs_transformer_lens",
    target=1.2,
    op="<=",
    precision=0.10,
    primary_only=True,
    floor_pairs=3,
    baseline=TL_BASELINE,
    candidate="tl_directional.attribution_patch(model, clean, corrupted, metric): every node type split into "
    "parallel and perpendicular parts, two forwards and one backward per batch of pairs",
)
def attribution_vs_transformer_lens(bench: Bench):
    """Attribution patching of every node of a few prompt pairs: ``attribution_patch`` (split) /
    TransformerLens's ``attribution_patch`` (unsplit), equal full estimates checked."""
    return _attribution_record(bench, None)


#: Passes of :func:`attribution_layer_passes_vs_transformer_lens`: the backward of this many
#: layers at a time is ``ceil(n_layers / LAYER_PASSES)`` blocks per pass.
LAYER_PASSES = 8


@register(
    "attribution_layer_passes_vs_transformer_lens",
    target=3.0,
    op="<=",
    precision=0.25,
    primary_only=True,
    floor_pairs=3,
    baseline=TL_BASELINE,
    candidate="tl_directional.attribution_patch(model, clean, corrupted, metric, layers_per_pass=ceil(n_layers / 8)): "
    "the memory-bounded form (8 backward passes, the forward recomputed), scores equal to the default's",
)
def attribution_layer_passes_vs_transformer_lens(bench: Bench):
    """Attribution patching in :data:`LAYER_PASSES` backward passes (``layers_per_pass``): its peak
    memory beside TransformerLens's one-pair-at-a-time ``attribution_patch``, and what it costs."""
    return _attribution_record(bench, -(-int(bench.model.cfg.n_layers) // LAYER_PASSES))


@register(
    "attribution_batch_size_1_vs_transformer_lens",
    target=2.0,
    op="<=",
    precision=0.25,
    primary_only=True,
    floor_pairs=3,
    baseline=TL_BASELINE,
    candidate="tl_directional.attribution_patch(model, clean, corrupted, metric, batch_size=1): one pair per "
    "forward / backward as TransformerLens runs them, every node type split",
)
def attribution_batch_size_1_vs_transformer_lens(bench: Bench):
    """Attribution patching one pair at a time (``batch_size=1``, TransformerLens's own batching): its
    peak memory beside TransformerLens's ``attribution_patch`` (the logits and graph of one pair), and
    what it costs."""
    return _attribution_record(bench, None, batch_size=1)


def _attribution_record(bench: Bench, layers_per_pass: int | None, batch_size: int | None = None):
    try:
        tl_ap = importlib.import_module("transformer_lens.tools.analysis.attribution_patching")
    except ImportError as exc:
        raise NotAvailable(
            f"TransformerLens has no attribution_patching here (needs 4.3): {exc}"
        ) from None
    from tl_directional.evaluate.patching import attribution_patch
    from tl_directional.model.sites import resolve_sites

    model = bench.model
    sites = resolve_sites(model, warn=False)
    if not sites.causal:
        raise NotAvailable(
            f"{sites.model_name} is not a causal LM: the metric is a next-token logit difference"
        )
    tokens = bench.inputs.tokens.to(bench.device)
    if tokens.shape[1] < ATTRIB_SEQ:
        raise NotAvailable(f"the setting's sequences are shorter than {ATTRIB_SEQ} tokens")
    clean, corrupted, metric = _pairs(model, tokens)

    def base():
        return tl_ap.attribution_patch(model, clean, corrupted, lambda logits: metric(logits)[0])

    def run():
        return attribution_patch(model, clean, corrupted, metric, layers_per_pass=layers_per_pass,
                                 batch_size=batch_size)

    if bench.check:
        want, got = base(), run()
        head, mlp, resid = (
            got.mean("head", "full"),
            got.mean("mlp", "full"),
            got.mean("resid", "full"),
        )
        diff = 0.0
        for node, score in want.node_scores.items():
            if node.kind == "attn_head_out":
                ours = head[node.layer, node.position, node.head]
            elif node.kind == "mlp_out":
                ours = mlp[node.layer, node.position]
            else:
                ours = resid[0, node.position]
            diff = max(diff, abs(float(ours) - score))
        # forwards and backwards batched differently: the bound is their round-off in the
        # model's own dtype (a bfloat16 model rounds every activation to 8 bits of mantissa)
        scale = max(abs(s) for s in want.node_scores.values())
        dtype = next(model.parameters()).dtype
        if not diff <= roundoff_tolerance(dtype, scale, 2 * model.cfg.d_model * sites.n_layers):
            raise AssertionError(
                f"attribution_patch's full estimate differs from TransformerLens's by {diff:g}"
            )
        bench.extra.update(
            {
                "check_max_abs_diff_vs_transformer_lens": diff,
                "pairs": int(clean.shape[0]),
                "prompt_tokens": int(clean.shape[1]),
                "tl_nodes": len(want.node_scores),
                "node_types": list(got.node_types),
                "layers_per_pass": layers_per_pass,
                "batch_size": batch_size,
                # the "<= 3 forward-equivalents per pair": run time over one forward of the
                # same batch of pairs (each pair appears once in that forward), medians of 5
                "forward_equivalents_per_pair": _forward_equivalents(model, clean, run),
            }
        )
    return bench.measure(base, run)


def _forward_equivalents(model, clean: torch.Tensor, run, repeats: int = 5) -> float:
    import statistics
    import time

    def median_seconds(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    with torch.no_grad():
        forward = median_seconds(lambda: model(clean))
    return median_seconds(run) / forward


__all__ = ["ATTRIB_PAIRS", "ATTRIB_SEQ", "LAYER_PASSES", "attribution_batch_size_1_vs_transformer_lens",
           "attribution_layer_passes_vs_transformer_lens",
           "attribution_vs_transformer_lens"]
