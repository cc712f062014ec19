"""profile(value_reference=...): each head's output ``z_h`` (``d_head``) split against a value-space
reference, on tiny float64 GPT-2, Llama-GQA and Gemma-3 models.

* the ``*_ref`` columns equal a projection written here from ``run_with_cache``'s ``attn.hook_z``
  and ``torch.linalg`` (no library code): a direction, a per-layer set, a 2-dimensional subspace;
* without it the value table is exactly today's; with it the old columns are unchanged;
* ``Profile.from_cache`` gives the same columns; bad references are one error naming the argument.
"""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld

GEN = torch.Generator().manual_seed(19)
TOKENS = torch.randint(1, 500, (2, 6), generator=GEN)
REF_COLUMNS = {"value_reference", "value_random_energy_share", "energy_ratio_ref", "degenerate_ref"}


def _projection(z: torch.Tensor, ref: torch.Tensor, kind: str, layer: int):
    """``(beta [n, heads] or None, par_frac [n, heads], energy ratio [heads])`` of ``z`` ``[n, heads,
    d_head]`` against the reference, in float64."""
    if kind == "subspace":
        q, _ = torch.linalg.qr(ref.double().T)  # [d_head, k], orthonormal columns spanning the rows
        par = z @ q @ q.T
        beta = None
    else:
        r = (ref[layer] if kind == "per_layer" else ref).double()
        beta = z @ r / (r @ r)
        par = beta.unsqueeze(-1) * r
    perp = z - par
    par_frac = torch.linalg.vector_norm(par, dim=-1) / torch.linalg.vector_norm(z, dim=-1)
    energy = ((par * par).sum((0, 2)) / (perp * perp).sum((0, 2))).sqrt()
    return beta, par_frac, energy


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
@pytest.mark.parametrize("kind", ["direction", "per_layer", "subspace"])
def test_value_reference_columns_equal_a_projection_written_here(float64_model, family, kind):
    model = float64_model(family)
    n_layers, n_heads, d_head = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    g = torch.Generator().manual_seed(7)
    ref = {"direction": torch.randn(d_head, generator=g), "per_layer": torch.randn(n_layers, d_head, generator=g),
           "subspace": torch.randn(2, d_head, generator=g)}[kind].double()
    per_layer = {"per_layer": True, "subspace": False}.get(kind)
    plain = tld.profile(model, TOKENS, progress=False)
    p = tld.profile(model, TOKENS, progress=False, value_reference=ref, value_per_layer=per_layer)
    old = list(plain.value.columns)
    assert p.value[old].equals(plain.value) and p.residual.equals(plain.residual)  # nothing else moves
    assert p.value["value_random_energy_share"].eq((2 if kind == "subspace" else 1) / d_head).all()
    assert p.metadata["value_reference"] == ("subspace(k=2)" if kind == "subspace" else kind)
    _, cache = model.run_with_cache(TOKENS)
    for L in range(n_layers):
        # the profile's default drops each row's first token (the attention sink)
        z = cache[f"blocks.{L}.attn.hook_z"][:, 1:].double().reshape(-1, n_heads, d_head)
        beta, par_frac, energy = _projection(z, ref, kind, L)
        rows = p.value[p.value.layer == L].sort_values("head")
        got = torch.tensor(rows["par_frac_ref_median"].to_numpy())
        torch.testing.assert_close(got, par_frac.quantile(0.5, dim=0), atol=1e-12, rtol=0)
        torch.testing.assert_close(torch.tensor(rows["energy_ratio_ref"].to_numpy()), energy, atol=1e-12, rtol=0)
        if beta is None:  # a subspace has no single scale
            assert rows["beta_ref_mean"].isna().all()
        else:
            torch.testing.assert_close(torch.tensor(rows["beta_ref_mean"].to_numpy()), beta.mean(0),
                                       atol=1e-12, rtol=0)
    cached = tld.Profile.from_cache(model, cache, value_reference=ref, value_per_layer=per_layer)
    new = [c for c in p.value.columns if c.endswith("_ref") or "_ref_" in c or c in REF_COLUMNS]
    assert len(new) > 20
    assert cached.value[new].equals(p.value[new])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"value_reference": torch.ones(32)}, "value_reference has width 32 but the space it splits has width 8"),
        ({"value_reference": torch.zeros(8)}, "value_reference has zero row(s) [0]"),
        ({"value_reference": torch.ones(8), "components": ("attn", "mlp")}, "leaves 'value' out"),
        ({"value_reference": "input"}, "is what the value table measures already"),
        ({"value_per_layer": True}, "value_per_layer=True is given without value_reference"),
    ],
)
def test_bad_value_references_name_the_argument(tiny_model, kwargs, needle):
    model = tiny_model("gpt2")
    assert model.cfg.d_head == 8 and model.cfg.d_model == 32
    with pytest.raises(tld.SubspaceError) as info:
        tld.profile(model, TOKENS, progress=False, **kwargs)
    assert needle in str(info.value)
