"""Seeded tiny Hugging Face models of five families (:func:`build_tiny_hf_model`).

Random weights that are a deterministic function of the seed and the shape, written with
``save_pretrained``; no network is touched, so tests and demos run offline.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..adapter import quiet_transformers
from .hf import FAMILIES, FAMILY_TO_ARCH, transformers_major
from .tokenizer import BERT_MASK_TOKEN, ENDOFTEXT, train_tokenizer

# Written next to config.json so a directory records how it was made.
BUILD_INFO_FILE = "tl_directional_build.json"

def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r}).")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}.")
    return value


#: The usual HF names of the shape arguments (Llama, GPT-NeoX, BERT, Gemma-3 configs).
_HF_SHAPE = {"vocab_size": "vocab_size", "hidden_size": "d_model", "intermediate_size": "d_mlp",
             "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads", "max_position_embeddings": "n_ctx"}

#: family -> (``transformers`` config class, {HF argument: shape argument}, fixed settings).
#: Dropout is 0 everywhere.
_CONFIGS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "gpt2": ("GPT2Config",
             {"vocab_size": "vocab_size", "n_positions": "n_ctx", "n_embd": "d_model", "n_layer": "n_layers",
              "n_head": "n_heads", "n_inner": "d_mlp"},
             dict(activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                  summary_first_dropout=0.0, layer_norm_epsilon=1e-5, scale_attn_by_inverse_layer_idx=False,
                  reorder_and_upcast_attn=False, tie_word_embeddings=True)),
    "llama": ("LlamaConfig",
              {**_HF_SHAPE, "num_key_value_heads": "n_kv_heads", "head_dim": "d_head"},
              dict(rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", attention_bias=False, mlp_bias=False,
                   attention_dropout=0.0, tie_word_embeddings=False)),
    # Pythia-style partial rotary: a quarter of each head's dims rotate.
    "neox": ("GPTNeoXConfig", _HF_SHAPE,
             dict(rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True, hidden_act="gelu",
                  layer_norm_eps=1e-5, hidden_dropout=0.0, attention_dropout=0.0, classifier_dropout=0.0,
                  tie_word_embeddings=False)),
    "bert": ("BertConfig", _HF_SHAPE,
             dict(hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  classifier_dropout=0.0, layer_norm_eps=1e-12, type_vocab_size=2, tie_word_embeddings=True)),
    # Gemma-3 text decoder in miniature: sandwich norms (a norm after attention and after the
    # MLP, before each residual add), q/k norms, alternating sliding-window / full attention
    # (window 6, so short test sequences exercise both), tied embeddings.
    "gemma3": ("Gemma3TextConfig",
               {**_HF_SHAPE, "num_key_value_heads": "n_kv_heads", "head_dim": "d_head",
                "query_pre_attn_scalar": "d_head"},
               dict(rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", sliding_window=6,
                    attn_logit_softcapping=None, final_logit_softcapping=None, attention_bias=False,
                    attention_dropout=0.0, tie_word_embeddings=True)),
}


def _gemma3_extra(n_layers: int) -> dict[str, Any]:
    """Gemma-3's layer types (every second layer full attention) and rotary bases, under
    transformers 5's ``rope_parameters`` or 4's two attributes."""
    extra: dict[str, Any] = {
        "layer_types": ["full_attention" if (i + 1) % 2 == 0 else "sliding_attention" for i in range(n_layers)],
    }
    if transformers_major() >= 5:
        extra["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }
    else:
        extra.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)
    return extra


def hf_config(
    family: str,
    *,
    n_layers: int,
    d_model: int,
    n_heads: int,
    n_kv_heads: int,
    d_mlp: int,
    n_ctx: int,
    vocab_size: int,
    special_id: int,
) -> Any:
    """The ``transformers`` config of a ``family`` model, dropout 0 everywhere."""
    import transformers

    if family not in _CONFIGS:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}.")
    shape = {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "n_kv_heads": n_kv_heads,
             "d_mlp": d_mlp, "n_ctx": n_ctx, "vocab_size": vocab_size, "d_head": d_model // n_heads}
    class_name, names, fixed = _CONFIGS[family]
    kwargs = {hf_name: shape[ours] for hf_name, ours in names.items()}
    kwargs.update(fixed)
    if family == "gemma3":
        kwargs.update(_gemma3_extra(n_layers))
    ids = {"bos_token_id": special_id, "eos_token_id": special_id, "pad_token_id": special_id}
    return getattr(transformers, class_name)(**kwargs, **ids)


def _hf_model_class(family: str) -> Any:
    import transformers

    return getattr(transformers, FAMILY_TO_ARCH[family])


def _seeded_init_(model: torch.nn.Module, seed: int, d_model: int) -> None:
    """Overwrite every parameter of ``model`` with seeded random values, in place.

    Each parameter draws from its own generator, seeded from ``seed`` and the parameter's name,
    so the weights depend on neither ``transformers``' init code nor parameter order: the same
    seed gives the same weights under transformers 4.x and 5.x.

    * matrices and embeddings: N(0, 1/d_model), which keeps attention scores and logits O(1)
      (the usual 0.02 makes a tiny model's attention almost uniform and hides bugs);
    * 1-D weights (LayerNorm / RMSNorm gains): 1 + N(0, 0.1^2);
    * biases: N(0, 0.1^2), non-zero on purpose so bias-handling mistakes show up in tests.
    """
    std = d_model**-0.5
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            gen = torch.Generator().manual_seed(
                (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63
            )
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith("bias"):
                value = 0.1 * noise
            elif param.ndim == 1:
                value = 1.0 + 0.1 * noise
            else:
                value = std * noise
            param.copy_(value.to(param.dtype))


def build_tiny_hf_model(
    family: str,
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layers: int = 2,
    d_model: int = 32,
    n_heads: int = 4,
    n_kv_heads: int | None = None,
    d_mlp: int | None = None,
    n_ctx: int = 128,
    vocab_size: int = 512,
    tokenizer_text: str | Iterable[str] | None = None,
) -> Path:
    """Build a seeded, randomly initialised Hugging Face model and save it to ``path``.

    The directory gets ``config.json``, ``model.safetensors``, the tokenizer files (a
    :func:`train_tokenizer` tokenizer with ``vocab_size`` tokens) and a small build record
    (``tl_directional_build.json``). Load it with :func:`load_model` or with
    ``transformers.AutoModel*.from_pretrained(path)``.

    Families (all with dropout 0, all float32):

    * ``"gpt2"``: ``GPT2LMHeadModel``, learned positions, tied embed/unembed, ``gelu_new``.
    * ``"llama"``: ``LlamaForCausalLM``, RMSNorm, rotary, gated SiLU MLP, grouped-query
      attention (``n_kv_heads`` defaults to ``n_heads // 2``, i.e. 2 KV heads for 4 heads).
    * ``"neox"``: ``GPTNeoXForCausalLM`` with ``use_parallel_residual=True`` and partial rotary
      (``rotary_pct=0.25``), untied unembed.
    * ``"bert"``: ``BertForMaskedLM`` (post-LN encoder, MLM head); its tokenizer additionally has
      the mask token ``<|mask|>`` (id 1).
    * ``"gemma3"``: ``Gemma3ForCausalLM`` (text), sandwich norms, q/k RMSNorm, one KV head
      (``n_kv_heads`` defaults to 1), sliding-window (6 tokens) and full attention alternating,
      tied embed/unembed.

    Weights are a deterministic function of ``seed`` and the shape arguments (see
    :func:`_seeded_init_`); the global torch RNG is left untouched.

    Args:
        family: ``"gpt2"``, ``"llama"``, ``"neox"``, ``"bert"`` or ``"gemma3"``.
        path: Output directory; created if missing. Existing model files in it are overwritten.
        seed: Weight seed.
        n_layers: Number of transformer blocks.
        d_model: Residual stream width; must be divisible by ``n_heads``.
        n_heads: Number of (query) heads.
        n_kv_heads: Key/value heads (``"llama"`` only; must divide ``n_heads``).
        d_mlp: MLP hidden width; default ``4 * d_model``.
        n_ctx: Context length (position table size / ``max_position_embeddings``).
        vocab_size: Vocabulary size of both the tokenizer and the embedding matrix.
        tokenizer_text: Text to train the tokenizer on; default :func:`corpus.heldout_text`.

    Returns:
        ``path`` as a ``pathlib.Path``.
    """
    if not isinstance(family, str) or family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}.")
    if path is None or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike directory, got {path!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}.")
    for name, value in [
        ("n_layers", n_layers),
        ("d_model", d_model),
        ("n_heads", n_heads),
        ("n_ctx", n_ctx),
        ("vocab_size", vocab_size),
    ]:
        _check_positive_int(name, value)
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}).")
    d_mlp = 4 * d_model if d_mlp is None else _check_positive_int("d_mlp", d_mlp)
    if n_kv_heads is None:
        # Grouped-query attention by default for llama: two query heads share each KV head;
        # gemma3 uses one KV head for all query heads, as Gemma-3-270M does.
        if family == "gemma3":
            n_kv_heads = 1
        else:
            n_kv_heads = n_heads // 2 if family == "llama" and n_heads % 2 == 0 else n_heads
    else:
        _check_positive_int("n_kv_heads", n_kv_heads)
        if family not in ("llama", "gemma3") and n_kv_heads != n_heads:
            raise ValueError(
                f"n_kv_heads={n_kv_heads} is only supported for family='llama' / 'gemma3'; leave it None "
                f"for {family!r} (which uses n_heads key/value heads)."
            )
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads}).")

    if tokenizer_text is None:
        from tl_directional.corpus import heldout_text

        tokenizer_text = heldout_text()
    specials = [BERT_MASK_TOKEN] if family == "bert" else []
    tokenizer = train_tokenizer(
        tokenizer_text, vocab_size, special_tokens=specials, model_max_length=n_ctx
    )
    special_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)

    config = hf_config(
        family,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_mlp=d_mlp,
        n_ctx=n_ctx,
        vocab_size=vocab_size,
        special_id=special_id,
    )
    # fork_rng: the constructor runs transformers' own random init, which we overwrite anyway;
    # forking keeps the caller's global RNG stream unchanged.
    with torch.random.fork_rng(devices=[]):
        model = _hf_model_class(family)(config)
    _seeded_init_(model, seed, d_model)
    model.eval()

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    info = {
        "family": family,
        "architecture": FAMILY_TO_ARCH[family],
        "seed": seed,
        "n_layers": n_layers,
        "d_model": d_model,
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "d_mlp": d_mlp,
        "n_ctx": n_ctx,
        "vocab_size": vocab_size,
        "random_weights": True,
    }
    (out / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out


__all__ = ["BUILD_INFO_FILE", "build_tiny_hf_model", "hf_config"]
