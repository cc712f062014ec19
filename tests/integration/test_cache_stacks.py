"""Cache-level splits (tl_directional.measure.stacks) in TransformerLens's own shapes, on tiny
GPT-2, Llama (GQA: 4 query heads over 2 KV heads), Gemma-3 (sandwich norms) and NeoX (parallel
attn+MLP) models, on whichever lane is installed (each family where the lane loads it).

(a) parallel + perpendicular is TL's ``decompose_resid`` / ``stack_head_results`` stack: to
    float64 rounding on float64 models, within ``roundoff_tolerance`` on float32 ones;
(b) every reference path equals a projection written here from cache tensors and
    ``torch.linalg`` (no library code): the streams each component is added to, one direction, a
    per-layer set, a k-subspace, a tensor of streams; and with ``pos_slice``, ``mlp_input``,
    ``mode``;
(c) each part feeds ``cache.apply_ln_to_stack`` and ``cache.logit_attrs`` unchanged, and the
    parts' attributions add up to TL's (1e-12 float64, 1e-6 float32);
(d) ``reference="input"`` reproduces ``tld.profile``'s residual table where they overlap;
(e) the error cases.
"""

from __future__ import annotations

import math

import pytest
import torch

import tl_directional as tld
from tests.integration._families import LOADABLE
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.measure.stacks import (
    StackSplit,
    StackSplitError,
    split_decompose_resid,
    split_stack_head_results,
)

FAMILIES = tuple(f for f in ("gpt2", "llama", "gemma3", "neox") if f in LOADABLE)
PARALLEL_BLOCKS = {"neox"}  # attn and MLP both read resid_pre (written here, not looked up)
BATCH, POS = 2, 9


def _tokens(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, int(model.cfg.d_vocab), (BATCH, POS), generator=g)


def _cache(model, seed=0):
    tokens = _tokens(model, seed)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    return tokens, cache


def _slice(t, pos_slice):
    """TL's pos_slice on the pos axis (-2), for the few forms these tests use."""
    if pos_slice is None:
        return t
    if isinstance(pos_slice, tuple):
        return t[..., slice(*pos_slice), :]
    return t[..., pos_slice, :]


def _input_hook(label, family):
    """The stream each TL label is added to, written out by hand (METHOD.md sec. 2)."""
    if label in ("embed", "pos_embed"):
        return "blocks.0.hook_resid_pre"
    if label.startswith("L"):
        return f"blocks.{int(label[1:].split('H')[0])}.hook_resid_pre"
    layer, kind = label.split("_")[:2]
    if kind == "mlp" and family not in PARALLEL_BLOCKS:
        return f"blocks.{layer}.hook_resid_mid"
    return f"blocks.{layer}.hook_resid_pre"


def _update(cache, model, label):
    """The component itself, from the cache's hooks (heads: ``hook_z`` times ``W_O``)."""
    if label in ("embed", "pos_embed"):
        return cache[f"hook_{label}"]
    if label.startswith("L"):
        layer, head = (int(x) for x in label[1:].split("H"))
        z = cache[f"blocks.{layer}.attn.hook_z"][..., head, :]
        return z @ model.blocks[layer].attn.W_O[head].to(z.dtype)
    layer, kind = label.split("_")[:2]
    return cache[f"blocks.{layer}.hook_{kind}_out"]


def _line(u, r):
    """Projection of ``u`` on ``r`` (per token where ``r`` has a token axis), by torch.linalg."""
    return (torch.linalg.vecdot(u, r) / torch.linalg.vecdot(r, r)).unsqueeze(-1) * r


def _span(u, rows):
    q, _ = torch.linalg.qr(rows.T.to(torch.float64))  # [d, k], orthonormal columns
    return ((u.to(torch.float64) @ q) @ q.T).to(u.dtype)


def _stack(cache, heads, **kw):
    """TL's own stack (no_grad: per-head results multiply by ``W_O``, a parameter)."""
    with torch.no_grad():
        return _tl_stack(cache, heads, **kw)


def _tl_stack(cache, heads, **kw):
    if heads:
        return cache.stack_head_results(apply_ln=False, return_labels=True, **kw)
    return cache.decompose_resid(apply_ln=False, return_labels=True, **kw)


