"""A memory model of each analysis: the bytes a call holds on top of the loaded model, from the
model's shape, the batch and the dtype, checked against the harness's measured peak increments.

Usage (from the repository root)::

    python -m benchmarks.memory_model --measure OUT.json --sizes tiny,smollm2-135m --setting 64x4 --count live
    python -m benchmarks.memory_model --check benchmarks/results/issue51_memory_cpu_float32_resident.json
    python -m benchmarks.memory_model --predict      # the 1B / 8B / 9B table of docs/performance.md

``--measure`` runs the harness's peak-memory probe (:mod:`benchmarks.peak_memory`, one fresh
process per record side) on the scaling family's seeded builds, counting either the high-water
mark of the live tensor bytes (``--count live``: what this model describes) or VmHWM
(``--count rss``, the default: what a user sees, glibc's heap slack included); ``--check``
prints, for every point of such JSONs, the measured increments (both counts side by side where
a point has both), the prediction and their ratios, as the Markdown table docs/performance.md
shows; ``--predict`` prints what the model says for larger shapes, with the settings that make
each fit.

The terms (``T = batch x seq`` tokens, ``e`` bytes per element of the model's dtype; float32
statistics take 4 bytes whatever the model's dtype):

* ``logits``: ``T x vocab x e``, held by every call that returns logits; in a backward twice
  more for a metric reading two logits (``logits[:, -1, a] - logits[:, -1, b]``, the harness's
  and most tutorials'): each index's backward is a full-size zero tensor, then their sum;
* ``block``: a no-grad block's working set, ``T (3 d_mlp + 4 d_model) e + 2 b n_heads seq^2 e``
  (the MLP's gate, up and product, the stream, its norm and the attention output; scores and
  probabilities);
* ``graph``: what autograd keeps per block for a backward to the hook points, counted with
  ``torch.autograd.graph.saved_tensors_hooks`` on SmolLM2 (parameters frozen, as
  :func:`tl_directional.attribution_patch` runs): ``T (3 d_mlp + 5 d_model + n_heads seq) e``;
  with trainable parameters (TransformerLens's ``attribution_patch``) each linear map's input
  and each norm's output are kept too, ``+ T (d_mlp + 5 d_model) e``;
* ``cache``: ``hooks x T x width x e`` for what a cache or the attribution clean run holds;
* ``fixed``: what one first call adds to VmHWM whatever the shape (lazy imports, Python
  objects, the profile's tables), read off the ``tiny`` size's VmHWM points (2 layers, width 64,
  every shape term under 3 MB); not a tensor term (``tiny``'s live counts exceed its shape terms by
  0.06 MB at most),
  so it is added for a VmHWM point only.

Scope: decoder-only models of the Llama / Qwen / Gemma kind (RMSNorm, gated MLP, rotary, GQA);
the live tensor bytes on CPU; VmHWM with glibc's ``MALLOC_MMAP_THRESHOLD_=65536`` (the harness's
measurement) holds up to a quarter more where a call's tensors are under 64 KB (glibc's heap
keeps freed blocks resident, and in bfloat16 about 10 MB lies outside torch's tensors;
docs/performance.md, "What the misses were"); on a GPU the caching
allocator's rounding adds a few percent. It says nothing of the weights
themselves (``parameters x e``; add them for what a machine must hold).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from .memory import COUNTS, METHOD_LIVE
from .patching import PATCH_SEQ
from .peak_measure import METHOD_CPU
from .shapes import Shape

MB = 2.0**20
GIB = 2.0**30
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
#: Where TransformerLens's and our patching helpers bound one stacked forward's logits (elements):
#: tl_directional.evaluate.patching.generic.AUTO_LOGIT_ELEMENTS.
AUTO_LOGIT_ELEMENTS = 2**26
AUTO_MAX_RUNS = 64
#: VmHWM of the exact-quantile table at the end of a profile, beside the kept values, per value
#: of a chunk (at most 2^19 values in group order): the chunk's numpy temporaries (its values,
#: mask, ids and padded rows) and what else is resident then (Python objects, the kernels'
#: scratch rows), in proportion to the chunk: **chosen**, not derived, so that smollm2-360m's
#: bfloat16 point at 4,096 tokens (179.9 MB, benchmarks/results/issue51_corpus_memory_s25_streaming.json,
#: where the table is the peak) reads 0.96; numpy's temporaries are not in the live count, so
#: the live prediction has no table phase.
TABLE_BYTES_PER_CHUNK_VALUE = 80
TABLE_CHUNK = 1 << 19
#: Values per (group, metric) a streaming summary keeps for exact quantiles by default
#: (core.stats; ``profile(exact_quantiles=...)`` changes it).
EXACT_QUANTILE_LIMIT = 16_384
#: The streaming profile's summaries (tl_directional.measure.stream): residual components per
#: layer, metrics per residual group, per head (value space) and per head (exclusive).
PROFILE_COMPONENTS = 3
RESIDUAL_METRIC_COUNT, VALUE_METRIC_COUNT, EXCLUSIVE_METRIC_COUNT = 4, 9, 2
#: Histogram bins (two edge bins included) summed over each summary's metrics: residual (unit,
#: positive, signed, positive), value (six signed, two unit, one positive), exclusive (unit,
#: positive), from tl_directional.core.quantiles.BIN_SCALES (1,000 / 2,400 / 4,000 bins; the
#: suite checks these against the library).
RESIDUAL_BINS, VALUE_BINS, EXCLUSIVE_BINS = 9_808, 28_418, 3_404
#: Bytes the streaming profile holds per layer and token until a batch's statistics are counted,
#: as ``(per d_model, per n_heads x seq)``, live tensors (``--count live``): least squares on the
#: float32 points of smollm2-135m, qwen3-0.6b, llama-3.2-1b and qwen2.5-1.5b at 4 x 64 tokens
#: (about 2 float32 rows of the stream; at seq 64 the first three have ``n_heads x seq =
#: d_model``, so qwen2.5-1.5b alone separates the two coefficients); bfloat16 on llama-3.2-1b's
#: and qwen2.5-1.5b's (two points, an exact fit): fits, not checks. ``python -m
#: benchmarks.memory_model --fit-profile`` prints them from :data:`COMMITTED_POINTS`.
PROFILE_BYTES = {"float32": (8.20, 1.06), "bfloat16": (3.77, 3.08), "float16": (3.77, 3.08)}
#: The same fitted on VmHWM (``fixed=True``), glibc's heap slack included: least squares on the
#: same four float32 points; bfloat16 scaled to llama-3.2-1b's one bfloat16 point.
PROFILE_BYTES_RSS = {"float32": (6.43, 4.08), "bfloat16": (3.68, 3.72), "float16": (3.68, 3.72)}
#: The committed peak-memory points (``--measure``): VmHWM with the weights resident, then the
#: live tensor bytes (``--count live``) of the same points, which :func:`check_files` puts beside
#: them; the fits above come from them, the suite checks every point against the model.
COMMITTED_POINTS = ("issue51_memory_cpu_float32_resident.json", "issue51_memory_cpu_large_resident.json",
                    "issue51_memory_cpu_large_rerun.json", "issue51_memory_cpu_patching_resident.json",
                    "issue51_memory_cpu_live_small.json", "issue51_memory_cpu_live_qwen3.json",
                    "issue51_memory_cpu_live_large_bf16_attr.json", "issue51_memory_cpu_live_large_profile.json",
                    "issue51_memory_cpu_live_large_f32_attr.json", "issue51_memory_cpu_live_patching.json",
                    "issue51_memory_cpu_live_bf16_profile_s25.json", "issue51_memory_cpu_live_patching_bf16_s26.json",
                    "issue51_memory_cpu_qwen3_bs1_s26.json", "issue51_memory_cpu_live_qwen3_bs1_s26.json",
                    "issue51_memory_cpu_smollm2_bs1_s26.json")
#: Corpus-length runs (``python -m benchmarks.scaling --corpus-memory``) whose one-batch
#: streaming points (the same call as the ``profile_overhead`` record's at 4 x 64 tokens, VmHWM)
#: join the VmHWM fits: four sizes in each dtype where the record points have one or two.
CORPUS_FIT_POINTS = ("issue51_corpus_memory_s25_streaming.json",)
#: Whose points each fit reads: (dtype, count) -> sizes.
FIT_SIZES = {("float32", "live"): ("smollm2-135m", "qwen3-0.6b", "llama-3.2-1b", "qwen2.5-1.5b"),
             ("bfloat16", "live"): ("smollm2-360m", "qwen3-0.6b", "llama-3.2-1b", "qwen2.5-1.5b"),
             ("float32", "rss"): ("smollm2-135m", "smollm2-360m", "qwen3-0.6b", "llama-3.2-1b", "qwen2.5-1.5b"),
             ("bfloat16", "rss"): ("smollm2-360m", "qwen3-0.6b", "llama-3.2-1b", "qwen2.5-1.5b")}


def fit_rows() -> list[dict]:
    """What the profile's fits read: the committed points' rows (:func:`check_files`) and the
    corpus runs' one-batch streaming points (:func:`corpus_fit_rows`)."""
    from pathlib import Path

    results = Path(__file__).parent / "results"
    return (check_files([results / name for name in COMMITTED_POINTS])
            + corpus_fit_rows([results / name for name in CORPUS_FIT_POINTS]))


