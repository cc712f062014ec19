"""The fused kernels and block histogram give the same profile tables as the unfused computation,
on tiny models in float64 (the kernels alone: tests/unit/test_kernels.py, which holds the copy of
the old summary that the reference below uses). The two paths agree to rounding (1e-12).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_directional as tld
from tests.unit.test_kernels import _OldSummary
from tl_directional.core.geometry import decompose
from tl_directional.measure import EXCLUSIVE_METRICS, RESIDUAL_METRICS, VALUE_METRICS
from tl_directional.model.sites import resolve_sites
from tl_directional.model.weights import attention_output_weights

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
]


# -- the old computation (reference) ------------------------------------------------------------


@torch.no_grad()
def _old_tables(model, cache, mask, eps=1e-12):
    """Residual and value tables, the old way, as {column: array} per (layer, unit) / head."""
    sites = resolve_sites(model, warn=False)
    comps = sites.components
    res = _OldSummary(sites.n_layers * len(comps), RESIDUAL_METRICS)
    val = _OldSummary(sites.n_layers * sites.n_heads, VALUE_METRICS)
    exc = _OldSummary(sites.n_layers * sites.n_heads, EXCLUSIVE_METRICS)
    for L in range(sites.n_layers):
        for i, c in enumerate(comps):
            u = sites.units[c][L]
            upd, ref = cache[u.update_hook], cache[u.reference_hook]
            if u.update_is_difference:
                upd = upd - ref
            d = decompose(upd[mask], ref[mask], eps)
            grp = torch.full((d.alpha.shape[0],), i * sites.n_layers + L)
            r, x = ref[mask].double(), upd[mask].double()
            # the layer-drop cosine columns, directly: 1 - cos(r, r + u), rho = beta / |1 + alpha|
            drop = 1 - torch.nn.functional.cosine_similarity(r, r + x, dim=-1)
            rho = d.perp_sq.sqrt() / r.norm(dim=-1) / (1 + d.alpha).abs()
            res.update(grp, {"par_frac": d.par_frac, "par_perp_ratio": d.par_perp_ratio,
                             "alpha": d.alpha, "rel_update": d.rel_update,
                             "drop_rho": rho, "drop_cos_distance": drop},
                       degenerate=d.degenerate, par_sq=d.par_sq, perp_sq=d.perp_sq)
        vs = sites.value[L]
        v = cache[vs.v_hook]
        gs = sites.n_heads // sites.n_kv_heads
        v = v.repeat_interleave(gs, dim=2) if gs > 1 else v
        diag = cache[vs.pattern_hook].diagonal(dim1=-2, dim2=-1).transpose(1, 2)
        o, vt, a_tt, x = cache[vs.z_hook][mask], v[mask], diag[mask], cache[vs.resid_hook][mask]
        full = decompose(o, vt, eps)
        excl = decompose(o - a_tt.unsqueeze(-1) * vt, vt, eps)
        W_O, _ = attention_output_weights(model, L)
        wx = torch.einsum("nd,hed->nhe", x, W_O)
        x_sq = (x * x).sum(-1)
        ok = (x_sq > eps).unsqueeze(-1)
        safe = torch.where(x_sq > eps, x_sq, torch.ones_like(x_sq)).unsqueeze(-1)
        alpha_head = torch.where(ok, (o * wx).sum(-1) / safe, 0.0)
        phi = torch.where(ok, (vt * wx).sum(-1) / safe, 0.0)
        grp = (L * sites.n_heads + torch.arange(sites.n_heads)).expand(o.shape[0], -1).reshape(-1)
        val.update(grp, {"beta": full.alpha, "A_tt": a_tt, "gamma": excl.alpha,
                         "par_frac_full": full.par_frac, "par_perp_ratio_full": full.par_perp_ratio,
                         "phi": phi, "alpha_head": alpha_head, "self_term": a_tt * phi,
                         "cross_term": alpha_head - a_tt * phi},
                   degenerate=full.degenerate, par_sq=full.par_sq, perp_sq=full.perp_sq)
        exc.update(grp, {"par_frac_exclusive": excl.par_frac,
                         "par_perp_ratio_exclusive": excl.par_perp_ratio},
                   degenerate=excl.degenerate, par_sq=excl.par_sq, perp_sq=excl.perp_sq)
    return res.table(), val.table(), exc.table()


def _assert_close(frame: pd.DataFrame, cols: dict, rename=None, skip=()):
    for k, ref in cols.items():
        if k in skip:
            continue
        name = (rename or {}).get(k, k)
        got = frame[name].to_numpy(dtype=np.float64)
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-12, atol=1e-12, equal_nan=True,
                                   err_msg=name)


def _float64(model):
    return model.to(torch.float64)


@pytest.fixture(scope="module")
def models64(tiny_model):
    out = {f: _float64(tiny_model(f, fresh=True)) for f in ("llama", "neox")}
    out["default"] = _float64(tld.load_model("default"))
    return out


# -- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "llama", "neox"])
def test_profile_tables_equal_the_unfused_computation_in_float64(models64, name):
    model = models64[name]
    batch = tld.prepare_inputs(model, TEXTS)  # padded: the mask path is exercised
    assert not bool(batch.attention_mask.bool().all())
    mask = batch.attention_mask.bool()
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    res, val, exc = _old_tables(model, cache, mask)
    # every token: the copied old computation has no first-token rule (tested in test_habits)
    streamed = tld.profile(model, batch.tokens, attention_mask=batch.attention_mask, batch_size=2,
                           progress=False, exclude_first_token=False, drop_cosine=True)
    # profile stopped its forwards after the last block and left no hook behind
    assert all(not getattr(hp, "fwd_hooks", []) for hp in model.hook_dict.values())
    cached = tld.Profile.from_cache(model, cache, attention_mask=batch.attention_mask,
                                    exclude_first_token=False, drop_cosine=True)
    for prof in (streamed, cached):
        _assert_close(prof.residual, res)
        _assert_close(prof.value, val, rename={"energy_ratio": "energy_ratio_full"})
        _assert_close(prof.value, exc, rename={"energy_ratio": "energy_ratio_exclusive",
                                               "degenerate": "degenerate_exclusive"}, skip=("count",))
        assert prof.metadata["tokens_seen"] == int(mask.sum())
