"""Arguments checked: layer and head indices against a model's size, scale lists, the hook API.

Negative indices count from the end, as in Python and TransformerLens; every error names the
argument, the value and the valid range.
"""

from __future__ import annotations

import numbers

from torch import Tensor


def check_hook_api(model, argument: str = "model") -> None:
    """Raise a TypeError unless ``model`` has TransformerLens's hook API."""
    missing = [a for a in ("run_with_hooks", "hooks", "hook_dict", "cfg") if not hasattr(model, a)]
    if missing:
        raise TypeError(
            f"{argument} must be a TransformerLens model (TransformerBridge or HookedTransformer); "
            f"{type(model).__name__} lacks {', '.join(missing)}. Load one with "
            "tl_directional.load_model(...) or TransformerBridge.boot_transformers(...)."
        )


def normalize_index(index, size: int, argument: str, what: str = "layer", *, in_list: bool = False) -> int:
    """One layer / head index in ``-size .. size - 1`` -> ``0 .. size - 1`` (negative
    indices count from the end, as in Python and TransformerLens: ``-1`` is the last)."""
    if isinstance(index, Tensor) and index.numel() == 1 and not index.is_floating_point():
        index = int(index)
    if not isinstance(index, numbers.Integral) or isinstance(index, bool):
        raise TypeError(f"{argument} must hold ints, got {index!r} ({type(index).__name__})")
    index = int(index)
    if not -size <= index < size:
        if in_list:  # "layers has layer 7" / "heads has 9"
            shown = f"{argument} has {what} {index}," if what == "layer" else f"{argument} has {index},"
        else:
            shown = f"{argument}={index} is"
        raise ValueError(
            f"{shown} out of range for a model with {size} {what}s "
            f"(valid: 0..{size - 1}, or -{size}..-1 counting from the end)"
        )
    return index % size


def check_layer(layer: int, n_layers: int, argument: str = "layers") -> int:
    """Validate one layer index; returns it in ``0 .. n_layers - 1`` (see :func:`normalize_index`)."""
    return normalize_index(layer, n_layers, argument, "layer", in_list=argument.endswith("s"))


def _index_list(values, size: int, argument: str, what: str) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, int) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, Tensor):
        values = values.reshape(-1).tolist()
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{argument} must be None, an int or a sequence of ints, got the string {values!r}")
    try:
        values = list(values)
    except TypeError:
        raise TypeError(
            f"{argument} must be None, an int or a sequence of ints, got {type(values).__name__}"
        ) from None
    if not values:
        raise ValueError(f"{argument} is empty; pass None for all {what}s")
    return sorted({normalize_index(v, size, argument, what, in_list=True) for v in values})


def normalize_layers(layers, n_layers: int, argument: str = "layers") -> list[int]:
    """``None`` -> all layers; an int, range or sequence of ints (negative ones count from
    the end) -> sorted unique list in ``0 .. n_layers - 1``."""
    out = _index_list(layers, n_layers, argument, "layer")
    return list(range(n_layers)) if out is None else out


def normalize_heads(heads, n_heads: int, argument: str = "heads") -> list[int] | None:
    """``None`` -> None (all heads); an int or sequence of query-head indices (negative ones
    count from the end) -> sorted unique list in ``0 .. n_heads - 1``."""
    return _index_list(heads, n_heads, argument, "head")


def scale_list(value, argument: str) -> list[float]:
    """Scales given as a number (``0.5``), a comma string (``"-1,0,0.5"``) or a sequence of
    numbers -> a list of finite floats; errors name ``argument`` and the value."""
    import math
    import numbers

    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            value = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"{argument}={value!r}: expected comma-separated numbers, e.g. '-1,0,0.5'") from None
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = [value]
    elif isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise TypeError(
            f"{argument} must be a number, a list of numbers or a string like '-1,0,0.5', got {value!r}"
        ) from None
    if not out:
        raise ValueError(f"{argument} is empty; pass at least one scale")
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{argument} must be a finite number, got {bad[0]} (every scale must be finite)")
    return out
