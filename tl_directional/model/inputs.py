"""Turning user inputs into token batches.

One place for: tokenising strings with an attention mask (padding is never guessed from
token ids: GPT-2 style tokenizers pad with the BOS id), padding token-id lists, checking
token ids against the vocabulary, and batching. Which positions a statistic or an edit
covers is :mod:`tl_directional.model.positions`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from ..io.corpus import heldout_text
from .handle import is_encoder


@dataclass
class TokenBatch:
    """Tokens and their attention mask (1 = real token, 0 = padding)."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def slice(self, start: int, stop: int) -> TokenBatch:
        return TokenBatch(self.tokens[start:stop], self.attention_mask[start:stop])

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device) -> TokenBatch:
        return TokenBatch(self.tokens.to(device), self.attention_mask.to(device))


def _pad_side(model) -> str:
    tok = getattr(model, "tokenizer", None)
    side = getattr(tok, "padding_side", None) or getattr(model.cfg, "default_padding_side", None)
    return side if side in ("left", "right") else "right"


def _pad_id(model) -> int:
    tok = getattr(model, "tokenizer", None)
    for attr in ("pad_token_id", "eos_token_id", "bos_token_id"):
        v = getattr(tok, attr, None)
        if v is not None:
            return int(v)
    return 0


def pad_sequences(
    seqs: Sequence[Sequence[int]], *, pad_id: int, padding_side: str = "right"
) -> TokenBatch:
    """Pad lists of token ids into a :class:`TokenBatch`."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    length = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        n = len(s)
        if padding_side == "right":
            tokens[i, :n] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, :n] = 1
        else:
            tokens[i, length - n:] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, length - n:] = 1
    return TokenBatch(tokens, mask)


def tokenize(
    model,
    texts: Sequence[str],
    *,
    prepend_bos: bool | None = None,
    padding_side: str | None = None,
    max_length: int | None = None,
    too_long: str | None = None,
) -> TokenBatch:
    """Tokenise ``texts`` with the model's tokenizer, keeping a real attention mask.

    BOS is prepended when the model's ``cfg.default_prepend_bos`` says so (as
    ``model.to_tokens`` would); encoders get the tokenizer's own special tokens.
    Sequences longer than ``max_length`` (default: the model's ``n_ctx``) are cut, with a
    warning; with ``too_long`` (the caller's reason and fix) they are a ValueError instead,
    for callers whose result would be wrong, not just partial, on a cut text.
    """
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(
            "inputs are strings but the model has no tokenizer; pass token ids "
            "(a [batch, pos] LongTensor) instead, or load the model with its tokenizer"
        )
    causal = not is_encoder(model)
    if prepend_bos is None:
        prepend_bos = bool(getattr(model.cfg, "default_prepend_bos", True)) and causal
    max_length = max_length or int(getattr(model.cfg, "n_ctx", 0) or 0) or None
    seqs = []
    for text in texts:
        if causal:
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            if prepend_bos and tok.bos_token_id is not None:
                ids = [int(tok.bos_token_id)] + ids
        else:
            ids = list(tok(text)["input_ids"])
        if max_length is not None and len(ids) > max_length and too_long is not None:
            raise ValueError(f"inputs[{len(seqs)}] has {len(ids)} tokens, more than the model's context of "
                             f"{max_length}: {too_long}")
        if max_length is not None and len(ids) > max_length:
            warnings.warn(
                f"inputs[{len(seqs)}] has {len(ids)} tokens, more than the model's context of "
                f"{max_length}; only the first {max_length} are used. Split long text into windows "
                "(e.g. tl_directional.model.inputs.load_text_sequences) to measure all of it.",
                UserWarning, stacklevel=3,
            )
            ids = ids[:max_length]
        seqs.append(ids)
    return pad_sequences(seqs, pad_id=_pad_id(model), padding_side=padding_side or _pad_side(model))


def load_text_sequences(model, text_file: str | None = None, *, max_sequences: int, seq_len: int,
                        text_argument: str = "text_file", seq_len_argument: str = "seq_len") -> TokenBatch:
    """Full windows of ``seq_len`` tokens cut from one UTF-8 text file (default: the bundled
    held-out KJV slice), at most ``max_sequences`` of them, as a right-padded :class:`TokenBatch`.

    The text is tokenised as one stream and cut into consecutive windows of ``seq_len - 1``
    tokens, each led by the tokenizer's BOS token where it has one (so no window needs
    padding, except a shorter last one). ``text_argument`` / ``seq_len_argument`` are the names
    errors give the two arguments (the CLI passes ``--text`` / ``--seq-len``).

    Raises:
        ValueError: ``seq_len`` above the model's context ``n_ctx``; a missing, non-UTF-8 or
            empty text file.
    """
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    if n_ctx and seq_len > n_ctx:
        raise ValueError(f"{seq_len_argument} {seq_len} is above the model's context n_ctx={n_ctx}; "
                         f"pass {seq_len_argument} {n_ctx} or less")
    if text_file is None:
        text = heldout_text()
    else:
        path = Path(text_file)
        if path.is_dir():
            raise ValueError(f"{text_argument} {text_file} is a directory, not a text file; pass one UTF-8 "
                             f"text file (join a folder's files first, e.g. cat {text_file}/*.txt > all.txt)")
        if not path.is_file():
            raise ValueError(f"{text_argument} {text_file}: no such file; pass an existing UTF-8 text file, "
                             f"or leave {text_argument} out for the bundled held-out text")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{text_argument} {text_file} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                f"{exc.start}); convert it first, e.g. iconv -f latin1 -t utf-8"
            ) from None
    if not text.strip():
        raise ValueError(f"{text_argument} {text_file or '(bundled held-out text)'} is empty")
    # One long token stream cut into windows: every window is full, so no padding is needed.
    stream = tokenize(model, [text], prepend_bos=False, max_length=10**9).tokens[0]
    bos = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    body = seq_len - 1 if bos is not None else seq_len
    if body < 2:  # a window needs two text tokens: one predicted from the other
        least = 3 if bos is not None else 2
        raise ValueError(f"{seq_len_argument} {seq_len} leaves {max(body, 0)} text token(s) a window"
                         f"{' after BOS' if bos is not None else ''}; pass {seq_len_argument} {least} or more")
    seqs = []
    for start in range(0, stream.numel() - 1, body):
        chunk = stream[start:start + body].tolist()
        if len(chunk) < 2:
            break
        seqs.append(([int(bos)] if bos is not None else []) + chunk)
        if len(seqs) >= max_sequences:
            break
    if not seqs:
        raise ValueError(f"{text_argument} {text_file or '(bundled held-out text)'} has {stream.numel()} token(s), "
                         "too few for one window of two; pass a longer text")
    return pad_sequences(seqs, pad_id=0, padding_side="right")


def prepare_inputs(
    model,
    inputs,
    attention_mask: Tensor | None = None,
    *,
    min_tokens: int = 1,
    argument: str = "inputs",
    too_long: str | None = None,
) -> TokenBatch:
    """Normalise ``inputs`` (a string, a list of strings, a list of token-id lists,
    or a ``[batch, pos]`` / ``[pos]`` integer tensor) into a :class:`TokenBatch`.

    Raises ValueError for empty input, all-padding rows, rows shorter than
    ``min_tokens`` real tokens, or an ``attention_mask`` of the wrong shape. Texts longer than
    the context are cut with a warning, or (with ``too_long``, see :func:`tokenize`) refused.
    """
    texts = [inputs] if isinstance(inputs, str) else (
        list(inputs) if isinstance(inputs, Sequence) and inputs and all(isinstance(x, str) for x in inputs) else [])
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ValueError(
            f"{argument} has an empty string at index {empty[:8]}; it would measure BOS alone. "
            "Drop it or pass text"
        )
    batch = _as_token_batch(model, inputs, argument, too_long=too_long,
                            mask_given=attention_mask is not None)
    if attention_mask is not None:
        batch = _with_attention_mask(inputs, batch, attention_mask)
    _check_rows(model, batch, argument, min_tokens)
    return batch


def _as_token_batch(model, inputs, argument: str, *, too_long: str | None, mask_given: bool) -> TokenBatch:
    """``inputs`` of any accepted form as a :class:`TokenBatch` (an all-ones mask for token ids;
    a warning when unmasked token ids look padded)."""
    if isinstance(inputs, TokenBatch):
        batch = inputs
    elif isinstance(inputs, str):
        batch = tokenize(model, [inputs], too_long=too_long)
    elif isinstance(inputs, Tensor):
        if inputs.is_floating_point() or inputs.dtype == torch.bool:
            raise TypeError(f"{argument} must hold integer token ids, got dtype {inputs.dtype}")
        tokens = inputs.unsqueeze(0) if inputs.ndim == 1 else inputs
        if tokens.ndim != 2:
            raise ValueError(f"{argument} must be [batch, pos] token ids, got shape {tuple(inputs.shape)}")
        batch = TokenBatch(tokens.long(), torch.ones_like(tokens, dtype=torch.long))
        if not mask_given:
            _warn_if_padded(model, batch.tokens, argument)
    elif isinstance(inputs, Sequence) and len(inputs) > 0 and all(isinstance(x, str) for x in inputs):
        batch = tokenize(model, list(inputs), too_long=too_long)
    elif isinstance(inputs, Sequence) and len(inputs) > 0 and all(
        isinstance(x, (list, tuple)) for x in inputs
    ):
        if any(len(x) == 0 for x in inputs):
            raise ValueError(f"{argument} has an empty token list; every sequence needs tokens")
        batch = pad_sequences(inputs, pad_id=_pad_id(model), padding_side=_pad_side(model))
    elif isinstance(inputs, Sequence) and len(inputs) == 0:
        raise ValueError(f"{argument} is empty: pass at least one string or token sequence")
    else:
        # a list that is mostly strings: name the first item that is not, so a None in a
        # thousand-text corpus is found at once
        if isinstance(inputs, Sequence) and any(isinstance(x, str) for x in inputs):
            i, bad = next((i, x) for i, x in enumerate(inputs) if not isinstance(x, str))
            raise TypeError(f"{argument}[{i}] is {type(bad).__name__} ({bad!r:.40}), not a string; "
                            f"every item of a list of texts must be a str")
        raise TypeError(
            f"{argument} must be a string, a list of strings, a list of token-id lists or a "
            f"[batch, pos] LongTensor, got {type(inputs).__name__}"
        )
    return batch


def check_attention_mask_values(attention_mask, argument: str = "attention_mask") -> None:
    """Refuse a padding mask that is not bool or integer 0 / 1: ``.long()`` would turn 0.5 into
    0 and keep 2 or -1, each giving another, silently wrong, result."""
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor of 0 (padding) and 1 (token), got "
                        f"{type(attention_mask).__name__}")
    if attention_mask.dtype == torch.bool:
        return
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise ValueError(f"{argument} has dtype {attention_mask.dtype}; it must be bool or integer "
                         f"0 (padding) / 1 (token): pass {argument}.long() of a 0/1 mask")
    bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)]
    if bad.numel():
        values = sorted({int(v) for v in bad.flatten()[:1000].tolist()})[:4]
        raise ValueError(f"{argument} holds {values}; its entries must be 0 (padding) or 1 (token)")


def _with_attention_mask(inputs, batch: TokenBatch, attention_mask: Tensor) -> TokenBatch:
    """``batch`` with the caller's ``attention_mask`` (token-id inputs only; shapes must match)."""
    if isinstance(inputs, (str, list, tuple)) and not isinstance(inputs, Tensor):
        if all(isinstance(x, str) for x in ([inputs] if isinstance(inputs, str) else inputs)):
            raise ValueError(
                "attention_mask is only accepted with token-id inputs; for strings the mask "
                "comes from the tokenizer"
            )
    check_attention_mask_values(attention_mask)
    attention_mask = attention_mask.unsqueeze(0) if attention_mask.ndim == 1 else attention_mask
    if tuple(attention_mask.shape) != tuple(batch.tokens.shape):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but the tokens have "
            f"shape {tuple(batch.tokens.shape)}; they must match"
        )
    batch = TokenBatch(batch.tokens, attention_mask.long().to(batch.tokens.device))
    return batch