def corpus_fit_rows(paths) -> list[dict]:
    """The one-batch streaming points of corpus-length JSONs as rows of :func:`check_files`
    (VmHWM, ``profile``)."""
    rows = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for run in doc["runs"]:
            mem = run.get("corpus_memory") or {}
            for m, got in zip(mem.get("multipliers", []), mem.get("streaming_peak_increment_mb", []), strict=True):
                if m == 1 and got is not None:
                    rows.append({"analysis": "profile", "size": run["size"], "dtype": run["dtype"], "count": "rss",
                                 "tokens": f"{mem['batch_size']}x{mem['seq']}", "measured_mb": got})
    return rows
#: What each analysis's first call costs whatever the shape (MB): the ``tiny`` size's measured
#: increment minus its shape terms, 0 where those exceed it
#: (benchmarks/results/issue51_memory_cpu_float32_small.json): imports and tables on first use.
FIXED_MB = {
    "forward": 0.0, "forward_no_logits": 0.0, "edit": 0.0, "profile": 4.4,
    "attribution": 2.0, "attribution_transformer_lens": 1.6,
    "directional_patch": 4.1, "get_act_patch_resid_pre": 0.7,
}


def _block(s: Shape, b: int, seq: int, e: int) -> float:
    return b * seq * (3 * s.d_mlp + 4 * s.d_model) * e + 2 * b * s.n_heads * seq * seq * e


