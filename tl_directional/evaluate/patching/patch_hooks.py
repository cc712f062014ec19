"""The hook functions of directional activation patching (METHOD.md sec. 5): one patched run, or
several stacked along the batch, each replacing a unit's update (or one head's ``hook_z``) in the
corrupted run by its clean value's parallel, perpendicular or full part against the corrupted
run's live reference. :mod:`tl_directional.evaluate.patching.patching` plans the runs and reads the metric.
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from ...core.geometry import patch_components
from ...model.sites import kv_head_index


def patch_against(reference, layer: int, source: Tensor, target: Tensor, stream: Tensor, which: str,
                  eps: float) -> Tensor:
    """METHOD.md sec. 5's patch of ``target`` (corrupted) by ``source`` (clean): against ``stream``
    (the corrupted run's live reference; bit for bit
    :func:`~tl_directional.core.geometry.patch_components`) when ``reference`` is None or the
    stream, else against a resolved :class:`~tl_directional.model.reference.Reference` at
    ``layer``: ``par`` gives ``target + P (source - target)`` (``P source + (I - P) target``),
    ``perp`` gives ``source - P (source - target)``, ``full`` gives ``source``; in ``target``'s dtype."""
    if reference is None or reference.is_stream:
        return patch_components(source, target, stream, which, eps)
    if which == "full":
        return source.to(target.dtype)
    par = reference.parallel(source - target.to(source.dtype), None, layer, eps)
    new = target.to(par.dtype) + par if which == "par" else source.to(par.dtype) - par
    return new.to(target.dtype)


def integer_columns(table: pd.DataFrame, columns) -> pd.DataFrame:
    """Index columns as integers (pandas ``Int64``, so rows without a head or position
    hold ``<NA>`` instead of turning the column into floats)."""
    for c in columns:
        if c in table:
            table[c] = table[c].astype("Int64")
    return table


def patch_residual_hooks(unit, clean_update: Tensor, which: str, pos_mask: Tensor | None, eps: float):
    """Hooks patching the unit's update in the corrupted run (reference read live)."""
    state: dict = {}

    def ref_hook(t, hook):  # noqa: ARG001
        state["ref"] = t
        return t

    def upd_hook(t, hook):  # noqa: ARG001
        ref = state["ref"]
        corrupted = t - ref if unit.update_is_difference else t
        new = patch_components(clean_update.to(t.device), corrupted, ref, which, eps)
        if pos_mask is not None:
            new = torch.where(pos_mask.unsqueeze(-1), new, corrupted)
        return new + ref if unit.update_is_difference else new

    return [(unit.reference_hook, ref_hook), (unit.update_hook, upd_hook)]


def patch_value_hooks(vs, n_heads: int, head: int, clean_z: Tensor, which: str, pos_mask: Tensor | None, eps: float):
    """Hooks patching one head's ``hook_z`` output against its own (corrupted) value."""
    state: dict = {}

    def v_hook(t, hook):  # noqa: ARG001
        state["v"] = t
        return t

    def z_hook(z, hook):  # noqa: ARG001
        v = state["v"]
        v_h = v[:, :, kv_head_index(head, n_heads, v.shape[2])]
        new_h = patch_components(clean_z[:, :, head].to(z.device), z[:, :, head], v_h, which, eps)
        if pos_mask is not None:
            new_h = torch.where(pos_mask.unsqueeze(-1), new_h, z[:, :, head])
        out = z.clone()
        out[:, :, head] = new_h
        return out

    return [(vs.v_hook, v_hook), (vs.z_hook, z_hook)]


class PatchVariant:
    """One patched run: which part, at which position (None: all) and head (value space)."""

    __slots__ = ("which", "pos", "head", "value")

    def __init__(self, which: str, pos: int | None, head: int | None):
        self.which, self.pos, self.head = which, pos, head
        self.value: float | None = None


def masked(new: Tensor, old: Tensor, pos: int | None) -> Tensor:
    """``new`` at position ``pos`` (every position when None), ``old`` elsewhere."""
    if pos is None:
        return new
    out = old.clone()
    out[:, pos] = new[:, pos]
    return out


def stacked_residual_hooks(unit, clean_update: Tensor, chunk: list[PatchVariant], b: int, eps: float,
                           reference=None):
    """Hooks patching a residual unit in a forward of ``len(chunk)`` stacked copies of the
    corrupted batch (``b`` rows each): copy ``i`` gets ``chunk[i]``'s patch (reference read live,
    or a resolved non-stream ``reference``, see :func:`patch_against`)."""
    state: dict = {}

    def ref_hook(t, hook):  # noqa: ARG001
        state["ref"] = t
        return t

    def upd_hook(t, hook):  # noqa: ARG001
        ref = state["ref"]
        corrupted = t - ref if unit.update_is_difference else t
        src = clean_update.to(t.device)
        out = corrupted.clone()
        for i, v in enumerate(chunk):
            rows = slice(i * b, (i + 1) * b)
            new = patch_against(reference, unit.layer, src, corrupted[rows], ref[rows], v.which, eps)
            if v.pos is None:
                out[rows] = new
            else:
                out[rows, v.pos] = new[:, v.pos]
        return out + ref if unit.update_is_difference else out

    return [(unit.reference_hook, ref_hook), (unit.update_hook, upd_hook)]


def stacked_value_hooks(vs, n_heads: int, clean_z: Tensor, chunk: list[PatchVariant], b: int, eps: float):
    """Hooks patching one head's ``hook_z`` per stacked copy (``chunk[i].head``)."""
    state: dict = {}

    def v_hook(t, hook):  # noqa: ARG001
        state["v"] = t
        return t

    def z_hook(z, hook):  # noqa: ARG001
        v = state["v"]
        src = clean_z.to(z.device)
        out = z.clone()
        for i, var in enumerate(chunk):
            rows = slice(i * b, (i + 1) * b)
            h = var.head
            v_h = v[rows, :, kv_head_index(h, n_heads, v.shape[2])]
            new_h = patch_components(src[:, :, h], z[rows, :, h], v_h, var.which, eps)
            if var.pos is None:
                out[rows, :, h] = new_h
            else:
                out[rows, var.pos, h] = new_h[:, var.pos]
        return out

    return [(vs.v_hook, v_hook), (vs.z_hook, z_hook)]


def stacked_kv_hooks(name: str, clean: Tensor, chunk: list[PatchVariant], b: int, eps: float):
    """Hooks patching one key/value head (``chunk[i].head``) of ``attn.hook_k`` / ``hook_v``
    (``[batch, pos, n_kv_heads, d_head]``) per stacked copy, against the corrupted vector itself."""

    def hook(t, hook):  # noqa: ARG001
        src = clean.to(t.device)
        out = t.clone()
        for i, var in enumerate(chunk):
            rows, g = slice(i * b, (i + 1) * b), var.head
            new = patch_components(src[:, :, g], t[rows, :, g], t[rows, :, g], var.which, eps)
            if var.pos is None:
                out[rows, :, g] = new
            else:
                out[rows, var.pos, g] = new[:, var.pos]
        return out

    return [(name, hook)]


__all__ = ["PatchVariant", "integer_columns", "masked", "patch_against", "patch_residual_hooks", "patch_value_hooks", "stacked_kv_hooks", "stacked_residual_hooks", "stacked_value_hooks"]
