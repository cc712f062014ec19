"""Compression spec strings (``"rtn:bits=4,group=128,sym=0"``): their grammar, the help text the
command line shows, and the registry through which other modules of this folder add methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# spec methods that other modules of this folder register (weighted.py: wanda_perp, wanda_par):
# name -> function(model, calibration=..., **spec keys), which checks its own arguments
REGISTERED_METHODS: dict[str, Callable[..., Any]] = {}

SPEC_HELP = (
    "METHOD[:key=value,...] with METHOD one of: rtn (bits, group, sym), awq (bits, group, sym), "
    "magnitude (sparsity | nm=N:M), wanda (sparsity | nm=N:M), svd (rank), drop (layers=1+2), "
    "identity, wanda_perp / wanda_par (as wanda; component-weighted). Examples: rtn:bits=4,group=128,sym=0  "
    "wanda:nm=2:4  svd:rank=0.5  drop:layers=2  wanda_perp:sparsity=0.5"
)


# each spelling of a key -> the option it sets (two spellings of one option conflict too)
_CANONICAL_KEYS = {"group": "group_size", "g": "group_size", "sym": "symmetric", "s": "sparsity",
                   "nm": "n_m", "rank": "rank_fraction"}


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"rtn:bits=4,group=128,sym=0"`` -> ``("rtn", {"bits": 4, "group_size": 128, "symmetric": False})``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty compression spec; {SPEC_HELP}")
    method, _, rest = spec.strip().partition(":")
    method = method.strip().lower()
    aliases = {"quant": "rtn", "rtn": "rtn", "awq": "awq", "magnitude": "magnitude", "mag": "magnitude",
               "wanda": "wanda", "svd": "low_rank", "low_rank": "low_rank", "lowrank": "low_rank",
               "drop": "drop", "identity": "identity"}
    if method not in aliases and method not in REGISTERED_METHODS:
        raise ValueError(f"unknown compression method {method!r}; {SPEC_HELP}")
    method = aliases.get(method, method)
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # parsed key -> the item that set it
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"bad item {item!r} in spec {spec!r}: expected key=value; {SPEC_HELP}")
        key = key.strip().lower()
        value = value.strip()
        canonical = _CANONICAL_KEYS.get(key, key)
        if canonical in given:
            raise ValueError(f"spec {spec!r} sets {canonical} twice ({given[canonical]!r} and {item!r}); "
                             "keep one")
        given[canonical] = item
        try:
            if key == "bits":
                out["bits"] = int(value)
            elif key in ("group", "group_size", "g"):
                out["group_size"] = None if value.lower() in ("none", "0", "channel", "row") else int(value)
            elif key in ("sym", "symmetric"):
                out["symmetric"] = value.lower() in ("1", "true", "yes", "sym")
            elif key in ("sparsity", "s"):
                out["sparsity"] = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
            elif key in ("nm", "n_m"):
                n, m = value.split(":")
                out["n_m"] = (int(n), int(m))
            elif key in ("rank", "rank_fraction"):
                out["rank_fraction"] = float(value)
            elif key == "layers":
                out["layers"] = [int(x) for x in value.replace("+", " ").split()]
            elif key == "units":
                out["units"] = tuple(value.replace("+", " ").split())
            else:
                raise ValueError(f"unknown key {key!r}")
        except ValueError as exc:
            raise ValueError(f"bad item {item!r} in spec {spec!r} ({exc}); {SPEC_HELP}") from None
    if "sparsity" in out and "n_m" in out:
        raise ValueError(
            f"spec {spec!r} gives both {given['sparsity']!r} and {given['n_m']!r}: an N:M pattern "
            "fixes the sparsity by itself, so the other would be ignored; pass one of them"
        )
    return method, out


__all__ = ["REGISTERED_METHODS", "SPEC_HELP", "parse_spec"]
