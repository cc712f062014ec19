"""The split logit lens (tl_directional.evaluate.lens.lens) on tiny seeded models.

* parity: unsplit, the lens logits equal TransformerLens 4.3's ``logit_lens`` (recomputed final-norm
  statistics) to 1e-6 on the bridge lane (GPT-2 LayerNorm, Llama RMSNorm with GQA, Gemma-3
  sandwich norms);
* additivity (float64): parallel + perpendicular == full for every ordering, per step and per layer,
  and the layers' changes add up to final - embedding lens logit;
* the pure-parallel scale identity: adding ``u_par = a x`` to the stream ``x`` changes the lens logit
  only through the final norm's ``eps`` (and a sign flip when ``1 + a < 0``), checked against a
  final norm written here;
* no gradients needed; errors name the argument and the fix.
"""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.lens import LensInputError, SplitLensResult, split_logit_lens

GEN = torch.Generator().manual_seed(0)
TOKENS = torch.randint(1, 500, (2, 7), generator=GEN)
TARGETS = torch.randint(1, 500, (2, 7), generator=GEN)


@pytest.fixture(scope="module")
def model64(tiny_model):
    cache: dict[str, object] = {}

    def _get(family: str):
        if family not in cache:
            cache[family] = tiny_model(family, fresh=True).to(torch.float64)
        return cache[family]

    return _get


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_unsplit_lens_equals_transformer_lens_logit_lens(tiny_model, lane, family):
    if lane != "bridge":
        pytest.skip(
            "transformer_lens.tools.analysis.logit_lens is TransformerLens 4.3 (bridge lane)"
        )
    from transformer_lens.tools.analysis.logit_lens import logit_lens

    model = tiny_model(family)
    result = split_logit_lens(model, TOKENS, targets=TARGETS)
    theirs = logit_lens(model, TOKENS, positions=None, targets=TARGETS)
    assert theirs.labels[0] == "0_pre" and theirs.labels[-1] == "final_post"
    torch.testing.assert_close(
        result.lens_logits, theirs.values[..., 0].double(), atol=1e-6, rtol=0
    )
    # a shared target (one id for every position) reads the same column
    shared = split_logit_lens(model, TOKENS, targets=7)
    torch.testing.assert_close(
        shared.lens_logits,
        logit_lens(model, TOKENS, positions=None, targets=7).values[..., 0].double(),
        atol=1e-6,
        rtol=0,
    )


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox", "gemma3"])
def test_parts_add_up_to_the_lens_change_exactly_in_float64(model64, family):
    model = model64(family)
    result = split_logit_lens(model, TOKENS, targets=TARGETS)
    n_layers = model.cfg.n_layers
    assert result.full.shape == (n_layers, 2, 7) and result.lens_logits.shape == (
        n_layers + 1,
        2,
        7,
    )
    assert result.components == (("attn+mlp",) if family == "neox" else ("attn", "mlp"))
    torch.testing.assert_close(result.step_full.sum(1), result.full, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        result.full.sum(0), result.lens_logits[-1] - result.lens_logits[0], atol=1e-12, rtol=0
    )
    for ordering in ("shapley", "parallel_first", "perpendicular_first"):
        total = result.parallel(ordering) + result.perpendicular(ordering)
        torch.testing.assert_close(total, result.full, atol=1e-12, rtol=0)
        frame = result.to_frame(ordering)
        assert (frame["parallel"] + frame["perpendicular"] - frame["full"]).abs().max() < 1e-12
        steps = result.to_frame(ordering, by_component=True)
        assert (steps["parallel"] + steps["perpendicular"] - steps["full"]).abs().max() < 1e-12
        summed = (
            steps.groupby(["layer", "batch", "position"])[["full", "parallel"]].sum().reset_index()
        )
        assert (summed["full"].to_numpy() - frame["full"].to_numpy()).__abs__().max() < 1e-12
        assert (
            summed["parallel"].to_numpy() - frame["parallel"].to_numpy()
        ).__abs__().max() < 1e-12
    shapley = result.parallel("shapley")
    torch.testing.assert_close(
        shapley, 0.5 * (result.parallel("parallel_first") + result.parallel("perpendicular_first"))
    )
    assert float(result.additive_error.max()) < 1e-10
    share = result.shares(position=-1, batch=1)
    assert share["parallel_share"] + share["perpendicular_share"] == pytest.approx(1.0, abs=1e-9)


