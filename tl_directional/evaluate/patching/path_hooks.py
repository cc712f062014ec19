"""The hooks of one stacked path-patching forward (see :mod:`~tl_directional.evaluate.patching.path_patching`).

Rows: the patched copies of the corrupted batch, then the *shadow* copies whose stream holds
``stream + delta`` at each receiver's block; a receiver copies its own head's queries, keys or
values (or its MLP input) from its shadow. A ``resid`` / ``logits`` receiver adds ``delta`` to its
own copy's stream.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from .path_nodes import Receiver, hook_names


class PathRun:
    """One patched copy of the corrupted batch: its receivers, its part, its shadow."""

    __slots__ = ("receivers", "part", "shadow", "value")

    def __init__(self, receivers: tuple[Receiver, ...], part: str):
        self.receivers, self.part = receivers, part
        self.shadow = 0
        self.value: np.ndarray | None = None


class _Chunk:
    """The rows of one stacked forward (``b`` per copy: the ``runs``, then the ``shadows``) and the
    hook makers that write them."""

    def __init__(self, runs: list[PathRun], shadows: list[tuple[str, int | None]], deltas, corr, b: int,
                 captured: dict | None):
        self.runs, self.shadows, self.deltas, self.corr, self.captured = runs, shadows, deltas, corr, captured
        self.k = len(runs)
        self.rows = [slice(i * b, (i + 1) * b) for i in range(self.k + len(shadows))]

    def base(self, t: Tensor, name: str, j: int) -> Tensor:
        owner = self.shadows[j][1]
        return self.corr[name] if owner is None else t[self.rows[owner]]

    def set_shadow(self, name: str, add: bool, wanted: set[int]):
        """Shadow ``j``'s rows of hook ``name``: its base stream, plus its part's delta if ``add``."""
        rows, k, shadows, deltas = self.rows, self.k, self.shadows, self.deltas

        def hook(t, hook):  # noqa: ARG001 - TL hook signature
            out = t.clone()
            for j in wanted:
                new = self.base(t, name, j)
                out[rows[k + j]] = new + deltas[shadows[j][0]] if add else new
            return out

        return hook

    def add_delta(self, targets: list[int]):
        """Run ``i``'s rows plus its part's delta (a resid / logits receiver)."""
        rows, runs, deltas = self.rows, self.runs, self.deltas

        def hook(t, hook):  # noqa: ARG001
            out = t.clone()
            for i in targets:
                out[rows[i]] = t[rows[i]] + deltas[runs[i].part]
            return out

        return hook

    def copy_heads(self, items: list[tuple[int, Receiver]]):
        """Each receiver's head (or MLP input) copied from its run's shadow."""
        rows, k, runs, captured = self.rows, self.k, self.runs, self.captured

        def hook(t, hook):  # noqa: ARG001
            out = t.clone()
            for i, rec in items:
                sl = (rows[i], slice(None)) + ((rec.head,) if rec.head is not None else ())
                out[sl] = t[(rows[k + runs[i].shadow], slice(None)) + sl[2:]]
                if captured is not None:
                    captured[(i, rec)] = out[sl].detach().clone()
            return out

        return hook

    def keep_scale(self, items: list[tuple[int, Receiver]]):
        """The final norm's scale of each logits receiver's rows kept at the corrupted run's."""
        rows, corr = self.rows, self.corr

        def hook(t, hook):  # noqa: ARG001
            out = t.clone()
            for i, _ in items:
                out[rows[i]] = corr["ln_final.hook_scale"]
            return out

        return hook


def chunk_hooks(
    sites,
    hook_dict,
    runs: list[PathRun],
    shadows: list[tuple[str, int | None]],
    deltas,
    corr,
    b: int,
    freeze: bool,
    captured: dict | None,
):
    """Hooks of one stacked forward: real copies ``runs`` (``b`` rows each) then ``shadows``
    (``(part, owner)``: owner None means "the corrupted stream", else that run's live stream)."""
    chunk = _Chunk(runs, shadows, deltas, corr, b, captured)
    by_layer: dict[int, list[tuple[int, Receiver]]] = {}
    for i, run in enumerate(runs):
        for rec in run.receivers:
            by_layer.setdefault(rec.layer, []).append((i, rec))
    hooks: list = []
    for L, items in sorted(by_layer.items()):
        hooks += _layer_hooks(chunk, sites, hook_names(sites, L, hook_dict), items, freeze)
    return hooks


def _layer_hooks(chunk: _Chunk, sites, names: dict[str, str], items: list[tuple[int, Receiver]],
                 freeze: bool) -> list:
    """The hooks of one layer's receivers ``items`` (``(run index, receiver)``), in firing order."""
    runs = chunk.runs
    kinds = {rec.kind for _, rec in items}
    pre_shadows = {
        runs[i].shadow
        for i, rec in items
        if rec.kind in ("q", "k", "v") or (rec.kind == "mlp" and sites.arch != "sequential")
    }
    mid_shadows = {
        runs[i].shadow for i, rec in items if rec.kind == "mlp" and sites.arch == "sequential"
    }
    resid_adds = [i for i, rec in items if rec.kind == "resid"]
    hooks: list = []
    # the shadow first: a receiver reads the live stream before a resid receiver's add
    if pre_shadows:
        hooks.append((names["resid_pre"], chunk.set_shadow(names["resid_pre"], True, pre_shadows)))
        if freeze:
            hooks.append((names["ln1_scale"], chunk.set_shadow(names["ln1_scale"], False, pre_shadows)))
    if resid_adds:
        hooks.append((names["resid_pre"], chunk.add_delta(resid_adds)))
    for kind in ("q", "k", "v"):
        if kind in kinds:
            hooks.append((names[kind], chunk.copy_heads([(i, r) for i, r in items if r.kind == kind])))
    if "mlp" in kinds:
        if mid_shadows:
            hooks.append((names["resid_mid"], chunk.set_shadow(names["resid_mid"], True, mid_shadows)))
        if freeze:
            shadows_mlp = mid_shadows or pre_shadows
            hooks.append((names["ln2_scale"], chunk.set_shadow(names["ln2_scale"], False, shadows_mlp)))
        hooks.append((names["mlp_in"], chunk.copy_heads([(i, r) for i, r in items if r.kind == "mlp"])))
    if "logits" in kinds:
        logits = [(i, r) for i, r in items if r.kind == "logits"]
        hooks.append((sites.resid_post_hook(sites.n_layers - 1), chunk.add_delta([i for i, _ in logits])))
        if freeze:
            hooks.append(("ln_final.hook_scale", chunk.keep_scale(logits)))
    return hooks


__all__ = ["PathRun", "chunk_hooks"]
