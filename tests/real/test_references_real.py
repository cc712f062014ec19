"""``reference=`` on the real SmolLM2-135M (Llama family, GQA, 30 layers, float32): profile's
per-token parallel share against a 3-subspace, split_logit_attribution's parallel part against a
direction and ResidualScale's removal of a per-layer direction each equal a projection written
here with ``torch.linalg`` on ``run_with_cache`` activations, within float32 round-off; the
default equals a run without the argument exactly. A few tokens. Skipped without the model."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.model.load import catalog, load_model

NAME = "smollm2-135m"


def test_references_on_smollm2():
    if not catalog.is_installed(NAME):
        pytest.skip(f"{NAME}: package not installed; install with `{catalog.REAL_MODELS[NAME].install}`")
    model = load_model(NAME).eval()
    tokens = model.to_tokens("The Eiffel Tower is in the city of")
    d, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, d, generator=g)
    direction = torch.randn(d, generator=g)
    per_layer = torch.randn(n_layers, d, generator=g)
    layers = [0, n_layers - 1]
    names = [f"blocks.{L}.hook_{c}_out" for L in layers for c in ("attn", "mlp")]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    q, _ = torch.linalg.qr(rows.T.double())

    p = tld.profile(model, tokens, progress=False, per_token=True, exclude_first_token=False,
                    components=["attn", "mlp"], reference=rows)
    assert (p.residual.random_energy_share == 3 / d).all()
    tol = roundoff_tolerance(torch.float32, 1.0, d)
    for L in layers:
        for comp in ("attn", "mlp"):
            u = cache[f"blocks.{L}.hook_{comp}_out"][0].double()
            frac = ((u @ q) @ q.T).norm(dim=-1) / u.norm(dim=-1)
            got = p.tokens[(p.tokens.layer == L) & (p.tokens.component == comp)].sort_values("position")
            assert float((torch.as_tensor(got.par_frac.to_numpy().copy()) - frac).abs().max()) <= tol, (L, comp)

    answer = model.to_tokens(" Paris", prepend_bos=False)[0, :1]
    dla = tld.split_logit_attribution(model, tokens, answer, reference=direction)
    default = tld.split_logit_attribution(model, tokens, answer)
    pd.testing.assert_frame_equal(default, tld.split_logit_attribution(model, tokens, answer, reference=None),
                                  check_exact=True)
    for L in layers:
        row = dla[(dla.layer == L) & (dla.unit == "mlp")].iloc[0]
        u = cache[f"blocks.{L}.hook_mlp_out"][0, -1].double()
        r = direction.double()
        share = float(u.dot(r) ** 2 / (u.dot(u) * r.dot(r))).__pow__(0.5)
        assert abs(row.par_frac - share) <= tol, L
        assert abs(row.dla_par + row.dla_perp - row.dla) <= roundoff_tolerance(torch.float32, abs(row.dla) + 1, d)

    L = n_layers - 1
    name = f"blocks.{L}.hook_attn_out"
    store = {}
    edit = tld.ResidualScale("attn", 0.0, layers=[L], reference=per_layer, per_layer=True)
    hooks = tld.edit_hooks(model, edit) + [(name, lambda t, hook: store.__setitem__("out", t.clone()))]
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    u, r = cache[name].double(), per_layer[L].double()
    expected = u - (torch.linalg.vecdot(u, r) / r.dot(r)).unsqueeze(-1) * r
    scale = float(u.norm(dim=-1).max())
    assert float((store["out"].double() - expected).abs().max()) <= roundoff_tolerance(torch.float32, scale, d)