def _check_rows(model, batch: TokenBatch, argument: str, min_tokens: int) -> None:
    """Refuse an empty batch, token ids outside the vocabulary, rows with fewer than
    ``min_tokens`` real tokens and sequences longer than the model's context."""
    if batch.tokens.numel() == 0:
        raise ValueError(f"{argument} is empty: no tokens")
    check_token_range(model, batch.tokens[batch.attention_mask.bool()], argument)
    per_row = batch.attention_mask.sum(-1)
    bad = (per_row < max(min_tokens, 1)).nonzero().flatten().tolist()
    if bad:
        what = "only padding" if int(per_row[bad[0]]) == 0 else f"fewer than {min_tokens} tokens"
        raise ValueError(
            f"{argument} row(s) {bad[:8]} have {what}; drop them or fix the attention_mask"
        )
    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
    if isinstance(n_ctx, int) and batch.tokens.shape[1] > n_ctx:
        raise ValueError(
            f"{argument} has sequences of {batch.tokens.shape[1]} positions but the model's context "
            f"window is n_ctx={n_ctx}; pass at most {n_ctx} tokens a sequence (on the command line: "
            f"--seq-len {n_ctx} or less)"
        )


def _vocab_size(model) -> int | None:
    n = getattr(getattr(model, "cfg", None), "d_vocab", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def check_token_range(model, ids: Tensor, argument: str) -> None:
    """Raise a ValueError naming the first token id outside ``0 .. d_vocab - 1``."""
    n = _vocab_size(model)
    if n is None or ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= n)
    if bool(bad.any()):
        first = int(ids[bad].flatten()[0])
        raise ValueError(
            f"{argument} has token id {first}, outside the vocabulary (valid: 0..{n - 1}, d_vocab={n}); "
            "were the ids made with another model's tokenizer?"
        )


