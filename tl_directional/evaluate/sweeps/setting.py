"""One point of a sweep grid (:class:`Setting`): what both the sweep and the safe-scale search run."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...edit import EDIT_SPACES, Edit, edit_space, edits_for_space


@dataclass(frozen=True)
class Setting:
    """One point of a sweep grid: an edit space, its scales, and its layers (None = all).

    ``layer_s_par`` (optional, ``[n_layers]`` values): a per-layer ``s_par`` that replaces the
    scalar in the edits (random per-layer scales,
    :func:`~tl_directional.evaluate.sweeps.random_draws.random_setting`); ``s_par`` then only
    summarises it, and ``tag`` names it in the label.
    """

    space: str
    s_par: float = 1.0
    s_perp: float = 1.0
    layers: tuple[int, ...] | None = None
    layer_s_par: tuple[float, ...] | None = None
    tag: str = ""

    def __post_init__(self):
        edit_space(self.space, "space")  # a ValueError naming the valid spaces
        for name in ("s_par", "s_perp"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        EDIT_SPACES[self.space].check_scales(self.s_perp)
        if self.layer_s_par is not None:
            if not EDIT_SPACES[self.space].scaled or not self.layer_s_par or not all(
                    isinstance(v, float) and math.isfinite(v) for v in self.layer_s_par):
                raise ValueError(f"layer_s_par must be a non-empty tuple of finite floats on a scaled space, got "
                                 f"{self.layer_s_par!r} on {self.space!r}; draw one with random_setting(...)")

    @property
    def label(self) -> str:
        layers = "all" if self.layers is None else ",".join(map(str, self.layers))
        if self.layer_s_par is not None:
            return f"{self.space}[{self.tag or 'per-layer'},s_perp={self.s_perp:g},L={layers}]"
        if not EDIT_SPACES[self.space].scaled:
            return f"{self.space}[L={layers}]"
        return f"{self.space}[s_par={self.s_par:g},s_perp={self.s_perp:g},L={layers}]"

    @property
    def is_identity(self) -> bool:
        return (EDIT_SPACES[self.space].scaled and self.s_par == 1.0 and self.s_perp == 1.0
                and (self.layer_s_par is None or all(v == 1.0 for v in self.layer_s_par)))

    def edits(self, s_par=None, s_perp=None) -> list[Edit]:
        """The edits of this setting; ``s_par`` / ``s_perp`` override the scales (e.g. per-row)."""
        sp = self.s_par if s_par is None else s_par
        if s_par is None and self.layer_s_par is not None:
            sp = torch.tensor(self.layer_s_par, dtype=torch.float64)
        sq = self.s_perp if s_perp is None else s_perp
        return edits_for_space(self.space, sp, sq, self.layers)


__all__ = ["Setting"]
