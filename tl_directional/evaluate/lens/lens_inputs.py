"""The split logit lens's input checks (:func:`tl_directional.evaluate.lens.lens.split_logit_lens`):
tokens, padding mask, targets and ordering, each refused with :class:`LensInputError` naming the
argument, its valid range and the fix."""

from __future__ import annotations

import torch
from torch import Tensor

from ...core.errors import TLDirectionalError
from ...model.inputs import check_attention_mask_values

ORDERINGS = ("shapley", "parallel_first", "perpendicular_first")


class LensInputError(TLDirectionalError, ValueError):
    """A bad argument to :func:`split_logit_lens` (tokens, target tokens, ordering, model state)."""


def _check_ordering(ordering) -> str:
    if ordering not in ORDERINGS:
        raise LensInputError(
            f"ordering must be one of {ORDERINGS}, got {ordering!r}; "
            "'shapley' averages the two path orderings"
        )
    return ordering


def _check_tokens(model, tokens) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise LensInputError(
            f"tokens must be an integer tensor [batch, pos] of token ids, got "
            f"{type(tokens).__name__}{'' if not isinstance(tokens, Tensor) else ' of dtype ' + str(tokens.dtype)}; "
            "tokenize first, e.g. tokens = model.to_tokens(prompts)"
        )
    if tokens.ndim == 1:
        tokens = tokens.unsqueeze(0)
    if tokens.ndim != 2 or tokens.shape[1] == 0 or tokens.shape[0] == 0:
        raise LensInputError(
            f"tokens must be shaped [batch, pos] with pos >= 1, got shape {tuple(tokens.shape)}; "
            "pass a 2-D tensor (a 1-D tensor is read as one sequence)"
        )
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if isinstance(n_ctx, int) and tokens.shape[1] > n_ctx:
        raise LensInputError(
            f"tokens has {tokens.shape[1]} positions but the model's context window is n_ctx={n_ctx}; "
            f"pass at most {n_ctx} tokens a sequence (e.g. tokens[:, -{n_ctx}:])"
        )
    d_vocab = int(model.cfg.d_vocab)
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= d_vocab:
        raise LensInputError(
            f"tokens must be ids in [0, {d_vocab}), got values in [{lo}, {hi}]; "
            "tokenize with this model's tokenizer"
        )
    return tokens.long()


def _check_mask(attention_mask, shape) -> Tensor | None:
    """``attention_mask`` as a bool ``[batch, pos]`` tensor (None stays None): 0/1 entries, the
    tokens' shape, and at least one token in every row."""
    if attention_mask is None:
        return None
    try:
        check_attention_mask_values(attention_mask)
    except (TypeError, ValueError) as exc:
        raise LensInputError(str(exc)) from None
    mask = attention_mask.unsqueeze(0) if attention_mask.ndim == 1 else attention_mask
    if tuple(mask.shape) != tuple(shape):
        raise LensInputError(f"attention_mask has shape {tuple(mask.shape)} but tokens have shape "
                             f"{tuple(shape)}; pass one 0/1 entry per token")
    mask = mask.bool().cpu()
    empty = (~mask.any(-1)).nonzero().flatten().tolist()
    if empty:
        raise LensInputError(f"attention_mask rows {empty[:8]} are all padding; drop those rows")
    return mask


def _one_token(model, text: str, where: str) -> int:
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise LensInputError(
            f"{where} = {text!r} is a string but the model has no tokenizer; pass token ids"
        )
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    if len(ids) != 1:
        raise LensInputError(
            f"{where} = {text!r} is {len(ids)} tokens {ids}, not one; pass a single-token "
            "string (often with a leading space, e.g. ' Paris') or a token id"
        )
    return int(ids[0])


def _check_targets(model, targets, batch: int, pos: int) -> Tensor:
    """Target ids as ``[batch, pos]`` (a single id or string for every position, one per sequence
    ``[batch]``, or one per position ``[batch, pos]``)."""
    d_vocab = int(model.cfg.d_vocab)
    shapes = f"an int or single-token string, a [batch]={batch} list/tensor, or a [batch, pos]=[{batch}, {pos}] tensor"
    if targets is None:
        raise LensInputError(
            f"targets is required: {shapes}; for next-token targets pass "
            "tokens[:, 1:] and tokens[:, :-1] as tokens"
        )
    if isinstance(targets, bool):
        raise LensInputError(f"targets must be token ids, got a bool; pass {shapes}")
    if isinstance(targets, str):
        ids = torch.tensor([[_one_token(model, targets, "targets")]])
    elif isinstance(targets, int):
        ids = torch.tensor([[targets]])
    elif isinstance(targets, Tensor):
        if targets.is_floating_point() or targets.dtype == torch.bool:
            raise LensInputError(
                f"targets must hold integer token ids, got dtype {targets.dtype}; pass {shapes}"
            )
        t = targets.long().cpu()
        if t.ndim == 0:
            ids = t.reshape(1, 1)
        elif t.ndim == 1 and t.shape[0] == batch:
            ids = t.unsqueeze(1)
        elif t.ndim == 2 and tuple(t.shape) == (batch, pos):
            ids = t
        else:
            raise LensInputError(
                f"targets has shape {tuple(t.shape)}, which fits neither [batch]={batch} nor "
                f"[batch, pos]=[{batch}, {pos}]; pass {shapes}"
            )
    else:
        try:
            values = list(targets)
        except TypeError:
            raise LensInputError(
                f"targets must be {shapes}, got {type(targets).__name__}"
            ) from None
        if len(values) != batch:
            raise LensInputError(
                f"targets has {len(values)} entries but tokens has batch={batch}; pass {shapes}"
            )
        out = []
        for i, v in enumerate(values):
            if isinstance(v, str):
                out.append(_one_token(model, v, f"targets[{i}]"))
            elif isinstance(v, int) and not isinstance(v, bool):
                out.append(v)
            else:
                raise LensInputError(
                    f"targets[{i}] = {v!r} is not a token id or a single-token string"
                )
        ids = torch.tensor(out).unsqueeze(1)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= d_vocab:
        raise LensInputError(
            f"targets must be ids in [0, {d_vocab}) (the model's d_vocab), got values in "
            f"[{lo}, {hi}]; pass ids from this model's tokenizer"
        )
    return ids.expand(batch, pos).clone()