def token_ids(model, values, *, n: int, argument: str) -> Tensor:
    """``n`` token ids from ints, a tensor, or strings (each must be exactly one token of
    the model's tokenizer, e.g. ``" light"``); a single value is used for every row."""
    if isinstance(values, (str, int)) and not isinstance(values, bool):
        values = [values] * n
    if isinstance(values, Tensor):
        if values.is_floating_point() or values.dtype == torch.bool:
            raise TypeError(f"{argument} must hold integer token ids, got dtype {values.dtype}")
        ids = values.reshape(-1).long().cpu()
    else:
        try:
            values = list(values)
        except TypeError:
            raise TypeError(
                f"{argument} must be token ids or single-token strings, got {type(values).__name__}"
            ) from None
        out = []
        for i, v in enumerate(values):
            if isinstance(v, str):
                tok = getattr(model, "tokenizer", None)
                if tok is None:
                    raise ValueError(f"{argument}[{i}] is a string but the model has no tokenizer; pass token ids")
                enc = list(tok(v, add_special_tokens=False)["input_ids"])
                if len(enc) != 1:
                    raise ValueError(
                        f"{argument}[{i}] = {v!r} is {len(enc)} tokens {enc}, not one; pass a single-token "
                        "string (mind the leading space, e.g. ' light') or a token id"
                    )
                out.append(int(enc[0]))
            elif isinstance(v, int) and not isinstance(v, bool) or (isinstance(v, Tensor) and v.numel() == 1):
                out.append(int(v))
            else:
                raise TypeError(f"{argument}[{i}] = {v!r} is neither a token id nor a string")
        ids = torch.tensor(out, dtype=torch.long)
    if ids.numel() != n:
        raise ValueError(f"{argument} has {ids.numel()} entries for {n} sequences; pass one per sequence")
    check_token_range(model, ids, argument)
    return ids