def _graph(s: Shape, b: int, seq: int, e: int, layers: int, params: bool = False) -> float:
    # what autograd saves per token and block (saved_tensors_hooks, storage by storage): in float32
    # every saved tensor is the model's dtype; in bfloat16 each RMSNorm saves its float32 upcast
    # input (2 d_model at 4 bytes) and the softmax its float32 probabilities beside the bfloat16
    # copy the value product reads (n_heads seq at 4 bytes more)
    per_token = (3 * s.d_mlp + 3 * s.d_model + s.n_heads * seq) * e + 2 * s.d_model * 4
    if e < 4:
        per_token += s.n_heads * seq * 4
    if params:  # trainable weights: each linear map's input and each norm's output are kept too
        per_token += (s.d_mlp + 5 * s.d_model) * e
    return b * seq * layers * per_token


def kept_bytes_per_token(s: Shape) -> int:
    """What the streaming profile keeps per token for exact quantiles (core.stats): per residual
    group a float32 value of each metric and an int32 group id, per head the value-space and the
    exclusive summaries' values, each summary with its own int32 group id."""
    residual = PROFILE_COMPONENTS * 4 * (1 + RESIDUAL_METRIC_COUNT)
    head = 4 * (1 + VALUE_METRIC_COUNT) + 4 * (1 + EXCLUSIVE_METRIC_COUNT)
    return s.n_layers * (residual + s.n_heads * head)


def histogram_bytes(s: Shape) -> int:
    """The streaming profile's histograms once built (past ``exact_quantiles`` values a group, or
    from the start with ``exact_quantiles=0``): every summary's int64 bins, and beside them while
    a batch is counted the largest summary's ``bincount`` output (one more of its histograms)."""
    residual = PROFILE_COMPONENTS * s.n_layers * RESIDUAL_BINS
    value, exclusive = s.n_layers * s.n_heads * VALUE_BINS, s.n_layers * s.n_heads * EXCLUSIVE_BINS
    return 8 * (residual + value + exclusive + max(residual, value, exclusive))


