"""The byte-level BPE tokenizer of the tiny models (:func:`train_tokenizer`).

Its only special token, ``<|endoftext|>``, doubles as BOS / EOS / PAD / UNK, the way GPT-2's does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import PreTrainedTokenizerFast

#: The one special token of :func:`train_tokenizer` tokenizers (BOS, EOS, PAD and UNK at once).
ENDOFTEXT = "<|endoftext|>"

#: The extra special token that ``"bert"`` family tokenizers carry for masked-LM inputs.
BERT_MASK_TOKEN = "<|mask|>"

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


__all__ = ["BERT_MASK_TOKEN", "ENDOFTEXT", "train_tokenizer"]
