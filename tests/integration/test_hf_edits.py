"""tl_directional.edit.hf: the package's edits on plain ``transformers`` models (module hooks).

Checked against the TransformerLens lane on the same weights: the same edit object installed on
the HF model and on the TL model (the one ``tl_directional.apply_edits``)
gives the same next-token loss and the same parameter gradients (the bridge wraps the HF modules,
so its gradients are read under the HF names): in float64 within 1e-7 (bridge) / 1e-6 (legacy,
its own layers), where exactness is the claim; in float32, the dtype users train in, within the
round-off bound of :func:`tl_directional.core.roundoff.roundoff_tolerance` (the two lanes reduce
in different orders, and how far that moves a gradient depends on the CPU's kernels). At scale 1 every edit
is a bit-exact no-op (``torch.equal`` against the unhooked logits). Families: GPT-2, Llama (GQA),
Qwen3 (GQA, q/k norms; built here from a Qwen3Config), Gemma-3 (sandwich norms, one KV head),
GPT-NeoX (parallel block, fused per-head qkv); the two real models in
tests/real/test_hf_edits_real.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import tl_directional as tld
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.edit import DiagonalRemoval, EffectiveDiagonal, ResidualScale, ValueScale
from tl_directional.edit import hf as thf
from tl_directional.model.handle import hf_state_dict
from tl_directional.model.lanes import lane_of
from tl_directional.model.load import load_hf_model, load_model

FAMILIES = ("gpt2", "llama", "qwen3", "gemma3", "neox")


def _edits():
    """Damaging edits of every kind, scoped and unscoped (ids are their reprs)."""
    return [
        ValueScale(0.0),
        ValueScale(0.3, 1.5, mode="exclusive"),
        ValueScale(0.0, mode="exclusive", layers=[1], heads=[0, 3]),
        ResidualScale("attn", 0.0),
        ResidualScale("mlp", 0.5, 1.2),
        ResidualScale("block", 0.0, layers=[0]),
        DiagonalRemoval(),
        EffectiveDiagonal(0.0, heads=[1, 2]),
        ValueScale(2.0, positions=[-1, 3]),
        ValueScale(0.3, 1.5, mode="exclusive", joint=True),
        ValueScale(0.0, layers=[1], joint=True),
    ]


EDIT_IDS = [repr(e) for e in _edits()]


def _build_qwen3(path: Path, tokenizer_dir: Path) -> Path:
    """A seeded 2-layer Qwen3 (4 query heads, 2 KV heads, q/k RMSNorm), the tiny llama tokenizer."""
    import transformers

    from tl_directional.model.load.tiny import _seeded_init_

    cfg = transformers.Qwen3Config(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, rms_norm_eps=1e-6,
        tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        model = transformers.Qwen3ForCausalLM(cfg)
    _seeded_init_(model, 0, 32)
    from tl_directional.model.lanes import quiet_transformers

    with quiet_transformers():
        model.save_pretrained(path)
    for f in os.listdir(tokenizer_dir):
        if "token" in f:
            shutil.copy(tokenizer_dir / f, path)
    return path


@pytest.fixture(scope="module")
def family_dir(tiny_model_dir, tmp_path_factory):
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            if family == "qwen3":
                built[family] = _build_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), tiny_model_dir("llama"))
            else:
                built[family] = tiny_model_dir(family)
        return built[family]

    return get


@pytest.fixture(scope="module")
def pair(family_dir):
    """``family -> (tl_model, hf_model)``: the same weights on both paths (private instances)."""
    cache: dict[str, tuple] = {}

    def get(family: str):
        if family not in cache:
            d = family_dir(family)
            cache[family] = (load_model(d).eval(), load_hf_model(d))
        return cache[family]

    return get


def _ids(batch: int = 2, pos: int = 12, vocab: int = 512, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             ids[:, 1:].reshape(-1))


def _hooks_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _tl_grads(tl) -> dict[str, torch.Tensor]:
    """Gradients of the TL model under HF parameter names (bridge: the wrapped HF parameters)."""
    return {k: v.grad for k, v in hf_state_dict(tl, keep_vars=True).items()
            if isinstance(v, torch.nn.Parameter) and v.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
def test_scale_one_is_bit_exact(pair, family):
    _, hf = pair(family)
    ids = _ids()
    before = _hooks_count(hf)
    with torch.no_grad():
        base = hf(ids).logits
        for e in [ValueScale(1.0), ValueScale(1.0, 1.0, mode="exclusive"), ResidualScale("attn"),
                  ResidualScale("mlp"), ResidualScale("block"), EffectiveDiagonal(1.0)]:
            with tld.apply_edits(hf, e):
                got = hf(ids).logits
            assert torch.equal(got, base), f"{family}: {e!r} at scale 1 changed the logits"
        # all of them at once, composed
        with tld.apply_edits(hf, ValueScale(1.0), ValueScale(1.0, mode="exclusive"), ResidualScale("attn"),
                             ResidualScale("block")):
            assert torch.equal(hf(ids).logits, base)
    assert _hooks_count(hf) == before


def _compositions():
    """Pattern and value edits sharing a layer, in both orders: the plain lane must compose them
    as the TransformerLens lanes do (pattern edits at hook_pattern in the order given, an
    exclusive edit reading the pattern as it stands at its place, then the value edits on z)."""
    return [
        (ValueScale(0.0, mode="exclusive", layers=[1]), DiagonalRemoval(layers=[1])),
        (DiagonalRemoval(layers=[1]), ValueScale(0.0, mode="exclusive", layers=[1])),
        (EffectiveDiagonal(0.5, layers=[0]), ValueScale(0.5)),
        (EffectiveDiagonal(0.0, heads=[1, 2]), ValueScale(0.3, 1.5, mode="exclusive"), DiagonalRemoval(heads=[0, 1])),
        (DiagonalRemoval(), EffectiveDiagonal(0.0)),
        (ValueScale(2.0, positions=[-1, 3]), DiagonalRemoval(), ValueScale(0.0, layers=[1], joint=True)),
    ]


COMPOSITION_IDS = [" + ".join(repr(e) for e in c) for c in _compositions()]


@pytest.fixture(scope="module")
def pair64(family_dir):
    """``family -> (tl_model, hf_model)`` in float64: where float32 round-off is amplified (an
    unscoped ``EffectiveDiagonal(0.0)`` on Gemma-3 moves the embedding gradient by ~1e-4 on
    both lanes alike), float64 separates a different composition from round-off. The unedited
    lanes already differ slightly in float64 (GPT-NeoX keeps part of its attention in float32;
    the legacy lane re-implements the layers): :func:`_float64_tolerance` bounds that gap and
    ``test_unedited_lanes_agree_in_float64`` holds it."""
    cache: dict[str, tuple] = {}

    def get(family: str):
        if family not in cache:
            d = family_dir(family)
            cache[family] = (load_model(d).eval().to(torch.float64), load_hf_model(d).to(torch.float64))
        return cache[family]

    return get


def _roundoff_terms(tl) -> int:
    """Rounded terms along a gradient's longest chain: forward and backward through every layer,
    each reducing over the widest of d_model and d_mlp (tl_directional.core.roundoff)."""
    cfg = tl.cfg
    return 2 * cfg.n_layers * max(cfg.d_model, cfg.d_mlp or cfg.d_model)


def _check_same_loss_and_gradients(tl, hf, family, edits, tol=None):
    """Same loss and parameter gradients on both lanes. ``tol``: an absolute tolerance (float64
    runs); None bounds each float32 difference by the round-off of what it compares."""
    ids = _ids()
    tl.zero_grad(set_to_none=True)
    hf.zero_grad(set_to_none=True)
    with tld.apply_edits(tl, *edits):
        loss_tl = _loss(tl(ids), ids)
    loss_tl.backward()
    with torch.no_grad():
        base = _loss(hf(ids).logits, ids)
    with tld.apply_edits(hf, *edits):
        loss_hf = _loss(hf(ids).logits, ids)
    loss_hf.backward()
    dtype, terms = next(hf.parameters()).dtype, _roundoff_terms(tl)

    def bound(scale: float) -> float:
        return tol if tol is not None else roundoff_tolerance(dtype, scale, terms)

    assert abs(float(base) - loss_hf.item()) > 1e-4, "the edit should change the loss (test can fail)"
    gap = abs(loss_tl.item() - loss_hf.item())
    assert gap <= bound(abs(loss_hf.item())), (loss_tl.item(), loss_hf.item())
    if lane_of(tl) != "bridge":
        return  # legacy HookedTransformer parameters have TL layouts; the loss check stands
    g_tl = _tl_grads(tl)
    g_hf = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    # GPT-2's bridge splits c_attn into q/k/v parameters: compare the names both sides have
    common = set(g_hf) & set(g_tl)
    assert len(common) >= len(g_hf) - 2 * len(hf.config.to_dict().get("n_layer", 2) * [0]) and len(common) > 5
    for n in sorted(common):
        # each parameter's gradient against its own size: a wrong composition moves it by far more
        worst, limit = float((g_tl[n] - g_hf[n]).abs().max()), bound(float(g_hf[n].abs().max()))
        assert worst <= limit, f"{family} {edits!r}: {n}: gradient difference {worst:.3g} > {limit:.3g}"
    tl.zero_grad(set_to_none=True)
    hf.zero_grad(set_to_none=True)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k", range(len(EDIT_IDS)), ids=EDIT_IDS)
def test_equals_transformerlens_edit_loss_and_gradients(pair, family, k):
    tl, hf = pair(family)
    _check_same_loss_and_gradients(tl, hf, family, (_edits()[k],))


def _float64_tolerance(tl) -> float:
    """Loss / gradient tolerance between the lanes in float64: 1e-7 on the bridge (it runs the HF
    modules), 1e-6 on the legacy HookedTransformer (its own layers)."""
    return 1e-7 if lane_of(tl) == "bridge" else 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_unedited_lanes_agree_in_float64(pair64, family):
    tl, hf = pair64(family)
    ids = _ids()
    with torch.no_grad():
        gap = abs(float(_loss(tl(ids), ids)) - float(_loss(hf(ids).logits, ids)))
    assert gap <= _float64_tolerance(tl) / 2, f"{family}: unedited float64 loss gap {gap:.3g}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k", range(len(COMPOSITION_IDS)), ids=COMPOSITION_IDS)
def test_pattern_and_value_edits_in_one_layer_compose_as_on_transformerlens(pair64, family, k):
    tl, hf = pair64(family)
    edits = _compositions()[k]
    _check_same_loss_and_gradients(tl, hf, family, edits, tol=_float64_tolerance(tl))
    if k == 0:
        # the order is part of the composition: an exclusive removal before the diagonal
        # removal splits off A_tt v_t; after it, A_tt is 0 and the whole aggregate is split
        ids = _ids()
        with torch.no_grad(), tld.apply_edits(hf, *edits):
            a = hf(ids).logits
        with torch.no_grad(), tld.apply_edits(hf, *edits[::-1]):
            b = hf(ids).logits
        assert float((a - b).abs().max()) > 1e-4


def test_gqa_heads_read_their_kv_head(pair):
    """Llama with 4 query heads on 2 KV heads: query head h is split against KV head h // 2's value.

    Scoped to one query head, the edit must change only that head's slice of the o_proj input,
    and equal the hand-written split against v_proj's KV head h // 2."""
    _, hf = pair("llama")
    ids = _ids(1, 10)
    attn = hf.model.layers[0].self_attn
    seen: dict = {}
    h1 = attn.v_proj.register_forward_hook(lambda m, a, o: seen.__setitem__("v", o.detach()))
    h2 = attn.o_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0].detach()))
    try:
        with torch.no_grad():
            hf(ids)
            z0, v = seen["z"].view(1, 10, 4, 8), seen["v"].view(1, 10, 2, 8)
            with tld.apply_edits(hf, ValueScale(0.0, layers=[0], heads=[3])):
                hf(ids)
    finally:
        h1.remove()
        h2.remove()
    z, r = z0[0, :, 3].double(), v[0, :, 1].double()  # query head 3 reads KV head 3 // 2 = 1
    expected = z - ((z * r).sum(-1, keepdim=True) / (r * r).sum(-1, keepdim=True)) * r
    out: dict = {}
    h4 = attn.register_forward_hook(lambda m, a, o: out.__setitem__("o", o[0].detach()))
    try:
        with torch.no_grad(), tld.apply_edits(hf, ValueScale(0.0, layers=[0], heads=[3])):
            hf(ids)
    finally:
        h4.remove()
    z_full = z0.clone().double()
    z_full[0, :, 3] = expected
    want = torch.nn.functional.linear(z_full.reshape(1, 10, 32), attn.o_proj.weight.double())
    assert float((out["o"].double() - want).abs().max()) < 1e-5
    # and the wrong KV head gives a different result (so the check can fail)
    wrong = z - ((z * v[0, :, 0].double()).sum(-1, keepdim=True) / (v[0, :, 0].double() ** 2).sum(-1, keepdim=True)) * v[0, :, 0].double()
    assert float((wrong - expected).abs().max()) > 1e-3


