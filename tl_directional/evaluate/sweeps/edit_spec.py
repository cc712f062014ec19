"""An edit setting as one string: the sweep's row label, read back.

``tl-directional sweep`` names each row of ``sweep.csv`` by its setting's label
(:attr:`tl_directional.evaluate.sweeps.runner.Setting.label`), e.g. ``value[s_par=0,s_perp=1,L=all]`` or
``resid-mlp[s_par=1,s_perp=0,L=0,1]``. :func:`parse_edit_spec` reads such a label back into the
:class:`~tl_directional.evaluate.sweeps.runner.Setting` it names, so a row of a sweep can be passed on as is
(``lm_eval --model_args edits=...``, :mod:`tl_directional.evaluate.suites.lm_eval_model`). The grammar is the
sweep command line's: a space of ``--space`` (:data:`tl_directional.edit.EDIT_SPACES`), scales as
``--s-par`` / ``--s-perp`` take them, one layer set as ``--layers`` writes it (``all``, ``0-3``,
``0,2``, ``-1``; parsed by the same function). Keys may be left out (``s_par`` and ``s_perp``
default to 1, ``L`` to all layers) and ``layers=`` may stand for ``L=``; ``+`` joins several
settings, applied in the order written.
"""

from __future__ import annotations

import math
import re

from ...core.errors import TLDirectionalError
from ...edit import EDIT_SPACES
from ...model.indices import normalize_layers
from .random_draws import RandomScaleError, random_setting
from .setting import Setting

_KEYS = ("s_par", "s_perp", "L")
# a random per-layer setting's label (tl_directional.evaluate.sweeps.random_draws.random_setting)
_RANDOM_KEYS = ("random", "seed", "low", "high", "mean", "sd")
_SPEC = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*(?:\[(.*)\])?\s*$", re.S)
GRAMMAR = ("SPACE[s_par=X,s_perp=Y,L=LAYERS] (a sweep.csv label; keys optional), several joined "
           "by '+', e.g. 'value[s_par=0]' or 'resid-mlp[s_par=1,s_perp=0,L=0-2]+hard-diag[L=3]'")


class EditSpecError(TLDirectionalError, ValueError):
    """An edit spec that cannot be read; the message names the argument, the value and the grammar."""


