"""The split logit lens's input checks (:func:`tl_directional.evaluate.lens.lens.split_logit_lens`):
tokens (ids or texts), padding mask, a cache, positions, targets and ordering, each refused with
:class:`LensInputError` naming the argument, its valid range and the fix."""

from __future__ import annotations

import torch
from torch import Tensor

from ...core.errors import TLDirectionalError
from ...model.handle import device_of
from ...model.inputs import check_attention_mask_values, pad_sequences

ORDERINGS = ("shapley", "parallel_first", "perpendicular_first")


class LensInputError(TLDirectionalError, ValueError):
    """A bad argument to :func:`split_logit_lens` (tokens or texts, a cache, positions, target
    tokens, ordering, model state)."""


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


def _check_targets(model, targets, batch: int, pos: int, selected: bool = False) -> Tensor:
    """Target ids as ``[batch, pos]`` (a single id or string for every position, one per sequence
    ``[batch]``, or one per position ``[batch, pos]``; with ``selected``, ``pos`` counts the
    positions ``positions=`` selected, which per-position targets are aligned with)."""
    d_vocab = int(model.cfg.d_vocab)
    shapes = f"an int or single-token string, a [batch]={batch} list/tensor, or a [batch, pos]=[{batch}, {pos}] tensor"
    if selected:
        shapes += (f" (pos = the {pos} selected positions, as TransformerLens aligns them: pass "
                   "targets[:, positions] for per-token targets)")
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


def _as_texts(tokens) -> list | None:
    """``tokens`` as a list of texts when it is a string or a list / tuple holding a string (a
    mixed list is refused by :func:`_tokenize_texts`), else None (token ids)."""
    if isinstance(tokens, str):
        return [tokens]
    if isinstance(tokens, (list, tuple)) and any(isinstance(t, str) for t in tokens):
        return list(tokens)
    return None


def _tokenize_texts(model, texts: list) -> tuple[Tensor, Tensor | None]:
    """``(tokens [batch, pos], attention_mask [batch, pos] or None)`` of ``texts``.

    Each text is tokenised alone by the model's own ``to_tokens`` (BOS prepended as the model does
    by default), so one text, or texts of one length, give exactly ``model.to_tokens(texts)`` and no
    mask. Texts of unequal lengths are right-padded here with a mask built from their lengths
    (never guessed from pad ids: GPT-2's pad id is its BOS id). Right padding whatever the
    tokenizer's side: every real token keeps its position and, in a causal model, never attends
    to the padding, so each text's values equal its single-text run's up to batched round-off."""
    if getattr(model, "tokenizer", None) is None:
        raise LensInputError("tokens are strings but the model has no tokenizer; pass token ids, a "
                             "[batch, pos] integer tensor")
    n_ctx = getattr(model.cfg, "n_ctx", None)
    rows = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise LensInputError(f"tokens[{i}] is {type(text).__name__}, not a string; pass a list of "
                                 "strings, or the token ids of all of them as one [batch, pos] tensor")
        if not text.strip():
            raise LensInputError(f"tokens[{i}] is an empty string: its lens would read BOS alone; drop it "
                                 "or pass text")
        ids = model.to_tokens(text, truncate=False)[0].cpu().tolist()
        if isinstance(n_ctx, int) and len(ids) > n_ctx:
            raise LensInputError(
                f"tokens[{i}] is {len(ids)} tokens (BOS included), more than the model's context "
                f"n_ctx={n_ctx}; pass a shorter text, or its last {n_ctx} token ids as a [1, pos] tensor")
        rows.append(ids)
    if len({len(r) for r in rows}) == 1:
        return torch.tensor(rows, dtype=torch.long), None
    pad = getattr(model.tokenizer, "pad_token_id", None)
    batch = pad_sequences(rows, pad_id=0 if pad is None else int(pad), padding_side="right")
    return batch.tokens, batch.attention_mask


def _unwrap_slice(positions):
    """TransformerLens's ``Slice`` object (duck-typed: ``.mode`` and ``.slice``) as what it wraps."""
    if hasattr(positions, "mode") and hasattr(positions, "slice") and not isinstance(positions, slice):
        return None if positions.mode == "identity" else positions.slice
    return positions


def _check_positions(positions, n_pos: int) -> Tensor | None:
    """``positions`` as absolute indices, in the order given, ``[n_selected]`` into ``n_pos`` positions
    (None: every position). TransformerLens's ``Slice`` inputs: an int, a ``slice``, a tuple
    (``slice(*tuple)``), a list / range / 1-D integer tensor or array of indices; negative
    indices count from the end."""
    positions = _unwrap_slice(positions)
    if positions is None:
        return None
    valid = (f"an int, a slice, a (start, stop[, step]) tuple or a list of ints in [{-n_pos}, {n_pos - 1}] "
             f"(tokens have {n_pos} positions; negative counts from the end), or None for all")
    if hasattr(positions, "tolist") and not isinstance(positions, (list, tuple, range)):
        if getattr(positions, "dtype", None) is not None and (
                "int" not in str(positions.dtype) or getattr(positions, "ndim", 1) > 1):
            raise LensInputError(f"positions must be integer indices, got {type(positions).__name__} of "
                                 f"dtype {positions.dtype} and shape {tuple(positions.shape)}; pass {valid}")
        positions = positions.tolist()
    if isinstance(positions, tuple):
        positions = slice(*positions)
    if isinstance(positions, slice):
        try:
            index = list(range(n_pos))[positions]
        except (TypeError, ValueError) as exc:
            raise LensInputError(f"positions={positions!r} is not a usable slice ({exc}); pass {valid}") from None
        if not index:
            raise LensInputError(f"positions={positions!r} selects none of the {n_pos} positions; pass {valid}")
        return torch.tensor(index, dtype=torch.long)
    index = [positions] if isinstance(positions, int) else positions
    if not isinstance(index, (list, range)) or not index or any(
            isinstance(p, bool) or not isinstance(p, int) for p in index):
        raise LensInputError(f"positions={positions!r} is not a position selection; pass {valid}")
    outside = [p for p in index if not -n_pos <= p < n_pos]
    if outside:
        raise LensInputError(f"positions={positions!r}: {outside[:4]} outside the {n_pos} positions of "
                             f"tokens; pass {valid}")
    return torch.tensor([p % n_pos for p in index], dtype=torch.long)