def _split(cache, heads, **kw) -> StackSplit:
    with torch.no_grad():
        return (split_stack_head_results if heads else split_decompose_resid)(cache, **kw)


# -- (a) the parts add up to TL's own stacks -------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("heads", [False, True], ids=["decompose_resid", "stack_head_results"])
@pytest.mark.parametrize("family", FAMILIES)
def test_parts_add_up_to_tl_stack(float64_model, tiny_model, family, heads, dtype):
    """float64: to one rounding in ``perp = u - par`` and one in the sum (float64 exactness);
    float32 (what users run): within ``roundoff_tolerance`` of a ``d_model``-term dot product at
    the scale of the largest component norm (which bounds ``|u_par|`` and ``|u_perp|``)."""
    model = float64_model(family) if dtype == torch.float64 else tiny_model(family)
    _, cache = _cache(model)
    stack, labels = _stack(cache, heads)
    s = _split(cache, heads)
    assert s.parallel.shape == s.perpendicular.shape == stack.shape
    assert stack.shape[1:] == (BATCH, POS, model.cfg.d_model)
    assert s.labels == tuple(labels) and s.dtype == dtype == s.parallel.dtype and s.k == 1
    gap = (s.parallel + s.perpendicular - stack).abs()
    if dtype == torch.float64:
        bound = 2 * torch.finfo(dtype).eps * torch.maximum(s.parallel.abs(), s.perpendicular.abs())
        assert (gap <= bound + 1e-300).all(), float(gap.max())
        assert torch.equal(s.perpendicular, stack - s.parallel)
    else:
        scale = float(stack.norm(dim=-1).max())
        assert float(gap.max()) <= roundoff_tolerance(dtype, scale, int(model.cfg.d_model))


# -- (b) every reference path equals an independent projection -------------------------------

@pytest.mark.parametrize("pos_slice", [None, -1, (2, 6)], ids=["all", "last", "2:6"])
@pytest.mark.parametrize("heads", [False, True], ids=["decompose_resid", "stack_head_results"])
@pytest.mark.parametrize("family", FAMILIES)
def test_input_reference_is_the_stream_each_component_is_added_to(float64_model, family, heads, pos_slice):
    """Against a projection written here from the hooks (heads: ``hook_z @ W_O``), and, on TL's
    own stack row, bit for bit the library's per-token split against the stream
    (``tld.decompose``, which ``tld.profile`` and the edits use)."""
    model = float64_model(family)
    _, cache = _cache(model)
    s = _split(cache, heads, pos_slice=pos_slice)
    stack, _ = _stack(cache, heads, pos_slice=pos_slice)
    for i, label in enumerate(s.labels):
        hook = _input_hook(label, family)
        assert s.references[i] == hook
        u, r = _slice(_update(cache, model, label), pos_slice), _slice(cache[hook], pos_slice)
        expected = _line(u, r)
        assert torch.allclose(s.parallel[i], expected, atol=1e-12, rtol=0), label
        assert torch.allclose(s.perpendicular[i], u - expected, atol=1e-12, rtol=0), label
        dec = tld.decompose(stack[i], r)
        assert torch.equal(s.parallel[i], dec.par) and torch.equal(s.perpendicular[i], dec.perp), label


@pytest.mark.parametrize("family", FAMILIES)
def test_mlp_input_and_mode_follow_tl(float64_model, family):
    model = float64_model(family)
    _, cache = _cache(model)
    for kw in ({"layer": 1, "mlp_input": True}, {"mode": "attn"}, {"mode": "mlp", "incl_embeds": False},
               {"layer": 0}):
        stack, labels = cache.decompose_resid(apply_ln=False, return_labels=True, **kw)
        s = split_decompose_resid(cache, **kw)
        assert s.labels == tuple(labels), kw
        for i, label in enumerate(labels):
            expected = _line(stack[i], cache[_input_hook(label, family)])
            assert torch.allclose(s.parallel[i], expected, atol=1e-12, rtol=0), (kw, label)