def _edge_runs(tokens: Tensor, pad_id: int, *, left: bool) -> Tensor:
    """Per row, the length of the run of ``pad_id`` at the left (or right) edge."""
    is_pad = (tokens == pad_id).long()
    return (is_pad if left else is_pad.flip(-1)).cumprod(-1).sum(-1)


def _warn_if_padded(model, tokens: Tensor, argument: str) -> None:
    """Warn when a token batch without a mask looks padded (as ``model.to_tokens([s1, s2])``
    pads): rows end (or start) with runs of the pad id of different lengths. Those
    positions would be measured as real tokens."""
    tok = getattr(model, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    if pad is None or tokens.shape[0] < 2:
        return
    bos = getattr(tok, "bos_token_id", None)
    right = _edge_runs(tokens, int(pad), left=False)
    left = _edge_runs(tokens, int(pad), left=True)
    if pad == bos:  # a leading BOS shares the pad id: one leading pad id is expected
        left = (left - 1).clamp(min=0)
    for side, runs in (("end", right), ("start", left)):
        if int(runs.max()) > 0 and int(runs.min()) != int(runs.max()):
            rows = (runs > 0).nonzero().flatten().tolist()[:8]
            warnings.warn(
                f"{argument} looks padded: row(s) {rows} {side} with up to {int(runs.max())} pad tokens "
                f"(id {pad}), and without an attention_mask they are measured as real tokens. Pass "
                "attention_mask=... (e.g. from tl_directional.prepare_inputs(model, texts)) or the "
                "strings themselves.",
                UserWarning, stacklevel=3,
            )
            return


def iter_batches(batch: TokenBatch, batch_size: int) -> Iterator[TokenBatch]:
    """Consecutive slices of at most ``batch_size`` sequences, trimmed of all-padding columns."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    for start in range(0, len(batch), batch_size):
        part = batch.slice(start, start + batch_size)
        cols = part.attention_mask.any(0).nonzero().flatten()
        lo, hi = int(cols.min()), int(cols.max()) + 1
        yield TokenBatch(part.tokens[:, lo:hi], part.attention_mask[:, lo:hi])