def estimate(shape: Shape, analysis: str, batch: int, seq: int, dtype: str = "float32", *,
             layers_per_pass: int | None = None, node_types: tuple[str, ...] = ("resid", "attn", "mlp", "head", "value"),
             copies: int | None = None, batch_size: int | None = None, fixed: bool = True,
             tokens: int | None = None, exact_quantiles: int = EXACT_QUANTILE_LIMIT) -> dict[str, float]:
    """The bytes ``analysis`` holds at its peak on top of the loaded model, by term, and ``total``.

    Args:
        shape: the model's :class:`Shape`.
        analysis: ``forward``, ``forward_no_logits``, ``edit`` (a value edit on every layer),
            ``profile`` (streaming, every component), ``cache_split`` (``run_with_cache`` of the
            profile's hooks + a hand-written split), ``attribution`` (``attribution_patch``, every
            node type), ``attribution_transformer_lens`` (one pair at a time, node granularity),
            ``directional_patch`` (resid_pre, every layer and position), ``get_act_patch_resid_pre``.
        batch, seq: the call's tokens (attribution: pairs and tokens per prompt).
        dtype: the model's dtype.
        layers_per_pass: attribution's backward in passes of this many blocks (None: one pass).
        node_types: attribution's node types (what the clean run and the passes keep).
        copies: stacked patched copies per forward (directional patching; default: the library's).
        batch_size: attribution's pairs per forward / backward (None: all at once); each chunk's
            clean run, graph, logits and gradients are freed before the next (the scores kept
            between chunks are a few numbers per node).
        fixed: predict VmHWM rather than the live tensor bytes: add the first-call constant of
            :data:`FIXED_MB` and count the profile's rows with :data:`PROFILE_BYTES_RSS`.
        tokens: ``profile``: the corpus's tokens, profiled ``batch x seq`` at a time (None: one
            batch); what the summaries keep grows with it.
        exact_quantiles: ``profile``'s argument of that name (values a group keeps for exact
            quantiles; 0 keeps none).
    """
    if analysis != "profile" and (tokens is not None or exact_quantiles != EXACT_QUANTILE_LIMIT):
        raise ValueError(f"tokens= and exact_quantiles= apply to analysis 'profile' only, not {analysis!r}; "
                         "leave them out")
    if tokens is not None and tokens < batch * seq:
        raise ValueError(f"tokens={tokens} is under one batch ({batch} x {seq} = {batch * seq}); "
                         "give the corpus's tokens, at least one batch")
    if exact_quantiles < 0:
        raise ValueError(f"exact_quantiles={exact_quantiles} must be >= 0 (0: histograms only)")
    e = DTYPE_BYTES[dtype]
    s = shape
    T = batch * seq
    R = T * s.d_model * e
    logits = T * s.vocab * e
    block = _block(s, batch, seq, e)
    terms: dict[str, float] = {}
    # a no-grad forward peaks at the larger of a block's working set and the unembedding's output
    # beside the last stream (the block's temporaries are freed by then)
    forward = {"logits": logits, "final_stream": 2 * R} if logits + 2 * R >= block else {"block": block}
    if analysis in ("forward", "forward_no_logits"):
        # the TransformerLens 4.3 bridge runs the HF model's unembedding whatever return_type says
        terms = dict(forward)
    elif analysis == "edit":
        terms = {**forward, "edit_float32": 6 * T * s.d_model * 4}
    elif analysis == "profile":
        # no logits (the forward stops after the last block); the rows of every layer, held until
        # the batch's statistics are counted in one pass (PROFILE_BYTES). The peak is in the last
        # batch's forward, beside what the batches before it left: the values kept for exact
        # quantiles (a batch's are kept when it is counted), or, past exact_quantiles values a
        # group, the histograms (and the values kept until the crossing, binned then)
        fit = PROFILE_BYTES_RSS if fixed else PROFILE_BYTES
        per_stream, per_pattern = fit.get(dtype, fit["float32"])
        rows = s.n_layers * T * (per_stream * s.d_model + per_pattern * s.n_heads * seq)
        corpus = T if tokens is None else tokens
        terms = {"block": block, "layers_rows": rows,
                 "kept_values": kept_bytes_per_token(s) * min(max(corpus - T, 0), exact_quantiles)}
        if corpus > exact_quantiles:
            terms["histograms"] = histogram_bytes(s)
        elif fixed:  # the table at the end, if larger: every batch's kept values, the values'
            # order (int64) and one metric's values of the largest summary, and a chunk's temporaries
            rows_kept = s.n_layers * s.n_heads * corpus
            table = {"kept_values": kept_bytes_per_token(s) * corpus, "table_order": 12 * rows_kept,
                     "table_chunk": TABLE_BYTES_PER_CHUNK_VALUE * min(rows_kept, TABLE_CHUNK)}
            if sum(table.values()) > sum(terms.values()):
                terms = table
    elif analysis == "cache_split":
        # run_with_cache of the profile's hooks (the bridge stores an alias once): per layer z, v,
        # the pattern, the two updates and the stream after attention and after the MLP (the
        # next layer's stream before it), and the first layer's stream before it. Beside the full
        # cache, the larger of the forward's own end (the bridge computes logits whatever
        # return_type says, from the final norm's output) and the split's float32 temporaries
        per_layer = T * (4 * s.d_model + (s.n_heads + s.n_kv_heads) * s.dh) * e + batch * s.n_heads * seq * seq * e
        end = {"logits": logits, "final_stream": R} if logits + R >= block else {"block": block}
        split = {"split_float32": 8 * T * s.d_model * 4}
        terms = {"cache": s.n_layers * per_layer + R,
                 **(end if sum(end.values()) >= sum(split.values()) else split)}
    elif analysis == "attribution":
        terms = _attribution(s, min(batch, batch_size or batch), seq, e, layers_per_pass, node_types)
    elif analysis == "attribution_transformer_lens":
        # one pair at a time: the corrupted run's graph (trainable weights), logits and their gradient,
        # the clean and corrupted caches (embed, z, mlp_out) and the gradients; from the second pair
        # on, the previous pair's corrupted cache (activations and gradients) is alive until its
        # variable is rebound after this pair's backward
        cache = seq * s.d_model * e * (1 + 2 * s.n_layers)
        terms = {"graph": _graph(s, 1, seq, e, s.n_layers, params=True), "logits": 3 * seq * s.vocab * e,
                 "caches": (3 + 2 * (batch > 1)) * cache}
    elif analysis == "directional_patch":
        # the clean and corrupted streams of every layer, then one stacked forward from block L at
        # a time; like a forward it peaks at the larger of its logits beside the last stream and
        # a block's working set, for each of the copies (the library's count, or fewer where a
        # layer has fewer runs to patch)
        n = copies or max(1, min(AUTO_MAX_RUNS, AUTO_LOGIT_ELEMENTS // max(1, T * s.vocab)))
        terms = {"cache": 2 * s.n_layers * R}
        if logits + 2 * R >= block:
            terms.update(stacked_logits=n * logits, stacked_streams=n * 2 * R)
        else:
            terms["stacked_block"] = n * block
    elif analysis == "get_act_patch_resid_pre":
        # run_with_cache of the clean run (the bridge's every hook point, aliases stored once:
        # 11 d_model, 3 d_mlp, 3 key/value and 2 score rows per layer and token; the embedding,
        # final norm and logits), then one forward per patch with autograd on and trainable
        # weights (TransformerLens does not turn gradients off): its graph and logits, twice (the
        # loop's previous logits, and the graph they hold, are alive while the next forward runs)
        rows = 11 * s.d_model + 3 * s.d_mlp + 3 * s.n_kv_heads * s.dh + 2 * s.n_heads * seq
        terms = {"cache": T * e * (s.n_layers * rows + 3 * s.d_model) + logits,
                 "graph": 2 * _graph(s, batch, seq, e, s.n_layers, params=True), "logits": 2 * logits}
    else:
        raise ValueError(f"analysis={analysis!r} is not modelled; choose from {ANALYSES}")
    if fixed:
        terms["fixed"] = FIXED_MB.get(analysis, 0.0) * MB
    terms["total"] = sum(terms.values())
    return terms


def _attribution(s: Shape, pairs: int, seq: int, e: int, layers_per_pass, node_types) -> dict[str, float]:
    """The larger of a pass's two phases: where its backward starts (the graph, the logits and
    their gradients) and where it scores (the pass's activations and gradients, and the head
    nodes' float64 products)."""
    T = pairs * seq
    R = T * s.d_model * e
    k = s.n_layers if layers_per_pass is None else min(layers_per_pass, s.n_layers)
    nt = set(node_types)
    clean_per_layer = R * (("resid" in nt) + ("attn" in nt) + ("mlp" in nt) + bool(nt & {"head", "value"}))
    # corrupted activations of one pass: the clean hooks again, the references (the stream before
    # attention / MLP) and v. The pass's gradients are not a term where its backward starts: the
    # backward frees each block's saved tensors as it leaves the block, and a block's graph is
    # larger than its gradients (about 5 d_model per token)
    acts = clean_per_layer + R * (("attn" in nt) + ("mlp" in nt) + ("head" in nt)) + (
        T * s.n_kv_heads * s.dh * e if "value" in nt else 0)
    backward = {"clean": s.n_layers * clean_per_layer, "graph": _graph(s, pairs, seq, e, k),
                "logits": 3 * T * s.vocab * e, "pass_acts": k * acts}
    # scoring, after the backward (graph and logits freed): the pass's activations and gradients
    # (stream rows at resid, the attention / MLP update and z) and, per layer, the head nodes'
    # float64 work: W_O in float64 (d_model^2), each head's write [T, n_heads, d_model] and one
    # product of it, and the float64 rows of dz, g_z, the stream and its gradient. This does not
    # shrink with the model's dtype, so in bfloat16 it is the peak where the graph is small
    # (layers_per_pass, batch_size=1)
    grads = R * (("resid" in nt) + bool(nt & {"attn", "head"}) + ("mlp" in nt) + bool(nt & {"head", "value"}))
    head64 = (s.d_model**2 + 2 * T * s.n_heads * s.d_model + 4 * T * s.d_model) * 8 if "head" in nt else 0
    scoring = {"clean": s.n_layers * clean_per_layer, "pass_acts": k * acts, "pass_grads": k * grads,
               "head_float64": head64}
    return backward if sum(backward.values()) >= sum(scoring.values()) else scoring


#: How far below the median resident size of its (size, dtype) a point's ``before_mb`` may lie
#: before :func:`check_rows` marks it not resident (weights evicted, its increment not the call's).
RESIDENT_SLACK = 0.02
#: The records whose sides the model covers (``--measure``'s default).
MEASURED_RECORDS = ("profile_overhead", "edit_overhead", "attribution_vs_transformer_lens",
                    "attribution_layer_passes_vs_transformer_lens", "attribution_batch_size_1_vs_transformer_lens",
                    "patching_vs_transformer_lens")
#: Records whose baseline is attribution_vs_transformer_lens's TransformerLens call (measured once).
SAME_BASELINE = ("attribution_layer_passes_vs_transformer_lens", "attribution_batch_size_1_vs_transformer_lens")
ANALYSES = ("forward", "forward_no_logits", "edit", "profile", "cache_split", "attribution",
            "attribution_transformer_lens", "directional_patch", "get_act_patch_resid_pre")


def record_sides(record: str, shape: Shape, batch: int, seq: int) -> dict[str, tuple[str, int, int, dict]] | None:
    """What each side of a harness record runs, as ``(analysis, batch, seq, settings)`` (None:
    a record the model does not cover)."""
    attrib = (min(4, batch), 16)
    n = min(PATCH_SEQ, seq)  # the patching record's prompt
    table = {
        "profile_overhead": {"baseline": ("forward_no_logits", batch, seq, {}), "candidate": ("profile", batch, seq, {})},
        "edit_overhead": {"baseline": ("forward", batch, seq, {}), "candidate": ("edit", batch, seq, {})},
        "attribution_vs_transformer_lens": {"baseline": ("attribution_transformer_lens", *attrib, {}),
                                            "candidate": ("attribution", *attrib, {})},
        "attribution_layer_passes_vs_transformer_lens": {
            "baseline": ("attribution_transformer_lens", *attrib, {}),
            "candidate": ("attribution", *attrib, {"layers_per_pass": -(-shape.n_layers // 8)})},
        "attribution_batch_size_1_vs_transformer_lens": {
            "baseline": ("attribution_transformer_lens", *attrib, {}),
            "candidate": ("attribution", *attrib, {"batch_size": 1})},
        # the record corrupts position n // 2: at every layer the earlier positions' streams are
        # equal to the corrupted run's (nothing to run), so a layer stacks the later ones only
        "patching_vs_transformer_lens": {
            "baseline": ("get_act_patch_resid_pre", 1, n, {}),
            "candidate": ("directional_patch", 1, n, {"copies": n - n // 2})},
    }
    return table.get(record)


def check_rows(doc: dict) -> list[dict]:
    """Measured against predicted, one row per (size, dtype, record, side) of a ``--measure`` JSON.

    A JSON of ``count`` ``live`` (the live tensor bytes) is checked against the tensors alone
    (``fixed=False``: the ``tiny`` size's live increments exceed its shape terms by 0.06 MB at most);
    one of VmHWM (``rss``, the default of JSONs written before the live count) against the
    tensors and the first-call term of :data:`FIXED_MB`."""
    from .sizes import SIZES

    count = doc.get("count", "rss")
    rows = []
    for pt in doc["points"]:
        shape = Shape.of(SIZES[pt["size"]])
        analysis, b, s, settings = record_sides(pt["record"], shape, pt["batch"], pt["seq"])[pt["side"]]
        pred = estimate(shape, analysis, b, s, pt["dtype"], fixed=count == "rss", **settings)["total"] / MB
        got = pt["increment_mb"]
        rows.append({"size": pt["size"], "dtype": pt["dtype"], "record": pt["record"], "side": pt["side"],
                     "analysis": analysis, "tokens": f"{b}x{s}", "measured_mb": got, "predicted_mb": pred,
                     "ratio": pred / got if got > 0 else math.nan, "before_mb": pt["before_mb"], "count": count,
                     **settings})
    # a point whose process started the call with less resident than its siblings (same size and
    # dtype) had weight pages evicted under memory pressure: its increment is not the call's
    for r in rows:
        befores = sorted(q["before_mb"] for q in rows if (q["size"], q["dtype"]) == (r["size"], r["dtype"]))
        r["resident"] = r["before_mb"] >= befores[len(befores) // 2] * (1 - RESIDENT_SLACK)
    return rows


def check_files(paths) -> list[dict]:
    """:func:`check_rows` of several ``--measure`` JSONs, in order; a point measured again in a
    later file (same size, dtype, record, side and count) replaces the earlier one. A point with
    both counts is one row: the live count's (``measured_mb``, ``ratio``) with the VmHWM reading
    beside it (``rss_mb``, ``rss_ratio``, ``rss_resident``)."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as f:
            for r in check_rows(json.load(f)):
                key = (r["size"], r["dtype"], r["record"], r["side"], r["count"])
                rows.pop(key, None)
                rows[key] = r
    out, seen = [], set()
    for key in rows:  # one row per point, where either count of it first appeared
        if key[:4] in seen:
            continue
        seen.add(key[:4])
        live, rss = rows.get((*key[:4], "live")), rows.get((*key[:4], "rss"))
        if live is None:
            out.append(rss)
        else:
            out.append({**live, **({"rss_mb": rss["measured_mb"], "rss_ratio": rss["ratio"],
                                    "rss_resident": rss["resident"]} if rss else {})})
    return out


def measure_points(sizes: list[str], dtypes: list[str], records: list[str], seq: int, batch: int,
                   workdir: str, log=None, save=None, count: str = "rss") -> list[dict]:
    """The harness's peak-memory probe (:mod:`benchmarks.peak_memory`: a fresh subprocess per
    record side, VmHWM after one call minus VmRSS before it, or with ``count="live"`` the live
    tensor bytes' high-water mark) for every size, dtype, record and side, on the scaling
    family's seeded models; no timing."""
    from pathlib import Path

    from .peak_measure import SIDES, run_probe
    from .sizes import build

    points = []
    for name in sizes:
        path = build(name, Path(workdir))
        for dtype in dtypes:
            for record in records:
                for side in SIDES:
                    if (side == "baseline" and record in SAME_BASELINE
                            and "attribution_vs_transformer_lens" in records):
                        continue  # the same TransformerLens call as attribution_vs_transformer_lens's
                    r = run_probe(record, str(path), seq, batch, side, device="cpu", dtype=dtype, threads=1,
                                  count=count)
                    points.append({"size": name, "dtype": dtype, "record": record, "side": side, "seq": seq,
                                   "batch": batch, **{k: r[k] for k in ("before_mb", "peak_mb", "increment_mb")}})
                    if log:
                        log(f"{name} {dtype} {record} {side}: +{r['increment_mb']:.1f} MB")
                    if save:
                        save(points, complete=False)
    return points


def markdown_check(rows: list[dict]) -> str:
    """The rows of :func:`check_files` as Markdown: the live count and its ratio, then VmHWM's
    (predicted with the first-call term) where the point has both."""
    out = ["| size | dtype | analysis | tokens | live MB | predicted MB | predicted / live | RSS MB | "
           "predicted + fixed / RSS |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
    evicted = " (not resident: less in memory before the call than its siblings)"
    for r in rows:
        label = r["analysis"] + "".join(f", {k}={r[k]}" for k in ("layers_per_pass", "batch_size", "copies") if r.get(k))
        if r["count"] == "live":
            live = f"{r['measured_mb']:.1f} | {r['predicted_mb']:.1f} | {r['ratio']:.2f}"
            rss = (f"{r['rss_mb']:.1f}{'' if r['rss_resident'] else evicted} | {r['rss_ratio']:.2f}"
                   if "rss_mb" in r else "- | -")
        else:
            live = f"- | {r['predicted_mb']:.1f} | -"
            rss = f"{r['measured_mb']:.1f}{'' if r['resident'] else evicted} | {r['ratio']:.2f}"
        out.append(f"| {r['size']} | {r['dtype']} | {label} | {r['tokens']} | {live} | {rss} |")
    return "\n".join(out)


def markdown_attribution(rows: list[dict]) -> str:
    """Attribution patching's measured peak increments (rows of :func:`check_files`), one row per
    size and dtype: TransformerLens's ``attribution_patch`` and ours in one pass, with
    ``layers_per_pass`` and with ``batch_size=1``, each with its ratio to TransformerLens's; in
    VmHWM (what a user sees), the points with only a live count left out."""
    cells: dict[tuple[str, str], dict[str, tuple[float, str]]] = {}
    for r in rows:
        rss = r.get("rss_mb", r["measured_mb"] if r["count"] == "rss" else None)
        if rss is None:
            continue
        if r["analysis"] == "attribution_transformer_lens":
            col = "tl"
        elif r["analysis"] == "attribution":
            col = ("lpp" if r.get("layers_per_pass") else "bs1" if r.get("batch_size") else "one")
        else:
            continue
        tag = f"k={r['layers_per_pass']}" if col == "lpp" else ""
        # TransformerLens's call measured again as another record's baseline: the first reading stays
        cells.setdefault((r["size"], r["dtype"]), {}).setdefault(col, (rss, tag))
    out = ["| size | dtype | pairs x tokens | TransformerLens MB | ours, one pass | ours, `layers_per_pass=k` | "
           "ours, `batch_size=1` |", "|---|---|---|---:|---:|---:|---:|"]
    tokens = {(r["size"], r["dtype"]): r["tokens"] for r in rows if r["analysis"].startswith("attribution")}
    for key, c in cells.items():
        tl = c.get("tl", (math.nan, ""))[0]

        def cell(col, c=c, tl=tl):
            if col not in c:
                return "-"
            mb, tag = c[col]
            return f"{mb:.1f} ({mb / tl:.2f}x{', ' + tag if tag else ''})"

        out.append(f"| {key[0]} | {key[1]} | {tokens[key]} | {tl:.1f} | {cell('one')} | {cell('lpp')} | {cell('bs1')} |")
    return "\n".join(out)


def fit_profile_rows(rows: list[dict], sizes: tuple[str, ...], dtype: str, count: str) -> tuple[float, float]:
    """Least-squares ``(per d_model, per n_heads x seq)`` bytes of the profile's rows term
    (:data:`PROFILE_BYTES` for ``count="live"``, :data:`PROFILE_BYTES_RSS` for ``"rss"``) from
    the profile points of ``sizes`` in ``dtype`` (rows of :func:`check_files`): each point's
    measured increment less the model's other terms, over ``n_layers x T``. Two points give an
    exact fit; one, a fit of the ratio the float32 fit has, scaled to it."""
    import numpy as np

    from .sizes import SIZES

    def reading(r):  # the point's reading in `count` (None where it has none)
        return r["measured_mb"] if r["count"] == count else r.get("rss_mb") if count == "rss" else None

    pts = [r for r in rows if r["analysis"] == "profile" and r["size"] in sizes and r["dtype"] == dtype
           and reading(r) is not None]
    if not pts:
        raise ValueError(f"no {count} profile points of {sizes} in {dtype}")
    a, y = [], []
    for r in pts:
        s = SIZES[r["size"]].shape
        b, seq = (int(v) for v in r["tokens"].split("x"))
        got = reading(r) * MB
        terms = estimate(s, "profile", b, seq, dtype, fixed=count == "rss")
        rest = terms["total"] - terms["layers_rows"]
        a.append([s.n_layers * b * seq * s.d_model, s.n_layers * b * seq * s.n_heads * seq])
        y.append(got - rest)
    a, y = np.array(a, dtype=float), np.array(y)
    if len(pts) == 1:  # one point: the float32 fit's proportions, scaled to it
        ref = np.array((PROFILE_BYTES_RSS if count == "rss" else PROFILE_BYTES)["float32"])
        return tuple(float(v) for v in ref * y[0] / (a[0] @ ref))
    return tuple(float(v) for v in np.linalg.lstsq(a, y, rcond=None)[0])


#: Larger shapes the docs state predictions for (published configurations; tied where the model ties).
PREDICT_SHAPES = {
    "Llama-3.2-1B": Shape(16, 2048, 32, 8, 8192, 128256, tied=True),
    "Llama-3.1-8B": Shape(32, 4096, 32, 8, 14336, 128256),
    "Gemma-2-9B": Shape(42, 3584, 16, 8, 14336, 256000, d_head=256, tied=True),
}


def markdown_predict(batch: int = 8, seq: int = 128, dtype: str = "bfloat16") -> str:
    """Predicted peak increments (GiB) for :data:`PREDICT_SHAPES` at ``batch x seq`` tokens, the
    weights beside them; the profile over one batch and over a long corpus (by default and with
    ``exact_quantiles=0``); attribution with and without ``layers_per_pass``."""
    e = DTYPE_BYTES[dtype]
    cases = [("forward (logits)", "forward", {}), ("profile (streaming)", "profile", {}),
             ("profile, a corpus of 2^20 tokens", "profile", {"tokens": 2**20}),
             ("profile, 2^20 tokens, exact_quantiles=0", "profile", {"tokens": 2**20, "exact_quantiles": 0}),
             ("run_with_cache + split", "cache_split", {}), ("value edit (logits)", "edit", {}),
             ("directional_patch", "directional_patch", {}), ("attribution_patch", "attribution", {}),
             ("attribution_patch, layers_per_pass=4", "attribution", {"layers_per_pass": 4}),
             ("attribution_patch, batch_size=1", "attribution", {"batch_size": 1})]
    head = ["| " + dtype + f", {batch} x {seq} tokens | " + " | ".join(PREDICT_SHAPES) + " |",
            "|---|" + "---:|" * len(PREDICT_SHAPES)]
    rows = ["| weights | " + " | ".join(f"{s.parameters() * e / GIB:.1f}" for s in PREDICT_SHAPES.values()) + " |"]
    for label, analysis, settings in cases:
        vals = [estimate(s, analysis, batch, seq, dtype, fixed=False, **settings)["total"] / GIB
                for s in PREDICT_SHAPES.values()]
        rows.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(head + rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory_model", description=__doc__.split("\n")[0])
    p.add_argument("--check", metavar="MEASURED_JSON", nargs="+",
                   help="measured vs predicted for --measure JSONs (a point in a later file replaces an earlier one)")
    p.add_argument("--attribution", action="store_true",
                   help="with --check: attribution patching's measured increments against TransformerLens's")
    p.add_argument("--predict", action="store_true", help="the 1B / 8B / 9B predictions")
    p.add_argument("--dtype", default="bfloat16", help="dtype of --predict")
    p.add_argument("--fit-profile", action="store_true",
                   help="least-squares PROFILE_BYTES / PROFILE_BYTES_RSS from the committed points")
    p.add_argument("--measure", metavar="OUT_JSON", help="measure the points (one probe process each) into OUT_JSON")
    p.add_argument("--sizes", default="tiny,smollm2-135m,smollm2-360m,qwen3-0.6b")
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--records", default=",".join(MEASURED_RECORDS))
    p.add_argument("--setting", default="64x4", help="SEQxBATCH")
    p.add_argument("--workdir", default="/tmp/tl_directional_scaling")
    p.add_argument("--count", choices=COUNTS, default="rss",
                   help="what --measure counts: the live tensor bytes' high-water mark (what the model "
                        "describes) or VmHWM (what a user sees, the C allocator's slack included)")
    p.add_argument("--mmap-threshold", type=int, default=65536, metavar="BYTES",
                   help="with --measure --count rss: glibc's MALLOC_MMAP_THRESHOLD_ in each probe (blocks "
                        "of this size or more are mmapped and returned on free; smaller ones come from the "
                        "heap, whose freed blocks RSS keeps)")
    a = p.parse_args(argv)
    if a.measure:
        seq, batch = (int(x) for x in a.setting.split("x"))
        if a.count == "rss":  # what run_probe passes on (the live count does not depend on it)
            os.environ["MALLOC_MMAP_THRESHOLD_"] = str(a.mmap_threshold)
        command = "python -m benchmarks.memory_model " + " ".join(sys.argv[1:] if argv is None else argv)

        def save(points, complete=True):  # after every point: a stopped run keeps what it measured
            method = METHOD_LIVE if a.count == "live" else METHOD_CPU.replace("65536", str(a.mmap_threshold))
            doc = {"command": command, "method": method,
                   "count": a.count, "setting": a.setting, "points": points, "complete": complete}
            with open(a.measure, "w") as f:
                f.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")

        save(measure_points(a.sizes.split(","), a.dtypes.split(","), a.records.split(","), seq, batch,
                            a.workdir, log=lambda m: print(m, file=sys.stderr, flush=True), save=save,
                            count=a.count))
    if a.check:
        rows = check_files(a.check)
        print(markdown_attribution(rows) if a.attribution else markdown_check(rows))
    if a.predict:
        print(markdown_predict(dtype=a.dtype))
    if a.fit_profile:
        rows = fit_rows()
        for (dtype, count), sizes in FIT_SIZES.items():
            per_stream, per_pattern = fit_profile_rows(rows, sizes, dtype, count)
            print(f"{dtype} {count}: ({per_stream:.2f}, {per_pattern:.2f})  from {', '.join(sizes)}")
    if not (a.check or a.predict or a.measure or a.fit_profile):
        p.error("give --measure OUT_JSON, --check MEASURED_JSON, --predict and/or --fit-profile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