@pytest.mark.parametrize("heads", [False, True], ids=["decompose_resid", "stack_head_results"])
@pytest.mark.parametrize("family", FAMILIES)
def test_direction_per_layer_subspace_and_stream_references(float64_model, family, heads):
    model = float64_model(family)
    _, cache = _cache(model)
    d, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    g = torch.Generator().manual_seed(3)
    direction = torch.randn(d, generator=g, dtype=torch.float64)
    per_layer = torch.randn(n_layers, d, generator=g, dtype=torch.float64)
    rows = torch.randn(5, d, generator=g, dtype=torch.float64)
    streams = cache[f"blocks.{n_layers - 1}.hook_resid_post"]
    stack, labels = _stack(cache, heads)

    def layer_of(label):
        if label in ("embed", "pos_embed"):
            return 0  # the embeddings use row 0 (documented)
        return int(label[1:].split("H")[0]) if label.startswith("L") else int(label.split("_")[0])

    cases = [
        (dict(reference=direction), lambda i, u: _line(u, direction), 1, "reference"),
        (dict(reference=direction.float()), lambda i, u: _line(u, direction.float().double()), 1, "reference"),
        (dict(reference=per_layer, per_layer=True),
         lambda i, u: _line(u, per_layer[layer_of(labels[i])]), 1, None),
        (dict(reference=rows), lambda i, u: _span(u, rows), 5, "reference"),
        (dict(reference=per_layer, per_layer=False), lambda i, u: _span(u, per_layer), n_layers, "reference"),
        (dict(reference=streams), lambda i, u: _line(u, streams), 1, "reference (streams)"),
    ]
    for kw, projection, k, ref_label in cases:
        s = _split(cache, heads, **kw)
        assert s.k == k and s.random_energy_share == k / d
        for i, label in enumerate(labels):
            expected = projection(i, stack[i])
            assert torch.allclose(s.parallel[i], expected, atol=1e-12, rtol=0), (kw.keys(), label)
            assert s.references[i] == (ref_label or f"reference[{layer_of(label)}]")
        share = s.energy_share()
        by_hand = (s.parallel ** 2).flatten(1).sum(1) / (stack ** 2).flatten(1).sum(1)
        assert torch.allclose(share, by_hand, atol=1e-12, rtol=0)


# -- (c) the parts feed apply_ln_to_stack and logit_attrs unchanged --------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("heads", [False, True], ids=["decompose_resid", "stack_head_results"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logit_attrs_of_the_parts_add_up_to_tl(float64_model, tiny_model, family, heads, dtype):
    model = float64_model(family) if dtype == torch.float64 else tiny_model(family)
    tokens, cache = _cache(model)
    atol = 1e-12 if dtype == torch.float64 else 1e-6
    answer, wrong = tokens[:, 0], tokens[:, 1]
    for reference in ("input", torch.randn(int(model.cfg.d_model), generator=torch.Generator().manual_seed(5))):
        full, _ = _stack(cache, heads, pos_slice=-1)
        s = _split(cache, heads, pos_slice=-1, reference=reference)
        kw = dict(incorrect_tokens=wrong, pos_slice=-1)
        with torch.no_grad():  # logit_attrs multiplies by W_U, a parameter
            par = cache.logit_attrs(s.parallel.to(full.dtype), answer, **kw)
            perp = cache.logit_attrs(s.perpendicular.to(full.dtype), answer, **kw)
            whole = cache.logit_attrs(full, answer, **kw)
            # apply_ln_to_stack on a part: TL's cached final-LN scale, so linear in the stack
            ln_par = cache.apply_ln_to_stack(s.parallel.to(full.dtype), None, pos_slice=-1)
            ln_perp = cache.apply_ln_to_stack(s.perpendicular.to(full.dtype), None, pos_slice=-1)
            ln_full = cache.apply_ln_to_stack(full, None, pos_slice=-1)
        assert par.shape == whole.shape == (full.shape[0], BATCH)
        assert float((par + perp - whole).abs().max()) <= atol
        assert ln_par.shape == full.shape
        assert float((ln_par + ln_perp - ln_full).abs().max()) <= 100 * atol