def _cache_hint(names) -> str:
    """How to cache the hooks ``names`` read: a ``names_filter`` keeping their kinds."""
    kinds = sorted({n.split(".", 2)[-1] if n.startswith("blocks.") else n for n in names})
    return ("model.run_with_cache(tokens) without a names_filter, or with names_filter=lambda name: "
            f"name.endswith({tuple(kinds)!r})")


def _read_cache(cache, names: list[str], shape: tuple[int, int] | None, d_model: int,
                attention_mask) -> tuple[dict[str, Tensor], Tensor | None, tuple[int, int]]:
    """``({hook: cache[hook]}, mask, (batch, pos))`` for the hooks ``names``, checked: all present
    (the missing ones named together), ``[batch, pos, d_model]`` tensors of one shape (``shape``,
    the tokens' ``(batch, pos)``, when tokens were given), finite at the real (unmasked)
    positions; ``attention_mask`` checked against that shape."""
    if isinstance(cache, (Tensor, str, list, tuple)) or not (hasattr(cache, "__getitem__") and hasattr(cache, "keys")):
        raise LensInputError(f"cache must be an ActivationCache or a mapping of hook names to tensors, got "
                             f"{type(cache).__name__}; pass the cache of model.run_with_cache(tokens)")
    found, missing = {}, []
    for name in names:
        try:
            t = cache[name]
        except (KeyError, IndexError, ValueError):
            t = None
        if isinstance(t, Tensor):
            found[name] = t
        else:
            missing.append(name)
    if missing:
        raise LensInputError(
            f"cache lacks {len(missing)} of the {len(names)} hooks the lens reads: {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''} (a names_filter that dropped them?); cache the run with "
            f"{_cache_hint(names)}")
    first = found[names[0]]
    shape = shape if shape is not None else tuple(first.shape[:2])
    want = (*shape, d_model)
    for name, t in found.items():
        if t.ndim != 3 or tuple(t.shape) != want:
            raise LensInputError(
                f"cache[{name!r}] has shape {tuple(t.shape)}, expected [batch, pos, d_model]={list(want)}; "
                "cache model.run_with_cache(tokens) of these tokens, with the batch dimension kept")
    mask = _check_mask(attention_mask, shape)
    for name, t in found.items():
        real = t if mask is None else t[mask.to(t.device)]
        if t.is_floating_point() and not bool(torch.isfinite(real).all()):
            raise LensInputError(
                f"cache[{name!r}] holds NaN or inf at {int((~torch.isfinite(real)).sum())} real-token entries; "
                "every lens value read from it would be NaN. Check the weights and inputs of the cached run")
    return found, mask, shape


def _lens_inputs(model, tokens, attention_mask, cache, names: list[str]
                 ) -> tuple[tuple[int, int], Tensor | None, Tensor | None, dict[str, Tensor] | None]:
    """``((batch, pos), mask or None, tokens or None, acts or None)``, checked, before any forward:
    ``tokens`` (token ids, or texts tokenised here) to run, or ``acts`` (``{hook: [batch, pos,
    d_model]}`` on the model's device) read from ``cache`` (``tokens`` then None or the token
    tensor the cache was run on)."""
    texts = _as_texts(tokens)
    if texts is not None:
        if cache is not None:
            # tokenised here the texts might be padded unlike the cached run: a position read
            # would silently be another token's
            raise LensInputError(
                "with cache=, tokens must be None or the [batch, pos] token tensor the cache was run on, "
                "got texts; pass tokens = model.to_tokens(texts) to both run_with_cache and split_logit_lens")
        if attention_mask is not None:
            raise LensInputError("attention_mask is built here for texts (right padding, from each text's "
                                 "length); pass attention_mask only with token ids")
        tokens, attention_mask = _tokenize_texts(model, texts)
    if tokens is None and cache is None:
        raise LensInputError("tokens is None and no cache was given; pass texts or token ids, or "
                             "cache=model.run_with_cache(tokens)[1]")
    shape = None
    if tokens is not None:
        tokens = _check_tokens(model, tokens)
        shape = tuple(tokens.shape)
    if cache is None:
        return shape, _check_mask(attention_mask, shape), tokens, None
    acts, mask, shape = _read_cache(cache, names, shape, int(model.cfg.d_model), attention_mask)
    device = device_of(model)
    return shape, mask, tokens, {h: t.to(device) for h, t in acts.items()}