def test_unknown_architecture_names_class_and_families(tiny_model_dir):
    bert = load_hf_model(tiny_model_dir("bert"))
    with pytest.raises(thf.UnsupportedModelError) as err:
        thf.install_edits(bert, ValueScale(0.0))
    msg = str(err.value)
    assert "BertForMaskedLM" in msg and "'bert'" in msg and "GPT-2" in msg and "Gemma-3" in msg
    assert _hooks_count(bert) == 0
    with pytest.raises(thf.UnsupportedModelError, match="TransformerLens"):
        thf.install_edits(load_model(tiny_model_dir("gpt2")), ValueScale(0.0))


def test_install_twice_refused_and_remove(pair):
    _, hf = pair("gpt2")
    before = _hooks_count(hf)
    handle = thf.install_edits(hf, ValueScale(0.0))
    try:
        assert thf.installed_edits(hf) is handle and _hooks_count(hf) > before
        with pytest.raises(thf.EditsAlreadyInstalledError, match=r"handle\.remove\(\)"):
            thf.install_edits(hf, ResidualScale("attn", 0.0))
    finally:
        handle.remove()
    handle.remove()  # idempotent
    assert _hooks_count(hf) == before and thf.installed_edits(hf) is None
    with thf.install_edits(hf, ValueScale(0.0)) as h2:
        assert h2.active
    assert _hooks_count(hf) == before