# -- (d) the stream reference reproduces tld.profile ------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_input_reference_reproduces_profile(float64_model, family):
    """Where the two overlap: ``tld.profile``'s residual rows for attn / mlp of layer L (every
    token of the batch, the first included: ``exclude_first_token=False``) against the stacks'
    ``{L}_attn_out`` / ``{L}_mlp_out`` rows split against the input stream. Comparable: the
    token count, the energy ratio ``sqrt(sum ||u_par||^2 / sum ||u_perp||^2)`` and the exact
    mean of the per-token ``par_frac = ||u_par|| / ||u||`` (profile keeps exact sums); not
    comparable: its quantiles (histograms) and the block rows (no stack component)."""
    model = float64_model(family)
    tokens, cache = _cache(model)
    s = split_decompose_resid(cache, incl_embeds=False)
    prof = tld.profile(model, tokens, components=("attn", "mlp"), exclude_first_token=False,
                       progress=False)
    table = prof.residual.set_index(["layer", "component"])
    for i, label in enumerate(s.labels):
        layer, kind = int(label.split("_")[0]), label.split("_")[1]
        row = table.loc[(layer, kind)]
        par, perp = s.parallel[i].flatten(0, -2), s.perpendicular[i].flatten(0, -2)
        assert int(row["count"]) == par.shape[0] and int(row["degenerate"]) == 0
        energy = math.sqrt(float((par ** 2).sum() / (perp ** 2).sum()))
        assert row["energy_ratio"] == pytest.approx(energy, rel=1e-10), label
        par_frac = (par.norm(dim=-1) / (par + perp).norm(dim=-1)).mean()
        assert row["par_frac_mean"] == pytest.approx(float(par_frac), rel=1e-10), label


# -- (e) errors ---------------------------------------------------------------------------------

def test_each_bad_reference_gets_one_clear_error(float64_model):
    model = float64_model("gpt2")
    _, cache = _cache(model)
    d, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    two = torch.randn(n_layers, d, dtype=torch.float64)
    dependent = torch.stack([two[0], 3 * two[0], two[1]])
    cases = [
        (dict(reference=torch.randn(d + 1)), ["reference", f"width {d + 1}", f"width {d}"]),
        (dict(reference=torch.zeros(d)), ["reference", "zero row"]),
        (dict(reference=torch.full((d,), float("nan"))), ["reference", "NaN or inf"]),
        (dict(reference=dependent), ["reference", "rank 2", "3 rows"]),
        (dict(reference=two), ["per_layer=True", "per_layer=False", f"{n_layers} rows"]),
        (dict(reference=torch.randn(n_layers + 1, d), per_layer=True), ["per_layer=True", f"n_layers={n_layers}"]),
        (dict(reference=torch.randn(BATCH, POS + 1, d)), ["reference", "[*batch_and_pos, d_model]"]),
        (dict(reference=torch.zeros(BATCH, POS, d)), ["reference streams", "zero everywhere"]),
        (dict(reference=torch.full((BATCH, POS, d), float("inf"))), ["reference streams", "NaN or inf"]),
        (dict(reference="stream"), ["reference must be 'input'"]),
        (dict(layer=n_layers + 1), ["layer must be", f"[0, {n_layers}]"]),
        (dict(layer=n_layers, mlp_input=True), ["layer must be", f"[0, {n_layers - 1}]"]),
        (dict(mode="heads"), ["mode must be"]),
        (dict(eps=float("nan")), ["eps"]),
    ]
    for kw, words in cases:
        with pytest.raises(StackSplitError) as info:
            split_decompose_resid(cache, **kw)
        for word in words:
            assert word in str(info.value), (kw, word, str(info.value))
    with pytest.raises(StackSplitError, match="reference has width"):
        split_stack_head_results(cache, reference=torch.randn(d - 1))
    with pytest.raises(StackSplitError, match="ActivationCache"):
        split_decompose_resid({"blocks.0.hook_resid_pre": torch.zeros(1)})


@pytest.mark.bridge
def test_post_ln_encoder_is_refused(tiny_model):
    model = tiny_model("bert")
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.randint(1, 100, (1, 6)))
    with pytest.raises(StackSplitError, match="post-LN"):
        split_decompose_resid(cache)
    with pytest.raises(StackSplitError, match="post-LN"):
        split_stack_head_results(cache, reference=torch.randn(int(model.cfg.d_model)))
