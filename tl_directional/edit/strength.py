"""The applied strength of an edit: how much of each edited update it changes, per token and
edited layer (the paper's audit of its edits, its appendix table ``tab:applied-no-para-strength``).

For one edited layer and one token, ``y`` is the branch output the layer would produce from its
input in the edited forward pass *without* the edit at that layer, and ``y~`` the output it
produces with it: what the edit removes there, not counting upstream edits twice. Attention:
``y = sum_h W_O[h]^T z_h + b_O`` (value-space and pattern edits change ``z``, and the change is
mapped through ``W_O``; on sandwich-norm models this is before the post-attention norm), or, for a
residual-space edit, the update at the hook it edits (``hook_attn_out``). MLP: the update at
``hook_mlp_out``. One forward pass with the edit, read-only capture hooks around the edit's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from ..model.sites import check_component, resolve_sites
from ..model.weights import attention_output_weights
from .apply import edit_hooks
from .base import Edit

#: an update whose squared norm is at most this has no ratio (counted in ``degenerate``)
STRENGTH_EPS = 1e-12


@dataclass(frozen=True)
class EditStrength:
    """Per token and edited layer, in float64 (``[batch, n_edited, pos]``; NaN where the update
    ``y`` has squared norm ``<= STRENGTH_EPS``): ``norm = ||y~ - y|| / ||y||``,
    ``energy = ||y~ - y||^2 / ||y||^2``, ``retained = ||y~|| / ||y||``, and the squared norms
    ``diff_sq = ||y~ - y||^2``, ``base_sq = ||y||^2`` (no NaN) for ratios of sums. ``layers``:
    the edited layers, in order; ``component``: ``"attn"`` or ``"mlp"``; ``site``: the hook or
    ``"W_O z"`` where ``y`` was read, per edited layer."""

    component: str
    layers: list[int]
    site: list[str]
    norm: Float[Tensor, "batch layer pos"]
    energy: Float[Tensor, "batch layer pos"]
    retained: Float[Tensor, "batch layer pos"]
    diff_sq: Float[Tensor, "batch layer pos"]
    base_sq: Float[Tensor, "batch layer pos"]

    @property
    def degenerate(self) -> Tensor:
        """``[batch, layer, pos]`` bool: updates with no ratio (``||y||^2 <= STRENGTH_EPS``)."""
        return torch.isnan(self.norm)

    def mean(self) -> dict[str, float]:
        """Token-weighted means over every edited layer and position that has a ratio, and the
        ratio of sums ``sqrt(sum diff_sq / sum base_sq)`` (``pooled_norm``)."""
        ok = ~self.degenerate
        out = {k: float(getattr(self, k)[ok].mean()) for k in ("norm", "energy", "retained")}
        out["pooled_norm"] = float((self.diff_sq.sum() / self.base_sq.sum()).sqrt())
        out["count"] = int(ok.sum())
        return out


def _capture(store: dict, key):
    def hook(t, hook):  # noqa: ARG001
        store[key] = t.detach()

    return hook


def _layer_sites(sites, component: str, names: set[str]) -> tuple[dict[int, str], set[str]]:
    """``{layer: kind}`` of the layers the edit touches (``"update"``, ``"z"`` or ``"pattern"``;
    a layer with both ``z`` and ``pattern`` is ``"pattern"``) and the hook names counted."""
    kinds: dict[int, str] = {}
    used: set[str] = set()
    for L in range(sites.n_layers):
        unit = sites.unit(component, L)
        hit = {"update": unit.update_hook in names}
        if component == "attn":
            vs = sites.value[L]
            hit |= {"z": vs.z_hook in names, "pattern": vs.pattern_hook in names}
            if hit["update"] and (hit["z"] or hit["pattern"]):
                raise ValueError(
                    f"the edit changes layer {L}'s attention both in residual space ({unit.update_hook}) "
                    f"and inside the head ({vs.z_hook} / {vs.pattern_hook}); measure one space at a time "
                    "(pass the edits of one space)")
        if hit.get("pattern"):
            kinds[L] = "pattern"
        elif hit.get("z"):
            kinds[L] = "z"
        elif hit["update"]:
            kinds[L] = "update"
        used |= {n for n, h in hit.items() if h}
    return kinds, used


def edit_strength(model, tokens: Tensor, *edits: Edit, component: str = "attn",
                  attention_mask: Tensor | None = None) -> EditStrength:
    """The applied strength of ``edits`` on ``component``'s branch output, per token and edited
    layer (module docstring), from one forward pass of ``tokens`` (``[batch, pos]``) with them.

    Args:
        model: a TransformerLens model (bridge or ``HookedTransformer``).
        tokens: ``[batch, pos]`` token ids.
        *edits: the edits, applied together as :func:`~tl_directional.edit.apply.edit_hooks` does.
        component: ``"attn"`` (residual, value-space and pattern edits) or ``"mlp"`` (residual).
        attention_mask: ``[batch, pos]`` (1 = real token), passed to the forward pass.

    Raises:
        ValueError: ``component`` is not ``"attn"`` or ``"mlp"``; the edits touch no layer of that
            branch; or they edit one layer's attention in two spaces at once.
    """
    if component not in ("attn", "mlp"):
        raise ValueError(f"component must be 'attn' or 'mlp' (a branch whose output an edit changes), got {component!r}")
    sites = resolve_sites(model, warn=False)
    check_component(component, sites)
    hooks = edit_hooks(model, *edits)
    kinds, _ = _layer_sites(sites, component, {name for name, _ in hooks})
    if not kinds:
        raise ValueError(
            f"the edits {list(edits)!r} change no {component} branch output (no hook at its update, "
            "hook_z or hook_pattern); pass an edit of that branch, or component='attn' / 'mlp' to match")
    pre: dict = {}
    post: dict = {}
    before: list = []
    after: list = []
    for L, kind in kinds.items():
        unit, vs = sites.unit(component, L), sites.value[L] if component == "attn" else None
        if kind == "update":
            before.append((unit.update_hook, _capture(pre, L)))
            after.append((unit.update_hook, _capture(post, L)))
        else:  # the edited z, and the unedited one (from the unedited pattern when that is edited)
            after.append((vs.z_hook, _capture(post, L)))
            if kind == "z":
                before.append((vs.z_hook, _capture(pre, L)))
            else:
                before.append((vs.pattern_hook, _capture(pre, ("A", L))))
                after.append((vs.v_hook, _capture(pre, ("v", L))))
    with model.hooks(fwd_hooks=before + hooks + after):
        model(tokens, attention_mask=attention_mask) if attention_mask is not None else model(tokens)
    return _strength(model, sites, component, kinds, pre, post)


def _strength(model, sites, component, kinds, pre, post) -> EditStrength:
    f64 = torch.float64
    cols: dict[str, list] = {k: [] for k in ("norm", "energy", "retained", "diff_sq", "base_sq")}
    site = []
    for L, kind in kinds.items():
        if kind == "update":
            y, y_new = pre[L].to(f64), post[L].to(f64)
            site.append(sites.unit(component, L).update_hook)
        else:
            z_new = post[L].to(f64)
            if kind == "z":
                z = pre[L].to(f64)
            else:  # z = A v with the unedited row, every key (no KV cache here)
                v = sites.expand_kv(pre[("v", L)]).to(f64)
                z = torch.einsum("bhqk,bkhd->bqhd", pre[("A", L)].to(f64), v)
            w_o, b_o = attention_output_weights(model, L)
            w_o = w_o.detach().to(f64)
            y = torch.einsum("bqhd,hdm->bqm", z, w_o)
            if b_o is not None:
                y = y + b_o.detach().to(f64)
            y_new = y + torch.einsum("bqhd,hdm->bqm", z_new - z, w_o)
            site.append("W_O z")
        base_sq = y.square().sum(-1)
        diff_sq = (y_new - y).square().sum(-1)
        ok = base_sq > STRENGTH_EPS
        den = torch.where(ok, base_sq, torch.ones_like(base_sq))
        nan = torch.full_like(base_sq, float("nan"))
        cols["energy"].append(torch.where(ok, diff_sq / den, nan))
        cols["norm"].append(torch.where(ok, (diff_sq / den).sqrt(), nan))
        cols["retained"].append(torch.where(ok, (y_new.square().sum(-1) / den).sqrt(), nan))
        cols["diff_sq"].append(diff_sq)
        cols["base_sq"].append(base_sq)
    stacked = {k: torch.stack(v, dim=1) for k, v in cols.items()}
    return EditStrength(component=component, layers=list(kinds), site=site, **stacked)


__all__ = ["STRENGTH_EPS", "EditStrength", "edit_strength"]