@pytest.mark.parametrize("family", ("gpt2", "llama"))
def test_nested_apply_edits_compose_as_on_transformerlens(pair64, family):
    """``apply_edits`` blocks nest on a plain ``transformers`` model as on TransformerLens (they
    used to raise EditsAlreadyInstalledError there): the inner block's edits compose after the
    outer ones, equal to one block with both, equal to the TL lane's nesting (float64); on exit
    the outer edits are back under their own handle, and after the outer block nothing is left."""
    tl, hf = pair64(family)
    ids = _ids()
    outer, inner = ValueScale(0.0, mode="exclusive", layers=[1]), DiagonalRemoval(layers=[1])
    before = _hooks_count(hf)
    with torch.no_grad():
        with tld.apply_edits(hf, outer):
            handle = thf.installed_edits(hf)
            outer_only = hf(ids).logits
            with tld.apply_edits(hf, inner):
                nested = hf(ids).logits
            assert thf.installed_edits(hf) is handle and handle.active
            assert torch.equal(hf(ids).logits, outer_only)
        assert _hooks_count(hf) == before and thf.installed_edits(hf) is None
        with tld.apply_edits(hf, outer, inner):
            together = hf(ids).logits
        with tld.apply_edits(tl, outer), tld.apply_edits(tl, inner):
            on_tl = tl(ids)
    assert torch.equal(nested, together)
    assert float((nested - outer_only).abs().max()) > 1e-4  # the inner edit acted
    # the lanes' own gap bounds the loss (the legacy lane re-implements the layers; HF's RMSNorm
    # computes in float32 whatever the dtype, so logits differ by ~1e-6 there even in float64)
    assert abs(float(_loss(nested, ids)) - float(_loss(on_tl, ids))) <= _float64_tolerance(tl)


