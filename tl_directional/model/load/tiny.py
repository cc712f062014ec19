"""Seeded tiny Hugging Face models of every registered family (:func:`build_tiny_hf_model`).

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

from tl_directional.io.corpus import heldout_text

from ..families import REGISTRY, get_family
from ..families.hf import FAMILIES, FAMILY_TO_ARCH, transformers_major
from ..lanes import quiet_transformers
from .tokenizer import ENDOFTEXT, train_tokenizer

# Written next to config.json so a directory records how it was made.
BUILD_INFO_FILE = "tl_directional_build.json"

def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r}).")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}.")
    return value


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
    """The ``transformers`` config of a ``family`` model, dropout 0 everywhere (the family's
    ``config_class`` / ``config_names`` / ``config_fixed`` / ``config_extra``)."""
    import transformers

    fam = get_family(family)
    shape = {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "n_kv_heads": n_kv_heads,
             "d_mlp": d_mlp, "n_ctx": n_ctx, "vocab_size": vocab_size, "d_head": d_model // n_heads}
    kwargs = {hf_name: shape[ours] for hf_name, ours in fam.config_names.items()}
    kwargs.update(fam.config_fixed)
    if fam.config_extra is not None:
        kwargs.update(fam.config_extra({**shape, "transformers_major": transformers_major()}))
    ids = {"bos_token_id": special_id, "eos_token_id": special_id, "pad_token_id": special_id}
    config = getattr(transformers, fam.config_class)(**kwargs, **ids)
    config.architectures = [fam.hf_class]
    return config


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


def _checked_shape(family: str, path, seed: int, *, n_layers: int, d_model: int, n_heads: int,
                   n_kv_heads: int | None, d_mlp: int | None, n_ctx: int,
                   vocab_size: int) -> tuple[int, int]:
    """Check :func:`build_tiny_hf_model`'s arguments against ``family``; returns ``(d_mlp,
    n_kv_heads)`` with the defaults filled in (``4 * d_model``; the family's KV heads)."""
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
    fam = REGISTRY[family]
    if fam.fixed_d_mlp is not None and d_mlp != fam.fixed_d_mlp(d_model):
        raise ValueError(f"family={family!r} fixes d_mlp at {fam.fixed_d_mlp(d_model)} for d_model={d_model}; "
                         f"got d_mlp={d_mlp}.")
    if n_kv_heads is None:
        # The family's default: GQA with two query heads per KV head (llama, qwen, mistral, ...),
        # one KV head (gemma, gemma3, as Gemma-2B / Gemma-3-270M) or one per query head.
        n_kv_heads = fam.default_kv_heads(n_heads)
    else:
        _check_positive_int("n_kv_heads", n_kv_heads)
        if not fam.gqa_allowed and n_kv_heads != n_heads:
            gqa = tuple(n for n, f in REGISTRY.items() if f.gqa_allowed)
            raise ValueError(
                f"n_kv_heads={n_kv_heads} is only supported for the families {gqa}; leave it None "
                f"for {family!r} (which uses n_heads key/value heads)."
            )
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads}).")
    return d_mlp, n_kv_heads


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

    Every other family of :data:`tl_directional.model.families.REGISTRY` (qwen2, qwen3,
    qwen3_moe, mistral, mixtral, gemma, gemma2, olmo2, phi3, phi, gptj, gpt_neo, opt, bloom,
    apertus, gpt_oss) builds the same way from its file in ``tl_directional/model/families/``;
    ``docs/models.md`` lists them with their layouts and lanes.

    Weights are a deterministic function of ``seed`` and the shape arguments (see
    :func:`_seeded_init_`); the global torch RNG is left untouched.

    Args:
        family: A registered family name (:data:`FAMILIES`), e.g. ``"gpt2"`` or ``"qwen3"``.
        path: Output directory; created if missing. Existing model files in it are overwritten.
        seed: Weight seed.
        n_layers: Number of transformer blocks.
        d_model: Residual stream width; must be divisible by ``n_heads``.
        n_heads: Number of (query) heads.
        n_kv_heads: Key/value heads (families with GQA, e.g. ``"llama"``; must divide ``n_heads``).
        d_mlp: MLP hidden width; default ``4 * d_model``.
        n_ctx: Context length (position table size / ``max_position_embeddings``).
        vocab_size: Vocabulary size of both the tokenizer and the embedding matrix.
        tokenizer_text: Text to train the tokenizer on; default :func:`corpus.heldout_text`.

    Returns:
        ``path`` as a ``pathlib.Path``.
    """
    d_mlp, n_kv_heads = _checked_shape(family, path, seed, n_layers=n_layers, d_model=d_model,
                                       n_heads=n_heads, n_kv_heads=n_kv_heads, d_mlp=d_mlp,
                                       n_ctx=n_ctx, vocab_size=vocab_size)
    fam = REGISTRY[family]
    if tokenizer_text is None:
        tokenizer_text = heldout_text()
    specials = list(fam.tokenizer_specials)
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
