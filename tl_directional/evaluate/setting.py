"""One point of a sweep grid (:class:`Setting`): what both the sweep and the safe-scale search run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..edit import EDIT_SPACES, Edit, edit_space, edits_for_space


@dataclass(frozen=True)
class Setting:
    """One point of a sweep grid: an edit space, its scales, and its layers (None = all)."""

    space: str
    s_par: float = 1.0
    s_perp: float = 1.0
    layers: tuple[int, ...] | None = None

    def __post_init__(self):
        edit_space(self.space, "space")  # a ValueError naming the valid spaces
        for name in ("s_par", "s_perp"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        EDIT_SPACES[self.space].check_scales(self.s_perp)

    @property
    def label(self) -> str:
        layers = "all" if self.layers is None else ",".join(map(str, self.layers))
        if not EDIT_SPACES[self.space].scaled:
            return f"{self.space}[L={layers}]"
        return f"{self.space}[s_par={self.s_par:g},s_perp={self.s_perp:g},L={layers}]"

    @property
    def is_identity(self) -> bool:
        return EDIT_SPACES[self.space].scaled and self.s_par == 1.0 and self.s_perp == 1.0

    def edits(self, s_par=None, s_perp=None) -> list[Edit]:
        """The edits of this setting; ``s_par`` / ``s_perp`` override the scales (e.g. per-row)."""
        sp = self.s_par if s_par is None else s_par
        sq = self.s_perp if s_perp is None else s_perp
        return edits_for_space(self.space, sp, sq, self.layers)


__all__ = ["Setting"]