def test_nothing_left_installed_after_an_exception(pair):
    _, hf = pair("llama")
    before = _hooks_count(hf)
    with pytest.raises(ZeroDivisionError):
        with tld.apply_edits(hf, ValueScale(0.0), ResidualScale("mlp", 0.0)):
            hf(_ids())
            1 / 0  # noqa: B018
    assert _hooks_count(hf) == before and thf.installed_edits(hf) is None
    # an error while installing (a bad scale shape on the second edit) leaves nothing either
    with pytest.raises(ValueError, match="s_par has shape"):
        thf.install_edits(hf, ValueScale(0.0), ResidualScale("attn", torch.zeros(7)))
    assert _hooks_count(hf) == before and thf.installed_edits(hf) is None
    with pytest.raises(TypeError, match=r"edits\[1\]"):
        thf.install_edits(hf, ValueScale(0.0), "not an edit")


def test_pattern_edits_refused_without_eager_attention(family_dir):
    import transformers

    sdpa = transformers.AutoModelForCausalLM.from_pretrained(str(family_dir("llama")), attn_implementation="sdpa")
    for e in (ValueScale(0.0, mode="exclusive"), DiagonalRemoval()):
        with pytest.raises(thf.AttentionPatternUnavailableError) as err:
            thf.install_edits(sdpa, e)
        assert "'sdpa'" in str(err.value) and "attn_implementation='eager'" in str(err.value)
    assert _hooks_count(sdpa) == 0
    # full-aggregate value edits need no pattern and run on sdpa, equal to eager
    eager = load_hf_model(family_dir("llama"))
    ids = _ids()
    with torch.no_grad(), tld.apply_edits(sdpa, ValueScale(0.0)):
        a = sdpa(ids).logits
    with torch.no_grad(), tld.apply_edits(eager, ValueScale(0.0)):
        b = eager(ids).logits
    assert float((a - b).abs().max()) < 1e-4


