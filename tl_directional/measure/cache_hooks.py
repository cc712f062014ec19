"""The hooks :meth:`tl_directional.Profile.from_cache` reads: a ``names_filter`` for ``run_with_cache``.

``model.run_with_cache(tokens)`` keeps every hook point's activation (on a small GPT-2 about
30 per layer: q, k, v, scores, pattern, z, the MLP's pre/post activations, norms, ...);
``Profile.from_cache`` reads a handful per layer. ``names_filter=tld.required_hooks(model)``
caches exactly those, and the profile is the same one (tests/integration/test_required_hooks.py
checks it equal to the profile of a full cache and measures the memory saved)::

    names = tld.required_hooks(model, components=("attn", "value"))
    _, cache = model.run_with_cache(tokens, names_filter=names)
    prof = tld.Profile.from_cache(model, cache, components=("attn", "value"))
"""

from __future__ import annotations

from ..core.components import check_components
from ..model.sites import resolve_sites


def required_hooks(model, components=None) -> list[str]:
    """The hook names ``Profile.from_cache(model, cache, components=components)`` reads, in
    forward order per layer, each once; pass them as ``run_with_cache(..., names_filter=...)``.

    Args:
        model: a TL 4 ``TransformerBridge`` or legacy ``HookedTransformer``.
        components: as in :func:`tl_directional.profile` (any of ``"attn"``, ``"mlp"``,
            ``"block"``, ``"value"``; None: all the architecture defines). The same value
            must be passed to ``from_cache``.

    Returns:
        Hook names (``str``): per layer each residual unit's update and reference hooks
        (``hook_attn_out`` / ``hook_resid_pre``, ...) and, with ``"value"``, ``attn.hook_v``,
        ``attn.hook_pattern``, ``attn.hook_z`` and the attention input, plus the attention
        unit's hooks (the value-space factorization check reads the attention alpha).
    """
    sites = resolve_sites(model, warn=False)
    comps = check_components(components, sites.components + ("value",), arch=sites.arch)
    residual = [c for c in comps if c != "value"]
    names = [sites.units["attn"][0].reference_hook]  # from_cache reads batch and length from it
    for L in range(sites.n_layers):
        for comp in residual:
            unit = sites.units[comp][L]
            names += [unit.reference_hook, unit.update_hook]
        if "value" in comps:
            vs, attn = sites.value[L], sites.units["attn"][L]
            names += [vs.resid_hook, vs.v_hook, vs.pattern_hook, vs.z_hook, attn.reference_hook, attn.update_hook]
    return list(dict.fromkeys(names))


__all__ = ["required_hooks"]
