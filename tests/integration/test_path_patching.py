"""Directional path patching (tl_directional.path_patch).

References are independent: TransformerLens 4.3's ``get_act_patch_direct_path`` (bridge lane),
plain activation patching of the sender by hand-written hooks, and a two-pass key/value-head path
patch written in this file (run ``stream + delta`` once, copy one KV head's keys or values into the
corrupted run).
"""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.core.errors import TLDirectionalError
from tl_directional.evaluate.patching import PathPatchError, Receiver, path_patch
from tl_directional.evaluate.patching.cache_input import PatchingInputError
from tl_directional.model.load import load_model

GEN = torch.Generator().manual_seed(0)
CLEAN = torch.randint(1, 500, (3, 8), generator=GEN)
CORRUPTED = CLEAN.clone()
CORRUPTED[:, 2] = torch.randint(1, 500, (3,), generator=GEN)
CORRUPTED[:, 5] = torch.randint(1, 500, (3,), generator=GEN)


def metric(logits):
    """One logit difference per pair (shape [batch])."""
    return logits[:, -1, 3] - logits[:, -1, 4]


def scalar_metric(logits):
    return metric(logits).mean()


@pytest.fixture(scope="module")
def model64(tiny_model_dir):
    """Float64 tiny models: parity checks at 1e-6 without float32 rounding in the way."""
    loaded = {}

    def get(family):
        if family not in loaded:
            loaded[family] = load_model(tiny_model_dir(family), dtype=torch.float64).eval()
        return loaded[family]

    return get


def _z_patched_metric(model, layer, head, clean_z, metric_fn):
    """Plain activation patching of one head's ``hook_z`` (hand-written hook)."""

    def hook(z, hook):  # noqa: ARG001
        z = z.clone()
        z[:, :, head] = clean_z[:, :, head]
        return z

    logits = model.run_with_hooks(CORRUPTED, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])
    return metric_fn(logits)


# ---------------------------------------------------------------------------------------------
# (1) parity with TransformerLens 4.3's direct path patching
# ---------------------------------------------------------------------------------------------


@pytest.mark.bridge
@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_full_path_equals_transformer_lens_direct_path(model64, component):
    tl_patching = pytest.importorskip("transformer_lens.patching")
    if not hasattr(tl_patching, "get_act_patch_direct_path"):
        pytest.skip(
            "transformer_lens.patching.get_act_patch_direct_path needs TransformerLens >= 4.3"
        )
    model = model64("gpt2")
    _, clean_cache = model.run_with_cache(CLEAN)
    _, corr_cache = model.run_with_cache(CORRUPTED)
    for src in [(0, 1), (0, 3)]:
        theirs = tl_patching.get_act_patch_direct_path(
            model,
            CORRUPTED,
            clean_cache,
            corr_cache,
            scalar_metric,
            *src,
            component=component,
            verbose=False,
        )
        res = path_patch(
            model,
            CORRUPTED,
            clean_cache,
            scalar_metric,
            sender=("head", *src),
            receivers=component,
            parts="full",
        )
        ours = res.values[component]["full"][0] + res.corrupted_metric[0]
        later = slice(src[0] + 1, None)
        assert torch.allclose(
            torch.as_tensor(ours[later]), theirs[later].double().cpu(), atol=1e-6, rtol=0
        )
        assert (ours[later] != res.corrupted_metric[0]).any()  # the paths do something


# ---------------------------------------------------------------------------------------------
# (2) every downstream reader at once is activation patching of the sender
# ---------------------------------------------------------------------------------------------