def _top_level(text: str) -> list[str]:
    """``text`` split at the ``+`` outside brackets (``s_par=1e+06`` keeps its sign)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "+" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def layer_sets(text: str, n_layers: int | None = None) -> list:
    """``"all"`` -> [None]; ``"0-3;5"`` -> [[0, 1, 2, 3], [5]] (``;`` separates sets); negative
    layers count from the end (``-1`` is the last; a range ``0-3`` has non-negative ends).
    With ``n_layers`` every layer is checked and normalised to ``0..n_layers-1``."""
    if not text.strip():
        # an unset shell variable (--layers "$L") would otherwise edit every layer
        raise ValueError("--layers '' is empty; name the layers ('0-3', '0,2;-1') or pass 'all' "
                         "for every layer")
    out = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            raise ValueError(f"--layers {text!r} has an empty layer set between ';'; drop the extra "
                             "';' or write 'all' for every layer")
        if part == "all":
            out.append(None)
            continue
        layers = []
        for piece in part.split(","):
            piece = piece.strip()
            ends = piece.split("-", 1) if "-" in piece and not piece.startswith("-") else [piece]
            try:
                ints = [int(x) for x in ends]
            except ValueError:
                raise ValueError(f"--layers {text!r}: expected layer sets like 'all', '0-3', '0,2;-1'") from None
            if len(ints) == 2:  # a range "a-b"
                a, b = ints
                if b < a:
                    raise ValueError(f"--layers {text!r}: the range {piece!r} is empty (it ends below its "
                                     f"start); write it low-high, e.g. '{b}-{a}', or 'all' for every layer")
                layers += list(range(a, b + 1))
            else:  # one layer, possibly negative
                layers.append(ints[0])
        if n_layers is not None:
            layers = normalize_layers(layers, n_layers, "--layers")
        out.append(layers)
    return out


def parse_edit_spec(text: str, n_layers: int | None = None, *, argument: str = "edits") -> list:
    """The sweep settings (:class:`tl_directional.evaluate.sweeps.runner.Setting`) an edit spec names.

    Args:
        text: the spec (see the module docstring); empty or ``"none"``: no edit.
        n_layers: the model's layer count: layers are then checked and negative ones resolved
            (as ``--layers`` does); None keeps them as written.
        argument: the name used in error messages.

    Returns:
        A list of settings, in the order written (``[]`` for no edit).

    Raises:
        EditSpecError: naming ``argument``, the value, what is wrong and the grammar.
    """

    if not isinstance(text, str):
        raise EditSpecError(f"{argument} must be a string such as {GRAMMAR}; got {type(text).__name__} {text!r}")
    if text.strip().lower() in ("", "none"):
        return []

    def fail(why: str) -> EditSpecError:
        return EditSpecError(f"{argument}={text!r}: {why}; write {GRAMMAR}")

    settings = []
    for part in _top_level(text):
        m = _SPEC.match(part)
        if m is None:
            raise fail(f"cannot read {part.strip()!r}")
        space, body = m.group(1), m.group(2)
        if space not in EDIT_SPACES:
            raise fail(f"unknown space {space!r}; choose from {', '.join(EDIT_SPACES)}")
        values: dict[str, str] = {}
        key = None
        for piece in ([] if body is None or not body.strip() else body.split(",")):
            if "=" in piece:
                key, value = (s.strip() for s in piece.split("=", 1))
                key = "L" if key == "layers" else key
                if key not in _KEYS + _RANDOM_KEYS:
                    raise fail(f"unknown key {key!r} in {part.strip()!r}; keys are {', '.join(_KEYS)} (or layers), "
                               f"and for a random per-layer setting {', '.join(_RANDOM_KEYS)}")
                if key in values:
                    raise fail(f"{key} is given twice in {part.strip()!r}")
                values[key] = value
            elif key == "L":  # the commas of a layer list, as the label writes them (L=0,1)
                values["L"] += "," + piece.strip()
            else:
                raise fail(f"{piece.strip()!r} in {part.strip()!r} is not key=value")
        space_def = EDIT_SPACES[space]
        if "random" in values or set(_RANDOM_KEYS[1:]) & values.keys():
            settings.append(_random_setting(space, values, n_layers, fail, part.strip()))
            continue
        if not space_def.scaled and ({"s_par", "s_perp"} & values.keys()):
            raise fail(f"space {space!r} has no scales (it ignores s_par and s_perp); leave them out")
        scales = {}
        for name in ("s_par", "s_perp"):
            raw = values.get(name, "1")
            try:
                scales[name] = float(raw)
            except ValueError:
                raise fail(f"{name}={raw!r} is not a number") from None
            if not math.isfinite(scales[name]):
                raise fail(f"{name}={raw!r} is not finite")
        layers_text = values.get("L", "all")
        if ";" in layers_text:
            raise fail(f"L={layers_text!r} holds several layer sets; one setting takes one set (join settings with '+')")
        try:
            (layers,) = layer_sets(layers_text, n_layers)
        except ValueError as exc:
            raise fail(f"L={layers_text!r}: {str(exc).replace('--layers ', 'layers ')}") from None
        try:
            settings.append(Setting(space, scales["s_par"], scales["s_perp"],
                                    None if layers is None else tuple(layers)))
        except ValueError as exc:
            raise fail(str(exc)) from None
    return settings


def _random_setting(space: str, values: dict[str, str], n_layers: int | None, fail, part: str) -> Setting:
    """The random per-layer setting a ``sweep --random`` row label names (``value[random=uniform,
    seed=3,s_perp=1,L=all]``): the same draw, so the label reads back as exactly that row."""
    if "random" not in values or "seed" not in values:
        raise fail(f"{part!r} is a random per-layer setting: it needs both random=DIST and seed=N")
    if "s_par" in values:
        raise fail(f"{part!r} draws s_par per layer (random=...); leave s_par out")
    if n_layers is None:
        raise fail(f"{part!r} draws one s_par per layer: the model's layer count is needed to read it")
    try:
        seed = int(values["seed"])
        ranges = {k: float(values[k]) for k in _RANDOM_KEYS[2:] if k in values}
        s_perp = float(values.get("s_perp", "1"))
    except ValueError as exc:
        raise fail(f"{part!r}: {exc}") from None
    try:
        (layers,) = layer_sets(values.get("L", "all"), n_layers)
        return random_setting(space, n_layers, values["random"], seed=seed, s_perp=s_perp, layers=layers, **ranges)
    except (RandomScaleError, ValueError) as exc:
        raise fail(f"{part!r}: {exc}") from None


def spec_edits(text: str, n_layers: int | None = None, *, argument: str = "edits") -> list:
    """The edits (:mod:`tl_directional.edit` objects) of the settings :func:`parse_edit_spec`
    reads from ``text``, in order."""
    return [e for s in parse_edit_spec(text, n_layers, argument=argument) for e in s.edits()]


__all__ = ["GRAMMAR", "EditSpecError", "layer_sets", "parse_edit_spec", "spec_edits"]
