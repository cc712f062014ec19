"""Protocol sec. 16.2 and 16.5: the residual-space settings of the sites study's later runs, run
by the claims study's runner (``python -m studies run claims --settings residatlas`` /
``--settings residrandom``; data ``residatlas_<model>.*`` / ``residrandom_<model>.*``, the claims
layout: one record per text, window and setting)."""

from __future__ import annotations

#: sec. 11.4's random draws, which sec. 16.5 repeats in residual space: (distribution, seed)
DRAWS = tuple((dist, seed) for dist in ("uniform", "gaussian") for seed in (0, 1, 2))
COMPONENTS = ("mlp", "attn")


def atlas_label(component: str, layer: int) -> str:
    return f"resid-{component} L{layer} s_par=0"


def random_label(component: str, draw: str) -> str:
    """``draw``: ``"fixed s_par=0.5"`` or ``"<dist> seed=<k>"`` (sec. 11.4's labels)."""
    return f"resid-{component} {draw}"


def resid_atlas_settings(model, sites):
    """Sec. 16.2: residual parallel removal of one component in one layer at a time, every
    position (``ResidualScale(component, s_par=0, layers=[L])``)."""
    import tl_directional as tld

    def one(component, layer):
        return lambda: tld.apply_edits(model, tld.ResidualScale(component, s_par=0.0, layers=[layer]))

    return [(atlas_label(c, L), "residatlas", f"resid-{c}", 0.0, "1", one(c, L))
            for c in COMPONENTS for L in range(sites.n_layers)]


def resid_random_settings(model, sites):
    """Sec. 16.5: sec. 11.4's random per-layer draws of ``s_par`` (every layer but the first,
    ``s_perp = 1``, every position) applied to residual attention and MLP parallel parts, and
    fixed half retention on the same layers."""
    import torch

    import tl_directional as tld

    skip0 = list(range(1, sites.n_layers))

    def edit(component, s_par):
        return lambda: tld.apply_edits(model, tld.ResidualScale(component, s_par=s_par, layers=skip0))

    out = []
    for c in COMPONENTS:
        out.append((random_label(c, "fixed s_par=0.5"), "residrandom", f"resid-{c}", 0.5, "1", edit(c, 0.5)))
        for dist, seed in DRAWS:
            draw = tld.random_scales(sites.n_layers, dist, seed=seed)
            mean = sum(float(draw[L]) for L in skip0) / len(skip0)
            out.append((random_label(c, f"{dist} seed={seed}"), "residrandom", f"resid-{c}", mean, "1",
                        edit(c, draw.to(torch.float32))))
    return out
