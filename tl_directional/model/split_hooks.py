"""Nested hook points for the split: ``blocks.L.hook_attn_out.hook_par`` / ``.hook_perp``.

Inside :func:`split_hook_points` (or after :func:`attach_split_hook_points`), each
unit's update gets two child hook points, the SAELens way
(``blocks.L.hook_mlp_out.hook_sae_acts_post``), so that ``run_with_cache``,
``run_with_hooks`` and ``transformer_lens.patching`` (``generic_activation_patch``
with ``"attn_out.hook_par"`` or ``"z.hook_par"``) work on the components:

==============================================  =======================================
hook point                                      tensor
==============================================  =======================================
``blocks.L.hook_attn_out.hook_par`` / ``_perp``  attention update split vs its reference
``blocks.L.hook_mlp_out.hook_par`` / ``_perp``   MLP update split vs its reference
``blocks.L.attn.hook_z.hook_par`` / ``_perp``    each head's ``o_t`` split vs its own ``v_t``
``blocks.L.hook_z.hook_par`` / ``_perp``         the same, under the name TL's ``get_act_name``
                                                builds for ``"z.hook_par"`` (fed by the above)
==============================================  =======================================

(On post-LN bridges the residual children hang under ``attn.o.hook_out`` /
``mlp.hook_out``, the sites' update hooks.) The parent's output becomes
``u + (par' - par) + (perp' - perp)``, so with no hook on the children the model
is bit-exactly unchanged. The reference is read live from the stream, as in
the edits (METHOD.md sec. 4).

Order: the split (and the read of its reference) runs last on its hook point, after
every edit, user hook and cache hook, in whatever order they were added, so
``hook_par + hook_perp`` is always the value the parent finally holds.

Patching meaning: replacing ``hook_par`` with a clean run's cached ``hook_par``
(what TL's patching helpers do) puts in the clean run's parallel part,
``P_{r_c} u_c``, split against the *clean* reference, next to the corrupted run's
perpendicular part. :func:`tl_directional.directional_patch` instead puts in
``P_{r_x} u_c``, the clean update split against the *corrupted* reference (METHOD.md
sec. 5). They differ; docs/sweeps.md ("Two meanings of a parallel-only patch")
says when to use which.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ..core.components import check_components
from ..core.geometry import DEFAULT_EPS, check_eps, parallel_part
from .handle import add_hook_point, remove_hook_point
from .indices import normalize_layers
from .lanes import lane_of
from .sites import expand_kv_heads, resolve_sites

#: The updates that can carry split hook points (residual attention / MLP, value space).
SPLIT_COMPONENTS = ("attn", "mlp", "value")


def _hook_point_class():
    from transformer_lens.hook_points import HookPoint

    return HookPoint


@dataclass
class SplitHookPoints:
    """Handle of attached split hook points; call :meth:`remove` to detach them."""

    model: object
    names: list[str] = field(default_factory=list)
    _removers: list = field(default_factory=list)

    def remove(self) -> None:
        for remove in self._removers:  # exactly our permanent hooks (user hooks stay)
            remove()
        for name in self.names:
            remove_hook_point(self.model, name)
        self._removers.clear()
        self.names.clear()


def attach_split_hook_points(model, *, components=("attn", "mlp", "value"), layers=None,
                             eps: float = DEFAULT_EPS) -> SplitHookPoints:
    """Add ``.hook_par`` / ``.hook_perp`` children under each selected update hook."""
    eps = check_eps(eps)
    sites = resolve_sites(model)
    lane = lane_of(model)
    HookPoint = _hook_point_class()
    handle = SplitHookPoints(model)
    components = check_components(components, sites.components + ("value",), allowed=SPLIT_COMPONENTS,
                                  arch=sites.arch)
    try:
        for L in normalize_layers(layers, sites.n_layers):
            for c in components:
                state: dict = {}
                if c == "value":
                    vs = sites.value[L]
                    parent, ref_name = vs.z_hook, vs.v_hook
                else:
                    unit = sites.units[c][L]
                    parent, ref_name = unit.update_hook, unit.reference_hook
                points = {}  # child -> [its hook point, + one under TL's spelling where that differs]
                for child in ("hook_par", "hook_perp"):
                    points[child] = []
                    for name in dict.fromkeys((f"{parent}.{child}", _tl_spelling(sites, parent, L, c, child))):
                        hp = HookPoint()
                        add_hook_point(model, name, hp)
                        handle.names.append(name)
                        points[child].append(hp)
                ref_fn = _store(state)
                split_fn = _split(state, points["hook_par"], points["hook_perp"], value=(c == "value"),
                                  n_heads=sites.n_heads, eps=eps)
                # ours run last on their hook point, after every edit, user and cache hook
                hook_dict = model.hook_dict
                for name, fn in ((ref_name, ref_fn), (parent, split_fn)):
                    handle._removers.append(lane.add_last_hook(hook_dict[name], fn))
    except Exception:
        handle.remove()
        raise
    return handle


def _tl_spelling(sites, parent: str, layer: int, component: str, child: str) -> str:
    """The name ``transformer_lens.patching`` builds with ``get_act_name`` for a value-space
    child: ``"z.hook_par"`` -> ``blocks.L.hook_z.hook_par`` (not ``blocks.L.attn.hook_z...``).
    Registered as a second hook point, fed by the first, so TL's patching helpers find it.
    Residual children already have TL's spelling (``blocks.L.hook_attn_out.hook_par``); on
    post-LN bridges, whose ``hook_attn_out`` is not the update, they get no alias."""
    if component == "value":
        return sites.value_alias_hook(layer, child)
    return f"{parent}.{child}"


def _chain(points, x):
    for hp in points:  # the nested name's hook point, then TL's spelling's
        x = hp(x)
    return x


def _store(state: dict):
    def hook(t, hook):  # noqa: ARG001
        state["ref"] = t
        return t
    return hook


def _split(state: dict, par_points, perp_points, *, value: bool, n_heads: int, eps: float):
    def hook(t, hook):  # noqa: ARG001
        ref = state["ref"]
        if value:  # [batch, pos, n_kv_heads, d_head] -> one value per query head
            ref = expand_kv_heads(ref, n_heads)
        if not any(hp.fwd_hooks or hp.bwd_hooks for hp in (*par_points, *perp_points)):
            return t  # nothing hooked on the children: bit-exactly unchanged
        par = parallel_part(t, ref, eps).to(t.dtype)
        perp = t - par
        # Kept apart because child hooks may edit in place (TL's patch setters do).
        par0, perp0 = par.clone(), perp.clone()
        new_par, new_perp = _chain(par_points, par), _chain(perp_points, perp)
        return t + (new_par - par0) + (new_perp - perp0)
    return hook


@contextmanager
def split_hook_points(model, *, components=("attn", "mlp", "value"), layers=None, eps: float = DEFAULT_EPS):
    """Context manager: nested split hook points exist inside the block, and are
    removed (with only their own hooks) on exit, also on errors."""
    handle = attach_split_hook_points(model, components=components, layers=layers, eps=eps)
    try:
        yield handle
    finally:
        handle.remove()


__all__ = ["SplitHookPoints", "attach_split_hook_points", "split_hook_points"]
