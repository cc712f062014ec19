"""Named edit spaces: one vocabulary for sweeps, training variants, views and the CLI
(:data:`EDIT_SPACES`, :func:`edit_space`, :func:`edits_for_space`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .base import Edit
from .carrier import MLPCarrierScale
from .pattern import DiagonalRemoval, EffectiveDiagonal
from .residual import ResidualScale
from .value import ValueScale


@dataclass(frozen=True)
class EditSpace:
    """A named way to turn ``(s_par, s_perp)`` and a scope into edits.

    ``description`` says in which space the split is made and against which reference;
    ``build(s_par, s_perp, layers=..., positions=...[, heads=...])`` returns the edits (a
    list: ``resid-both`` is two). ``scaled``: False where the edit has no scale (``hard-diag``:
    ``s_par`` / ``s_perp`` are ignored); ``perp``: False where only the parallel part is
    scaled (``s_perp`` must be 1); ``heads``: whether the edit can be scoped to heads (value
    space and the pattern; not a residual-stream update).
    """

    name: str
    description: str
    build: Callable[..., list[Edit]]
    scaled: bool = True
    perp: bool = True
    heads: bool = True

    def check_scales(self, s_perp) -> None:
        """Raise where ``s_perp`` is not 1 (or None) in a space that scales only the parallel part."""
        # pattern-form V-Para has no perpendicular scale; a silently ignored s_perp would lie
        if self.scaled and not self.perp and s_perp is not None and not (
                isinstance(s_perp, (int, float)) and s_perp == 1.0):
            raise ValueError(f"space {self.name!r} scales only the parallel part: s_perp must be 1, got {s_perp!r}")


def _value(mode: str, joint: bool = False):
    return lambda sp, sq, **scope: [ValueScale(sp, sq, mode=mode, joint=joint, **scope)]


def _residual(*components: str):
    return lambda sp, sq, **scope: [ResidualScale(c, sp, sq, **scope) for c in components]


def _carrier(site: str):
    return lambda sp, sq, **scope: [MLPCarrierScale(sp, sq, site=site, **scope)]


_SPACE_LIST = (
    EditSpace("value", "value space, full aggregate vs own value (V-Para), attn.hook_z", _value("full")),
    EditSpace("value-exclusive", "value space, cross aggregate vs own value, self message kept, attn.hook_z",
              _value("exclusive")),
    EditSpace("value-joint", "value space, full aggregate vs own value, one split over the concatenated heads "
              "(the paper's form), attn.hook_z", _value("full", joint=True), heads=False),
    EditSpace("value-exclusive-joint", "value space, cross aggregate vs own value, self message kept, one split "
              "over the concatenated heads (the paper's form), attn.hook_z", _value("exclusive", joint=True),
              heads=False),
    EditSpace("resid-attn", "residual space, attention update vs resid_pre", _residual("attn"), heads=False),
    EditSpace("resid-mlp", "residual space, MLP update vs its reference", _residual("mlp"), heads=False),
    EditSpace("resid-both", "residual space, attention and MLP updates", _residual("attn", "mlp"), heads=False),
    EditSpace("block", "residual space, block update (resid_post - resid_pre) vs resid_pre", _residual("block"),
              heads=False),
    EditSpace("hard-diag", "hard diagonal removal in the pattern (A_tt := 0, renormalised); scales ignored",
              lambda sp, sq, **scope: [DiagonalRemoval(**scope)], scaled=False, perp=False),
    EditSpace("eff-diag", "effective diagonal in the pattern, A_tt += (s_par - 1) beta_t (s_perp must be 1)",
              lambda sp, sq, **scope: [EffectiveDiagonal(sp, **scope)], perp=False),
    EditSpace("mlp-carrier-input", "MLP carrier, each d_model-wide block of the carrier h split against the MLP "
              "input x, before W_down (mlp.hook_post)", _carrier("input"), heads=False),
    EditSpace("mlp-carrier-block", "MLP carrier, each block's contribution W_down[:, I_g] h_g split against "
              "h_g, before the sum (the down projection's output)", _carrier("block"), heads=False),
)

#: The named edit spaces (read-only), by name: the sweep's spaces, the training variants' edits,
#: the attention triptych's edits and the CLI's ``--space`` choices.
EDIT_SPACES: Mapping[str, EditSpace] = MappingProxyType({s.name: s for s in _SPACE_LIST})


def edit_space(name: str, argument: str = "edit space") -> EditSpace:
    """The :class:`EditSpace` called ``name``; a ValueError naming ``argument``, the value and
    the valid names otherwise."""
    space = EDIT_SPACES.get(name) if isinstance(name, str) else None
    if space is None:
        raise ValueError(f"{argument} must be one of {', '.join(EDIT_SPACES)}, got {name!r}")
    return space


def edits_for_space(name: str, s_par=1.0, s_perp=1.0, layers=None, *, heads=None, positions=None) -> list[Edit]:
    """The edits of edit space ``name`` (a key of :data:`EDIT_SPACES`) at these scales.

    ``s_par`` / ``s_perp`` take anything the edits take (a float, a per-layer tensor,
    :func:`scales`); ``layers`` is None (all) or a list of layer indices; ``heads`` (query
    heads, value and pattern spaces only) and ``positions`` scope the edits as in the edit
    classes. ``hard-diag`` ignores the scales; ``eff-diag`` needs ``s_perp`` 1 (or None).
    """
    space = edit_space(name)
    space.check_scales(s_perp)
    scope = {"layers": None if layers is None else list(layers), "positions": positions}
    if space.heads:
        scope["heads"] = heads
    elif heads is not None:
        raise ValueError(f"space {name!r} edits a residual-stream update, which has no heads: heads must be None, "
                         f"got {heads!r}; use a value or pattern space ('value', 'hard-diag', 'eff-diag') for heads")
    return space.build(s_par, s_perp, **scope)


__all__ = ["EDIT_SPACES", "EditSpace", "edit_space", "edits_for_space"]