ALL_READERS = ["q", "k", "v", "mlp", "logits"]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_all_readers_at_once_equals_activation_patching(model64, family):
    model = model64(family)
    _, clean_cache = model.run_with_cache(CLEAN)
    corrupted_metric = metric(model(CORRUPTED))
    for layer, head in [(0, 1), (1, 2)]:
        res = path_patch(
            model,
            CLEAN,
            CORRUPTED,
            metric,
            sender=("head", layer, head),
            receivers=ALL_READERS,
            joint=True,
            parts="full",
        )
        want = _z_patched_metric(
            model, layer, head, clean_cache[f"blocks.{layer}.attn.hook_z"], metric
        )
        torch.testing.assert_close(
            torch.as_tensor(res.values["joint"]["full"]),
            (want - corrupted_metric).double(),
            atol=1e-9,
            rtol=0,
        )
    # whole attention / MLP outputs, every part, against directional activation patching
    for comp in ("attn", "mlp"):
        res = path_patch(
            model, CLEAN, CORRUPTED, metric, sender=(comp, 0), receivers=ALL_READERS, joint=True
        )
        ref = tld.directional_patch(
            model, CLEAN, CORRUPTED, metric, components=(comp,), layers=[0], result=True
        )
        for part in ("full", "par", "perp"):
            torch.testing.assert_close(
                torch.as_tensor(res.values["joint"][part]),
                torch.as_tensor(ref.values[comp][part][:, 0]),
                atol=1e-9,
                rtol=0,
            )


# ---------------------------------------------------------------------------------------------
# (3) parallel + perpendicular = full, for the receiver's input, exactly when its norm is frozen
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # LayerNorm and RMSNorm
def test_split_paths_add_up_with_frozen_norm_only(model64, family):
    model = model64(family)
    recs = [("q", 1, 0), ("k", 1, 1), ("v", 1, 0), ("mlp", 1), ("mlp", 0)]
    for space in ("residual", "value"):
        gaps = {}
        for freeze in (True, False):
            _, inputs = path_patch(
                model,
                CLEAN,
                CORRUPTED,
                metric,
                sender=("head", 0, 2),
                receivers=recs,
                space=space,
                freeze_norm=freeze,
                return_inputs=True,
            )
            gaps[freeze] = max(
                float((inputs[("par", r)] + inputs[("perp", r)] - inputs[("full", r)]).abs().max())
                for r in {rec for _, rec in inputs}
            )
            assert all(
                float(inputs[("full", r)].abs().max()) > 1e-3 for r in {rec for _, rec in inputs}
            )
        assert gaps[True] < 1e-12, (space, gaps)
        assert gaps[False] > 1e-6, (space, gaps)  # the recomputed norm is not linear in delta


# ---------------------------------------------------------------------------------------------
# (4) key / value heads of a grouped-query model
# ---------------------------------------------------------------------------------------------


def _two_pass_kv(model, layer, head, recv_layer, kv_head, kind, clean_cache, corr_cache):
    """Independent kv-head path patch: one forward of the corrupted run with the sender's write added
    to the receiver block's stream gives that block's keys / values; a second corrupted run takes only
    KV head ``kv_head`` of them."""
    W_O = model.blocks[layer].attn.W_O[head]  # noqa: N806
    z = f"blocks.{layer}.attn.hook_z"
    delta = clean_cache[z][:, :, head] @ W_O - corr_cache[z][:, :, head] @ W_O
    got = {}

    def add(t, hook):  # noqa: ARG001
        return t + delta

    def keep(t, hook):  # noqa: ARG001
        got["kv"] = t.detach().clone()

    name = f"blocks.{recv_layer}.attn.hook_{kind}"
    model.run_with_hooks(
        CORRUPTED, fwd_hooks=[(f"blocks.{recv_layer}.hook_resid_pre", add), (name, keep)]
    )

    def put(t, hook):  # noqa: ARG001
        t = t.clone()
        t[:, :, kv_head] = got["kv"][:, :, kv_head]
        return t

    return metric(model.run_with_hooks(CORRUPTED, fwd_hooks=[(name, put)]))


