"""Tests for tl_directional.model.load: seeded tiny HF models and loading them on either lane."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from tl_directional.model.families.hf import FAMILIES
from tl_directional.model.load import (
    BUILD_INFO_FILE,
    DEFAULT_MODEL_SPEC,
    ENDOFTEXT,
    build_tiny_hf_model,
    default_model_dir,
    load_default_model,
    load_hf_model,
    load_model,
    tl_lane,
    train_tokenizer,
)

from ._families import LOADABLE

CAUSAL = ("gpt2", "llama", "neox")
ATOL = 1e-4


def _logits(model, lane: str, family: str, tokens: torch.Tensor, mask: torch.Tensor | None):
    """TL logits; legacy-lane BERT is a HookedEncoder, whose mask argument has another name."""
    with torch.no_grad():
        if mask is None:
            return model(tokens)
        if lane == "legacy" and family == "bert":
            return model(tokens, one_zero_attention_mask=mask)
        return model(tokens, attention_mask=mask)


def _hf_logits(hf, tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        if mask is None:
            return hf(tokens).logits
        # Positions count real tokens only (what HF generate and both TL lanes use), so a
        # left-padded row sees the same positions as the unpadded sequence.
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return hf(tokens, attention_mask=mask, position_ids=position_ids).logits


def _random_tokens(n_batch: int, n_pos: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 500, (n_batch, n_pos), generator=gen)
    tokens[:, 0] = 0  # BOS, as to_tokens would prepend
    return tokens


# ----------------------------------------------------------------------------------------------
# Lane detection
# ----------------------------------------------------------------------------------------------


def test_tl_lane_matches_installed_api(lane):
    has_hooked = importlib.util.find_spec("transformer_lens.HookedTransformer") is not None
    assert lane == tl_lane() == ("legacy" if has_hooked else "bridge")


def test_lane_argument_is_checked(tiny_model_dir, lane):
    with pytest.raises(ValueError, match="lane"):
        load_model(tiny_model_dir("gpt2"), lane="hooked")
    other = "legacy" if lane == "bridge" else "bridge"
    with pytest.raises(ValueError, match="lane="):
        load_model(tiny_model_dir("gpt2"), lane=other)


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------


def test_build_writes_a_complete_directory(tiny_model_dir):
    path = tiny_model_dir("llama")
    for name in ("config.json", "model.safetensors", "tokenizer.json", BUILD_INFO_FILE):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_attention_heads"] == 4 and config["num_key_value_heads"] == 2
    info = json.loads((path / BUILD_INFO_FILE).read_text())
    assert info["family"] == "llama" and info["seed"] == 0 and info["random_weights"]


@pytest.mark.parametrize("family", FAMILIES)
def test_build_family_configs(tiny_model_dir, family):
    config = json.loads((tiny_model_dir(family) / "config.json").read_text())
    dropouts = {k: v for k, v in config.items() if "drop" in k and isinstance(v, float)}
    assert dropouts and all(v == 0.0 for v in dropouts.values()), dropouts
    assert config["vocab_size"] == 512
    if family == "neox":
        assert config["use_parallel_residual"] is True
    if family == "bert":
        assert config["architectures"] == ["BertForMaskedLM"]


def test_seeded_builds_are_deterministic(tmp_path):
    text = "In the beginning God created the heaven and the earth.\n" * 40
    a = build_tiny_hf_model("gpt2", tmp_path / "a", seed=3, tokenizer_text=text, vocab_size=300)
    b = build_tiny_hf_model("gpt2", tmp_path / "b", seed=3, tokenizer_text=text, vocab_size=300)
    c = build_tiny_hf_model("gpt2", tmp_path / "c", seed=4, tokenizer_text=text, vocab_size=300)
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["transformer.wte.weight"], wc["transformer.wte.weight"])
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_seeded_weights_are_version_independent(tmp_path):
    # Golden values: the same under transformers 4.57 and 5.x (the init does not use HF's code).
    path = build_tiny_hf_model(
        "gpt2", tmp_path, tokenizer_text="hello world\n" * 20, vocab_size=300
    )
    bias = load_file(path / "model.safetensors")["transformer.h.0.attn.c_proj.bias"]
    expected = torch.tensor([0.0697756, -0.0327767, 0.1839596, 0.0858125])
    torch.testing.assert_close(bias[:4], expected, atol=1e-6, rtol=0)


def test_build_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_hf_model("neox", tmp_path, tokenizer_text="abc def ghi\n" * 30, vocab_size=300)
    assert torch.equal(torch.rand(3), expected)


def test_build_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="family"):
        build_tiny_hf_model("not-a-family", tmp_path)
    with pytest.raises(ValueError, match="n_heads"):
        build_tiny_hf_model("gpt2", tmp_path, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_kv_heads"):
        build_tiny_hf_model("gpt2", tmp_path, n_kv_heads=2)
    with pytest.raises(ValueError, match="n_kv_heads"):
        build_tiny_hf_model("llama", tmp_path, n_heads=4, n_kv_heads=3)
    with pytest.raises(TypeError, match="n_layers"):
        build_tiny_hf_model("gpt2", tmp_path, n_layers=2.0)
    with pytest.raises(TypeError, match="path"):
        build_tiny_hf_model("gpt2", None)


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------


def test_train_tokenizer_round_trips_and_uses_one_special_token():
    text = "And God said, Let there be light: and there was light.\n" * 30
    tok = train_tokenizer(text, 300)
    assert tok.bos_token == tok.eos_token == tok.pad_token == tok.unk_token == ENDOFTEXT
    assert tok.convert_tokens_to_ids(ENDOFTEXT) == 0
    sample = "Let there be light! Ünïcödé and digits 123"
    ids = tok(sample)["input_ids"]
    assert ids[0] != 0  # the tokenizer itself adds no BOS; TransformerLens prepends it
    assert tok.decode(ids) == sample
    assert len(tok) <= 300


def test_train_tokenizer_rejects_bad_input():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer("some text", 100)
    with pytest.raises(ValueError, match="texts"):
        train_tokenizer("   \n", 300)
    with pytest.raises(TypeError, match="texts"):
        train_tokenizer(b"bytes", 300)


# ----------------------------------------------------------------------------------------------
# Loading: same logits as plain transformers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", LOADABLE)
def test_logits_match_hf(tiny_model, tiny_hf_model, lane, family):
    model, hf = tiny_model(family), tiny_hf_model(family)
    tokens = _random_tokens(2, 12)
    torch.testing.assert_close(
        _logits(model, lane, family, tokens, None), _hf_logits(hf, tokens, None), atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("family", LOADABLE)
def test_logits_match_hf_with_padding(tiny_model, tiny_hf_model, lane, family, side):
    if family == "bert" and side == "left" and lane == "legacy":
        pytest.skip(
            "left-padded BERT: the legacy HookedEncoder keeps absolute positions (like HF's "
            "default), the bridge derives them from the mask; BERT pads right anyway"
        )
    model, hf = tiny_model(family), tiny_hf_model(family)
    n_pos, lengths = 10, [10, 7, 3]
    tokens = _random_tokens(len(lengths), n_pos, seed=1)
    mask = torch.zeros_like(tokens)
    for row, length in enumerate(lengths):
        if side == "right":
            mask[row, :length] = 1
        else:
            mask[row, n_pos - length :] = 1
    tokens = tokens.masked_fill(mask == 0, 0)
    got = _logits(model, lane, family, tokens, mask)
    want = _hf_logits(hf, tokens, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=ATOL, rtol=0)


def test_gpt2_with_custom_d_mlp_matches_hf(tmp_path, lane):
    # TL's own legacy config loader assumes d_mlp = 4 * d_model for GPT-2; ours reads n_inner.
    path = build_tiny_hf_model(
        "gpt2", tmp_path, d_mlp=48, n_layers=1, tokenizer_text="a b c d e\n" * 30, vocab_size=300
    )
    model, hf = load_model(path), load_hf_model(path)
    assert model.cfg.d_mlp == 48
    tokens = _random_tokens(1, 8) % 300
    torch.testing.assert_close(
        _logits(model, lane, "gpt2", tokens, None), _hf_logits(hf, tokens, None), atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("family", CAUSAL)
def test_to_tokens_prepends_bos_like_the_bridge(tiny_model, tiny_model_dir, family):
    from transformers import AutoTokenizer

    model = tiny_model(family)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir(family)))
    text = "And God said, Let there be light"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    got = model.to_tokens(text)[0].tolist()
    # The NeoX bridge adapter turns BOS off (Pythia was trained without it); the legacy lane
    # copies that, so both lanes tokenize alike.
    expected = ids if family == "neox" else [0, *ids]
    assert got == expected
    assert model.cfg.default_prepend_bos is (family != "neox")


def test_model_shapes_follow_the_build(tiny_model):
    cfg = tiny_model("llama").cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_vocab) == (2, 32, 4, 512)
    assert getattr(cfg, "n_key_value_heads", None) == 2


def test_fresh_instance_is_independent(tiny_model):
    a, b = tiny_model("gpt2"), tiny_model("gpt2", fresh=True)
    assert a is tiny_model("gpt2") and a is not b


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


def test_load_model_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "missing")
    with pytest.raises(ValueError, match="does not exist"):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="config.json"):
        load_model(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        load_model(tmp_path / "file.txt")
    with pytest.raises(TypeError, match="name_or_path"):
        load_model(3)
    with pytest.raises(TypeError, match="dtype"):
        load_model(tmp_path, dtype="float32")


def test_unknown_architecture_is_rejected(tmp_path, lane):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["NotARealModel"], "model_type": "not-real"})
    )
    with pytest.raises((ValueError, NotImplementedError)):
        load_model(tmp_path)


# ----------------------------------------------------------------------------------------------
# The default model (seeded stand-in, cached)
# ----------------------------------------------------------------------------------------------


def test_default_model_is_built_once_and_cached(tmp_path, monkeypatch, capfd):
    # The stand-in is the fallback for a missing bundled model (tests/integration/test_default_model.py
    # covers the bundled one).
    import tl_directional.model.load.default as models_mod

    monkeypatch.setattr(models_mod, "bundled_model_dir", lambda: None)
    monkeypatch.setenv("TL_DIRECTIONAL_CACHE", str(tmp_path))
    with pytest.warns(models_mod.BundledModelMissingWarning, match="RANDOM-WEIGHT"):
        path = default_model_dir()
    assert path.parent == tmp_path / "seeded-default"
    stamp = os.stat(path / "model.safetensors").st_mtime_ns
    with pytest.warns(models_mod.BundledModelMissingWarning):
        model = load_default_model()
        assert default_model_dir() == path
    assert os.stat(path / "model.safetensors").st_mtime_ns == stamp
    spec = DEFAULT_MODEL_SPEC
    cfg = model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_ctx, cfg.d_vocab) == (
        spec["n_layers"],
        spec["d_model"],
        spec["n_heads"],
        spec["n_ctx"],
        spec["vocab_size"],
    )
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []
    logits = model(model.to_tokens("In the beginning"))
    assert logits.shape[-1] == spec["vocab_size"] and torch.isfinite(logits).all()
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
