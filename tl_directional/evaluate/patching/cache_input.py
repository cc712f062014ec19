"""TransformerLens-style inputs of the patching functions: a user's clean cache and a ``names_filter``.

``transformer_lens.patching`` takes ``(model, corrupted_tokens, clean_cache, metric)`` and
``run_with_cache`` takes a ``names_filter``; these helpers let :func:`~tl_directional.directional_patch`
and :func:`~tl_directional.attribution_patch` accept the same, and fail with a message naming the
missing hook (never a silent zero) when a cache or a filter leaves out what a patch reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from ...core.errors import TLDirectionalError


class PatchingInputError(TLDirectionalError, ValueError):
    """A clean cache or a ``names_filter`` lacks a hook point a requested patch or node reads."""


def is_cache(x) -> bool:
    """Whether ``x`` is a cache (``ActivationCache`` or any mapping of hook names to tensors) rather
    than tokens or texts: the third argument of TransformerLens's patching shape."""
    return (
        not isinstance(x, (Tensor, str, list, tuple))
        and hasattr(x, "__getitem__")
        and hasattr(x, "keys")
    )


def names_predicate(names_filter) -> Callable[[str], bool] | None:
    """``names_filter`` as ``run_with_cache`` reads it (None: keep all; a name; a list of names; a
    predicate ``name -> bool``) turned into a predicate (None for "keep all")."""
    if names_filter is None:
        return None
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if callable(names_filter):
        return names_filter
    try:
        wanted = set(names_filter)
    except TypeError:
        raise PatchingInputError(
            "names_filter must be None, a hook name, a list of hook names or a function name -> bool, "
            f"got {type(names_filter).__name__}"
        ) from None
    return lambda name: name in wanted


def check_names_filter(names_filter, needed: dict[str, Iterable[str]], hint: str) -> None:
    """Raise :class:`PatchingInputError` when ``names_filter`` drops a hook point that one of the
    requested kinds (``needed``: kind -> hook names) reads; ``hint`` says how to list them."""
    keep = names_predicate(names_filter)
    if keep is None:
        return
    for kind, names in needed.items():
        dropped = sorted(h for h in names if not keep(h))
        if dropped:
            raise PatchingInputError(
                f"names_filter drops {dropped[:3]}{' ...' if len(dropped) > 3 else ''}, which {kind!r} reads; "
                f"keep them ({hint}) or leave {kind!r} out"
            )


def cache_tensor(cache, name: str, shape: tuple[int, int], argument: str, hint: str) -> Tensor:
    """``cache[name]``, checked: present, a tensor, and of the corrupted run's ``(batch, pos)``."""
    try:
        t = cache[name]
    except (KeyError, IndexError, ValueError):
        t = None
    if not isinstance(t, Tensor):
        raise PatchingInputError(f"{argument} has no {name!r}; cache the clean run with {hint}")
    if tuple(t.shape[:2]) != tuple(shape):
        raise PatchingInputError(
            f"{argument}[{name!r}] has batch and positions {tuple(t.shape[:2])}, the corrupted tokens {tuple(shape)}; "
            "cache the clean run of tokens of the corrupted run's shape"
        )
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise PatchingInputError(
            f"{argument}[{name!r}] holds {bad} NaN or inf entries; every patch read from it would be NaN "
            "beside plausible numbers. Check the weights and inputs of the run you cached (a NaN weight "
            "makes NaN activations) and cache it again"
        )
    return t


def clean_from_cache(cache, names, shape: tuple[int, int], device) -> dict[str, Tensor]:
    """The hooks ``names`` of a user's clean cache (any mapping), checked: present and of the
    corrupted run's ``[batch, pos]`` ``shape``; detached, on ``device``."""
    hint = f"model.run_with_cache(clean_tokens, names_filter=lambda n: n in {sorted(names)!r})"
    return {n: cache_tensor(cache, n, shape, "clean_cache", hint).detach().to(device) for n in sorted(names)}


def check_finite_metric(values, error: type[Exception]):
    """``values`` (a tensor or an array of metric values), unchanged, unless one is NaN or inf:
    then ``error`` naming it (a NaN metric would sit in the result beside plausible numbers)."""
    array = values.detach().double().cpu().numpy() if isinstance(values, Tensor) else np.asarray(values, float)
    bad = ~np.isfinite(array.reshape(-1))
    if bad.any():
        raise error(
            f"metric returned {array.reshape(-1)[bad][0]} (at {int(bad.sum())} of {bad.size} entries); a NaN or "
            "inf metric would sit in the result beside plausible numbers. Check the metric (a log of 0, a "
            "division by 0) and the model's logits (a NaN weight or input makes NaN logits)"
        )
    return values


def metric_values(metric, logits: Tensor, error: type[Exception], type_error: type[Exception] = TypeError, *,
                  per_example: bool = True) -> np.ndarray:
    """``metric(logits)`` (logits ``[b, pos, vocab]``) as float64 ``[b]`` (one number per example,
    only with ``per_example``) or ``[1]`` (one for the batch). A tensor of another shape or a NaN /
    inf value raises ``error``, a value that is no number ``type_error``."""
    value, b = metric(logits), logits.shape[0]
    if isinstance(value, Tensor):
        if value.numel() != 1 and (not per_example or value.ndim != 1 or value.shape[0] != b):
            want = (f"one number per example (shape [{b}]) or one for the batch, e.g. "
                    "lambda logits: logits[:, -1, a] - logits[:, -1, b]" if per_example else
                    "one number per run, e.g. reduce over the batch: "
                    "lambda logits: (logits[:, -1, a] - logits[:, -1, b]).mean()")
            raise error(f"metric returned a tensor of shape {tuple(value.shape)}; it must return {want}")
        return check_finite_metric(value.detach().double().cpu().reshape(-1).numpy(), error)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise type_error(f"metric must return a number or a tensor, got {type(value).__name__}; "
                         "return e.g. (logits[:, -1, a] - logits[:, -1, b]).mean()") from None
    return check_finite_metric(np.array([number]), error)


__all__ = [
    "PatchingInputError",
    "cache_tensor",
    "clean_from_cache",
    "check_names_filter",
    "is_cache",
    "metric_values",
    "names_predicate",
]