def test_cached_generation_matches_uncached_forward(pair):
    """With a KV cache the hooks see one new position at a time; positions stay absolute."""
    _, hf = pair("llama")
    ids = _ids(1, 6)
    edit = ValueScale(0.0, mode="exclusive", positions=[7])
    with torch.no_grad():
        base = hf.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad(), tld.apply_edits(hf, edit):
        out = hf.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        full = hf(out).logits  # uncached forward over the generated sequence, same edit
    greedy = full[0, 5:-1].argmax(-1)
    assert torch.equal(greedy, out[0, 6:])
    assert not torch.equal(out, base), "the edit at position 7 should change the generation"


@pytest.mark.parametrize("edits", [
    (EffectiveDiagonal(0.0, heads=[1, 2]), ValueScale(0.3, 1.5, mode="exclusive"), DiagonalRemoval(heads=[0, 1])),
    (DiagonalRemoval(layers=[1]), ValueScale(0.0, mode="exclusive", layers=[1]), ValueScale(0.5, layers=[0])),
], ids=["effdiag+exclusive+diag", "diag+exclusive+full"])
def test_cached_generation_composes_pattern_and_value_edits_as_the_full_forward(pair, edits):
    """Composed pattern and value edits during KV-cached generation (one new query against cached
    keys: the diagonal is at ``offset + t``) give the logits of one uncached forward pass over the
    generated sequence with the same edits."""
    _, hf = pair("llama")
    ids = _ids(1, 6)
    with torch.no_grad(), tld.apply_edits(hf, *edits):
        gen = hf.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0,
                          return_dict_in_generate=True, output_logits=True)
        full = hf(gen.sequences).logits
        plain = hf.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    step_logits = torch.stack(gen.logits, 1)[0]  # [new tokens, vocab]
    worst = float((step_logits - full[0, 5:-1]).abs().max())
    assert worst <= 1e-4, f"cached and uncached logits differ by {worst:.3g}"
    with torch.no_grad():
        unedited = hf(gen.sequences).logits
    assert float((unedited - full).abs().max()) > 1e-3, "the edits should change the logits (test can fail)"
    assert torch.equal(plain, gen.sequences)