def _hand_norm(model, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The final norm written here: RMSNorm ``x / sqrt(mean(x^2) + eps) * w`` or LayerNorm."""
    w = model.ln_final.w
    b = getattr(model.ln_final, "b", None)
    if model.cfg.normalization_type in ("RMS", "RMSPre"):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt((centred * centred).mean(-1, keepdim=True) + eps) * w + b


def _hand_logit(model, x, targets, eps) -> torch.Tensor:
    w_u = model.W_U[:, targets].permute(1, 2, 0)
    return (_hand_norm(model, x, eps) * w_u).sum(-1) + model.b_U[targets]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_pure_parallel_update_only_rescales_the_norms_eps(model64, family):
    """norm(c x; eps) = sign(c) norm(x; eps / c^2) (RMSNorm exactly; LayerNorm too, as centring
    commutes with scaling, and LN's bias is not flipped): the parallel-first parallel part of each
    step equals f(x; eps/c^2) - f(x; eps) (sign-flipped when c = 1 + a < 0), computed by hand."""
    model = model64(family)
    eps = float(model.cfg.eps)
    result = split_logit_lens(model, TOKENS, targets=TARGETS)
    _, cache = model.run_with_cache(TOKENS)
    for layer in range(model.cfg.n_layers):
        for c, (start, update) in enumerate(
            (("hook_resid_pre", "hook_attn_out"), ("hook_resid_mid", "hook_mlp_out"))
        ):
            x, u = cache[f"blocks.{layer}.{start}"], cache[f"blocks.{layer}.{update}"]
            scale = 1 + (u * x).sum(-1) / (x * x).sum(-1)
            # the identity itself, on the model's real streams
            lhs = _hand_norm(model, scale[..., None] * x, eps)
            flip = torch.sign(scale)[..., None]
            b = getattr(model.ln_final, "b", None)
            shift = 0 if b is None else b
            rhs = flip * (_hand_norm(model, x, eps / scale[..., None] ** 2) - shift) + shift
            torch.testing.assert_close(lhs, rhs, atol=1e-12, rtol=1e-12)
            # and the library's parallel-first parallel part is exactly that eps / sign effect
            f0 = _hand_logit(model, x, TARGETS, eps)
            w_u = model.W_U[:, TARGETS].permute(1, 2, 0)
            f_scaled = (
                (flip * (_hand_norm(model, x, eps / scale[..., None] ** 2) - shift) + shift) * w_u
            ).sum(-1) + model.b_U[TARGETS]
            # 1e-6, not 1e-12: HF's LlamaRMSNorm (which the bridge runs) normalises in float32 even
            # in a float64 model, so the library's lens carries float32 rounding of logits ~1
            torch.testing.assert_close(
                result.parallel_if_first[layer, c], f_scaled - f0, atol=1e-6, rtol=0
            )
            # where the stream keeps its sign and eps is small next to its mean square, ~0
            keep = (scale > 0) & ((x * x).mean(-1) > 1e3 * eps)
            assert keep.any()
            assert (
                result.parallel_if_first[layer, c][keep].abs().max()
                < 1e-2 * result.full.abs().max()
            )


def test_no_gradients_are_needed(tiny_model):
    model = tiny_model("llama")
    plain = split_logit_lens(model, TOKENS, targets=TARGETS)
    with torch.inference_mode():
        inference = split_logit_lens(model, TOKENS, targets=TARGETS)
    assert not plain.lens_logits.requires_grad and not plain.parallel_if_last.requires_grad
    torch.testing.assert_close(plain.lens_logits, inference.lens_logits, atol=0, rtol=0)
    assert torch.is_grad_enabled()


def test_target_forms_and_the_frame_and_figure(tiny_model):
    model = tiny_model("gpt2")
    per_seq = split_logit_lens(model, TOKENS, targets=[5, 9], ordering="parallel_first")
    assert per_seq.targets.tolist() == [[5] * 7, [9] * 7]
    per_seq_t = split_logit_lens(model, TOKENS, targets=torch.tensor([5, 9]))
    torch.testing.assert_close(per_seq.lens_logits, per_seq_t.lens_logits)
    one = split_logit_lens(model, TOKENS[0], targets=5)
    # (float32 batch-size rounding only)
    torch.testing.assert_close(one.lens_logits[:, 0], per_seq.lens_logits[:, 0], atol=1e-6, rtol=0)
    frame = per_seq.to_frame()
    assert {
        "layer",
        "position",
        "full",
        "parallel",
        "perpendicular",
        "parallel_if_first",
        "parallel_if_last",
    } <= set(frame.columns)
    assert len(frame) == model.cfg.n_layers * 2 * 7
    assert (frame["parallel"] - frame["parallel_if_first"]).abs().max() == 0  # the ordering chosen
    view = per_seq.figure(batch=1)
    assert len(view.figure.data) == 3
    assert [a.text for a in view.figure.layout.annotations] == [
        "full change",
        "parallel part",
        "perpendicular part",
    ]
    assert isinstance(per_seq, SplitLensResult)
    assert tld.split_logit_lens is split_logit_lens


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"targets": 10**7}, "targets must be ids in [0, 512)"),
        ({"targets": -1}, "targets must be ids in [0, 512)"),
        ({"targets": torch.tensor([1.0, 2.0])}, "targets must hold integer token ids"),
        (
            {"targets": torch.zeros(3, 7, dtype=torch.long)},
            "fits neither [batch]=2 nor [batch, pos]=[2, 7]",
        ),
        ({"targets": [1, 2, 3]}, "targets has 3 entries but tokens has batch=2"),
        ({"targets": None}, "targets is required"),
        ({"targets": 1, "ordering": "random"}, "ordering must be one of"),
    ],
)
def test_bad_targets_name_the_argument_and_the_fix(tiny_model, kwargs, needle):
    with pytest.raises(LensInputError) as info:
        split_logit_lens(tiny_model("gpt2"), TOKENS, **kwargs)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, tld.TLDirectionalError)


@pytest.mark.parametrize(
    ("tokens", "needle"),
    [
        (TOKENS.float(), "tokens must be an integer tensor [batch, pos]"),
        ([[1, 2, 3]], "tokens must be an integer tensor [batch, pos]"),
        (TOKENS[None], "tokens must be shaped [batch, pos]"),
        (torch.zeros(2, 0, dtype=torch.long), "tokens must be shaped [batch, pos]"),
        (TOKENS + 1000, "tokens must be ids in [0, 512)"),
    ],
)
def test_bad_tokens_name_the_argument_and_the_fix(tiny_model, tokens, needle):
    with pytest.raises(LensInputError, match=None) as info:
        split_logit_lens(tiny_model("gpt2"), tokens, targets=1)
    assert needle in str(info.value)


def test_multi_token_strings_are_refused(tiny_model):
    """(Training mode with live dropout: tests/integration/test_verb_preflight.py, every verb.)"""
    model = tiny_model("gpt2", fresh=True)
    if getattr(model, "tokenizer", None) is not None:
        with pytest.raises(LensInputError, match="not one; pass a single-token"):
            split_logit_lens(model, TOKENS, targets=" antidisestablishmentarianism")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_row_equals_the_row_alone(tiny_model, family, side):
    """With ``attention_mask`` a padded row's lens and its split equal the same row run alone,
    within float32 round-off (a batched and a single-row forward reduce in other orders), and
    padded positions are NaN. (Float32: in float64 the bridge's left-padded Llama fills padded
    positions with NaN that attention then spreads, an upstream behaviour of every verb.)"""
    from tl_directional.core.roundoff import roundoff_tolerance
    from tl_directional.model.inputs import pad_sequences

    model = tiny_model(family)
    short, long = TOKENS[0, :4].tolist(), TOKENS[1].tolist()
    padded = pad_sequences([short, long], pad_id=0, padding_side=side)
    targets = torch.full(padded.tokens.shape, 7)
    got = split_logit_lens(model, padded.tokens, targets=targets, attention_mask=padded.attention_mask)
    alone = split_logit_lens(model, torch.tensor([short]), targets=7)
    real = padded.attention_mask[0].bool()
    terms = model.cfg.d_model * model.cfg.n_layers
    for name in ("lens_logits", "full", "parallel_if_first", "parallel_if_last"):
        mine, ref = getattr(got, name)[..., 0, :], getattr(alone, name)[..., 0, :]
        gap, limit = float((mine[..., real] - ref).abs().max()), roundoff_tolerance(
            torch.float32, float(alone.lens_logits.abs().max()), terms)
        assert gap <= limit, (name, gap, limit)
        assert torch.isnan(mine[..., ~real]).all(), name
    # without the mask the padded row reads the padding as tokens: the lens moves (test can fail)
    if side == "left":
        unmasked = split_logit_lens(model, padded.tokens, targets=targets)
        assert (unmasked.lens_logits[..., 0, :][..., real] - alone.lens_logits[..., 0, :]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("mask", "needle"),
    [
        (torch.tensor([[1, 1, 0.5, 1, 1, 1, 1], [1] * 7]), "dtype torch.float32"),
        (torch.tensor([[1, 1, 2, 1, 1, 1, 1], [1] * 7]), r"holds \[2\]"),
        (torch.tensor([[1, 1, -1, 1, 1, 1, 1], [1] * 7]), r"holds \[-1\]"),
        (torch.ones(2, 6, dtype=torch.long), "shape"),
        (torch.tensor([[0] * 7, [1] * 7]), "all padding"),
    ],
)
def test_bad_attention_masks_are_refused(tiny_model, mask, needle):
    with pytest.raises(LensInputError, match=needle):
        split_logit_lens(tiny_model("gpt2"), TOKENS, targets=7, attention_mask=mask)
