"""Position scoping: a ``positions=`` argument as a per-sequence boolean mask.

Masks are over *absolute* positions, so they stay right during KV-cached generation, where a
hook sees one new position at a time; the checks refuse positions that select nothing.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from .inputs import TokenBatch


def resolve_exclude_first_token(exclude_first_token: bool | None, positions) -> bool:
    """The statistics' first-token rule (METHOD.md sec. 1): the first real token (BOS in
    most tokenizers; the attention sink) is left out by default; with explicit
    ``positions`` the default is to count exactly the positions asked for."""
    if exclude_first_token is None:
        return positions is None
    if not isinstance(exclude_first_token, bool):
        raise TypeError(f"exclude_first_token must be True, False or None, got {exclude_first_token!r}")
    return exclude_first_token


def check_positions_select(positions, batch: TokenBatch, argument: str = "positions") -> None:
    """Raise a ValueError when ``positions`` selects no real token of ``batch``
    (e.g. ``positions=[500]`` on 256-token inputs, which would give empty statistics)."""
    if positions is None:
        return
    check_bool_mask_length(positions, batch.tokens.shape[1], argument)
    pm = position_mask(positions, batch=len(batch), n_query=batch.tokens.shape[1], argument=argument)
    if not bool((pm & batch.attention_mask.bool()).any()):
        raise ValueError(_positions_range_message(positions, batch.tokens.shape[1], argument, "selects no token"))


def _positions_range_message(positions, n: int, argument: str, what: str) -> str:
    return (f"{argument}={positions!r} {what}: the inputs have positions 0..{n - 1} "
            f"(or -{n}..-1 from the end; sequence length {n}); pick positions inside them")


def check_bool_mask_length(positions, n: int, argument: str = "positions") -> None:
    """Raise a ValueError when ``positions`` is a bool mask whose last axis is not ``n`` long
    (a shorter mask was read as its first positions, a longer one cut): a mask has one entry
    per token of the sequence. Anything that is not a bool tensor passes."""
    if isinstance(positions, Tensor) and positions.dtype == torch.bool and positions.ndim >= 1 \
            and positions.shape[-1] != n:
        raise ValueError(
            f"{argument} is a bool mask of shape {tuple(positions.shape)}, {positions.shape[-1]} positions, but "
            f"the sequence has {n} tokens; pass a mask with one entry per token ([{n}] or [batch, {n}]), "
            "or a list of positions")


def check_positions_in_range(positions, n: int, argument: str = "positions") -> None:
    """Raise a ValueError when an int of ``positions`` lies outside a sequence of ``n`` tokens
    (``0..n-1`` or ``-n..-1``), a slice, a list or a bool mask selects none of them (``[]``,
    an all-False mask: the edit would silently do nothing), or a bool mask is not ``n``
    long; a TypeError for entries that are not ints (``1.5``). None passes. The edits'
    scope check."""
    if positions is None:
        return
    if isinstance(positions, Tensor) and positions.dtype == torch.bool:
        check_bool_mask_length(positions, n, argument)
        if not bool(positions.any()):
            raise ValueError(f"{argument} is a bool mask with no True entry: the edit would change nothing; "
                             "select at least one position, or pass positions=None for all")
        return
    if isinstance(positions, slice):
        if not len(range(n)[positions]):
            raise ValueError(_positions_range_message(positions, n, argument, "selects no position"))
        return
    ints = int_positions(positions, argument)
    if not ints:
        raise ValueError(f"{argument}={positions!r} is empty: the edit would change nothing (as layers=[] or "
                         "heads=[] would); select at least one position, or pass positions=None for all")
    bad = [p for p in ints if not -n <= p < n]
    if bad:
        raise ValueError(_positions_range_message(positions, n, argument, f"has {bad[0]}, out of range"))


def int_positions(positions, argument: str) -> list[int]:
    """``positions`` (an int, a sequence or an integer tensor of ints) as a list of ints;
    a TypeError naming ``argument`` and the value for anything else (``1.5``, ``"3"``)."""
    import numbers

    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        return [int(positions)]
    if isinstance(positions, Tensor):
        if positions.is_floating_point() or positions.is_complex():
            positions = [float(p) for p in positions.reshape(-1).tolist()]
        else:
            positions = positions.reshape(-1).tolist()
    try:
        items = list(positions)
    except TypeError:
        items = None
    bad = None if items is not None else positions
    if items is not None:
        bad = next((p for p in items if not isinstance(p, numbers.Integral) or isinstance(p, bool)), None)
        if bad is None:
            return [int(p) for p in items]
    raise TypeError(
        f"{argument} must be None, an int, a list of ints, a slice or a bool tensor; got {positions!r} "
        f"(entry {bad!r} is not an int); pass whole token indices, e.g. positions=[1, -1]"
    )


def first_token_mask(attention_mask: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
    """True at each sequence's first real token (position 0 only without left padding)."""
    m = attention_mask.bool()
    first = torch.zeros_like(m)
    idx = m.long().argmax(-1)
    first[torch.arange(m.shape[0]), idx] = True
    return first & m


def position_mask(
    positions,
    *,
    batch: int,
    n_query: int,
    offset: int = 0,
    device=None,
    argument: str = "positions",
) -> Bool[Tensor, "batch_or_1 n_query"] | None:
    """Boolean mask over the query positions a hook sees, in absolute positions.

    A hook sees query positions ``offset .. offset + n_query - 1`` (offset > 0 during
    KV-cached generation). ``positions`` may be None (all: returns None), an int, a
    sequence of ints (negative ints count from the end of the *current* sequence), a
    ``slice``, or a bool tensor ``[pos]`` / ``[batch, pos]`` over absolute positions
    (positions beyond its length are not selected).
    """
    if positions is None:
        return None
    abs_pos = torch.arange(offset, offset + n_query, device=device)
    total = offset + n_query
    if isinstance(positions, Tensor) and positions.dtype == torch.bool:
        m = positions.to(device)
        if m.ndim == 1:
            m = m.unsqueeze(0)
        if m.ndim != 2:
            raise ValueError(f"{argument} as a bool mask must be [pos] or [batch, pos], got {tuple(positions.shape)}")
        if m.shape[0] not in (1, batch):
            raise ValueError(f"{argument} mask has {m.shape[0]} rows but the batch has {batch}")
        padded = torch.zeros((m.shape[0], total), dtype=torch.bool, device=device)
        n = min(total, m.shape[1])
        padded[:, :n] = m[:, :n]
        return padded[:, offset:total]
    if isinstance(positions, slice):
        idx = torch.arange(total, device=device)[positions]
    else:
        positions = int_positions(positions, argument)
        idx = torch.tensor([p + total if p < 0 else p for p in positions], dtype=torch.long, device=device)
    return torch.isin(abs_pos, idx).unsqueeze(0)