@pytest.mark.parametrize("family", ("llama", "gpt2"))
def test_negative_positions_follow_right_padding(pair, family):
    """``positions=[-1]`` is each row's last real token under the forward's attention mask."""
    tl, hf = pair(family)
    ids = _ids(2, 10)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # row 1: 7 real tokens, then padding
    edit = ValueScale(0.0, 2.0, positions=[-1])
    with torch.no_grad():
        base = hf(ids, attention_mask=mask).logits
        with tld.apply_edits(tl, edit):
            a = tl(ids, attention_mask=mask)
        with tld.apply_edits(hf, edit):
            b = hf(ids, attention_mask=mask).logits
    real = mask.bool()
    assert float((a - b)[real].abs().max()) < 1e-4
    changed = (b - base).abs().amax(-1) > 1e-5  # [batch, pos]
    assert changed[0, 9] and not changed[0, :9].any()
    assert changed[1, 6] and not changed[1, :6].any()


def test_importing_the_package_does_not_import_lm_eval_or_the_trainer():
    import subprocess
    import sys

    code = ("import sys, tl_directional as t; t.hf.install_edits; "
            "bad = [m for m in ('lm_eval', 'transformers.trainer', 'tl_directional.training.hf_callback') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("family", ("gpt2", "llama"))
def test_one_apply_edits_gives_the_same_logits_on_the_bridge_and_plain_transformers(pair, family):
    """``tl_directional.apply_edits`` is one verb for every lane: the same edit objects, applied
    through it to the TransformerLens model and to the plain ``transformers`` model of the same
    weights, give the same logits; each lane is left as it was (no hook, no handle, bit-identical
    logits after the block), and a block with no edits is a no-op on both."""
    tl, hf = pair(family)
    ids = _ids()
    composed = (ValueScale(0.0, mode="exclusive", heads=[1], layers=[1]), ResidualScale("mlp", 0.5, 1.2),
                DiagonalRemoval(layers=[0]))
    with torch.no_grad():
        base_tl, base_hf = tl(ids), hf(ids).logits
        hooks_before = _hooks_count(hf)
        for edits in [(ValueScale(0.0),), (EffectiveDiagonal(0.0),), (ValueScale(0.3, 1.5, joint=True),), composed]:
            with tld.apply_edits(tl, *edits) as m_tl:
                a = m_tl(ids)
            with tld.apply_edits(hf, *edits) as m_hf:
                assert m_hf is hf and thf.installed_edits(hf) is not None
                b = hf(ids).logits
            assert float((a - base_tl).abs().max()) > 1e-3, "the edit should change the logits (test can fail)"
            assert float((a - b).abs().max()) <= 1e-4, (family, edits)
            assert _hooks_count(hf) == hooks_before and thf.installed_edits(hf) is None
        assert torch.equal(tl(ids), base_tl) and torch.equal(hf(ids).logits, base_hf)
        with tld.apply_edits(hf):
            assert torch.equal(hf(ids).logits, base_hf)
    with pytest.raises(TypeError, match="plain transformers"):
        tld.edit_hooks(hf, ValueScale(0.0))