def test_kv_head_granularity_on_gqa(model64):
    model = model64("llama")
    assert model.cfg.n_heads == 4 and model.cfg.n_key_value_heads == 2
    _, clean_cache = model.run_with_cache(CLEAN)
    _, corr_cache = model.run_with_cache(CORRUPTED)
    corrupted_metric = metric(model(CORRUPTED))
    res = path_patch(
        model, CLEAN, CORRUPTED, metric, sender=("head", 0, 3), receivers=["k", "v"], parts="full"
    )
    assert res.values["k"]["full"].shape == (3, 2, 2)  # [example, layer, kv head]
    for kind in ("k", "v"):
        for g in range(2):
            want = _two_pass_kv(model, 0, 3, 1, g, kind, clean_cache, corr_cache) - corrupted_metric
            torch.testing.assert_close(
                torch.as_tensor(res.values[kind]["full"][:, 1, g]), want.double(), atol=1e-9, rtol=0
            )
    assert any("key/value heads" in n for n in res.notes)


def test_kv_head_directional_patch_on_gqa(model64):
    """directional_patch patches one KV head's keys / values (shared by its query-head group)."""
    model = model64("llama")
    _, clean_cache = model.run_with_cache(CLEAN)
    corrupted_metric = metric(model(CORRUPTED))
    res = tld.directional_patch(
        model, CLEAN, CORRUPTED, metric, components=("k", "v"), layers=[1], result=True
    )
    assert res.values["v"]["full"].shape == (3, 2, 2)
    for kind in ("k", "v"):
        name = f"blocks.1.attn.hook_{kind}"
        for g in range(2):

            def put(t, hook, g=g, name=name):  # noqa: ARG001
                t = t.clone()
                t[:, :, g] = clean_cache[name][:, :, g]
                return t

            want = (
                metric(model.run_with_hooks(CORRUPTED, fwd_hooks=[(name, put)])) - corrupted_metric
            )
            torch.testing.assert_close(
                torch.as_tensor(res.values[kind]["full"][:, 1, g]), want.double(), atol=1e-9, rtol=0
            )

            def put_par(t, hook, g=g, name=name):  # noqa: ARG001
                # the clean vector's length along the corrupted one, in the corrupted direction
                t = t.clone()
                x, c = t[:, :, g], clean_cache[name][:, :, g]
                t[:, :, g] = (c * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
                return t

            want = (
                metric(model.run_with_hooks(CORRUPTED, fwd_hooks=[(name, put_par)]))
                - corrupted_metric
            )
            torch.testing.assert_close(
                torch.as_tensor(res.values[kind]["par"][:, 1, g]), want.double(), atol=1e-9, rtol=0
            )


# ---------------------------------------------------------------------------------------------
# (5) sandwich norms (Gemma-3): the head's write is what reaches the stream
# ---------------------------------------------------------------------------------------------


def test_sandwich_norm_model(model64, lane):
    model = model64("gemma3")
    _, clean_cache = model.run_with_cache(CLEAN)
    corrupted_metric = metric(model(CORRUPTED))
    res = path_patch(
        model, CLEAN, CORRUPTED, metric, sender=("head", 0, 1), receivers=ALL_READERS, joint=True
    )
    want = (
        _z_patched_metric(model, 0, 1, clean_cache["blocks.0.attn.hook_z"], metric)
        - corrupted_metric
    )
    torch.testing.assert_close(
        torch.as_tensor(res.values["joint"]["full"]), want.double(), atol=1e-9, rtol=0
    )
    sweep = path_patch(
        model,
        CLEAN,
        CORRUPTED,
        metric,
        sender=("head", 0, 1),
        receivers=["q", "k", "v"],
        space="value",
    )
    assert sweep.values["k"]["par"].shape == (3, 2, 1)
    for kind in ("q", "k", "v"):
        assert torch.isfinite(torch.as_tensor(sweep.values[kind]["perp"][:, 1])).all()
    assert any("sandwich-norm" in n for n in sweep.notes)
    if lane == "bridge":
        tl_patching = pytest.importorskip("transformer_lens.patching")
        if hasattr(tl_patching, "get_act_patch_direct_path"):
            _, corr_cache = model.run_with_cache(CORRUPTED)
            with pytest.raises(ValueError):  # what TransformerLens refuses
                tl_patching.get_act_patch_direct_path(
                    model,
                    CORRUPTED,
                    clean_cache,
                    corr_cache,
                    scalar_metric,
                    0,
                    1,
                    "q",
                    verbose=False,
                )


def test_result_frame_and_receiver_nodes(model64):
    model = model64("gpt2")
    res = path_patch(
        model,
        CLEAN,
        CORRUPTED,
        metric,
        sender=("mlp", 0),
        receivers=[Receiver("q", 1, 2), ("resid", 1), "logits"],
    )
    frame = res.to_frame(n_resamples=50)
    assert set(frame["node_type"]) == {"q", "resid", "logits"}
    assert {"full_low", "full_high", "par_frac", "random_share"} <= set(frame.columns)
    # a resid receiver at the next block is activation patching of the MLP (nothing else reads it)
    ref = tld.directional_patch(
        model, CLEAN, CORRUPTED, metric, components=("mlp",), layers=[0], result=True
    )
    torch.testing.assert_close(
        torch.as_tensor(res.values["resid"]["par"][:, 1]),
        torch.as_tensor(ref.values["mlp"]["par"][:, 0]),
        atol=1e-9,
        rtol=0,
    )


# ---------------------------------------------------------------------------------------------
# (6) bad input
# ---------------------------------------------------------------------------------------------


def test_bad_input_is_a_clear_error(tiny_model):
    model = tiny_model("gpt2")
    ok = {"sender": ("head", 0, 1)}
    cases = [
        (
            lambda: path_patch(model, CLEAN, CORRUPTED[:, :6], metric, **ok),
            "same \\[batch, pos\\] shape",
        ),
        (
            lambda: path_patch(model, CLEAN, CORRUPTED, lambda lg: lg[:, -1, :4], **ok),
            "metric returned a tensor of shape",
        ),
        (
            lambda: path_patch(model, CLEAN, CORRUPTED, metric, sender=("head", 0, 9)),
            "sender has head 9",
        ),
        (
            lambda: path_patch(model, CLEAN, CORRUPTED, metric, sender=("neuron", 0)),
            "is not a sender",
        ),
        (
            lambda: path_patch(
                model, CLEAN, CORRUPTED, metric, sender=("attn", 1), receivers=("q", 0, 0)
            ),
            "does not read the write",
        ),
        (
            lambda: path_patch(model, CLEAN, CORRUPTED, metric, receivers="z", **ok),
            "unknown kind 'z'",
        ),
        (lambda: path_patch(model, CLEAN, CORRUPTED, metric, parts="half", **ok), "parts="),
        (
            lambda: path_patch(model, CLEAN, CORRUPTED, metric, sender=("attn", 0), space="value"),
            "not a head",
        ),
    ]
    for call, match in cases:
        with pytest.raises(PathPatchError, match=match):
            call()
    assert issubclass(PathPatchError, TLDirectionalError)
    with pytest.raises(PatchingInputError, match="clean_cache has no 'blocks.0.attn.hook_z'"):
        path_patch(
            model, CORRUPTED, {"blocks.0.hook_resid_pre": torch.zeros(3, 8, 32)}, metric, **ok
        )
    with pytest.raises(PatchingInputError, match="names_filter drops"):
        path_patch(model, CLEAN, CORRUPTED, metric, names_filter=["blocks.0.attn.hook_z"], **ok)
    with pytest.raises(TLDirectionalError, match="post-LN"):  # no path of its own on an encoder
        path_patch(tiny_model("bert"), CLEAN, CORRUPTED, metric, **ok)
    # training mode with live dropout: tests/integration/test_verb_preflight.py (every verb)
