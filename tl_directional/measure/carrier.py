"""The MLP carrier blocks' parallel share per layer (METHOD.md sec. 4, "MLP carrier"): how much
of the carrier's energy each carrier edit would act on as "parallel".

Per layer, over the counted tokens, summed over the carrier blocks ``g``:

* ``carrier_input_par_share = sum ||P_par(h_g; x)||^2 / sum ||h_g||^2`` (the input site: each
  width-``d_model`` carrier block against the MLP's input ``x``);
* ``carrier_block_par_share = sum ||P_par(y_g; h_g)||^2 / sum ||y_g||^2`` (the block site: each
  contribution ``y_g = W_down[:, I_g] h_g`` against its block);

and the matching ``carrier_*_energy_ratio = sqrt(par / (total - par))`` (the residual table's
``energy_ratio`` form). A random direction in ``d`` dimensions has a parallel share of about
``1 / d``. Read-only hooks, one forward per batch, sums in float64.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from ..core.carrier import carrier_split_energy, check_remainder, n_carrier_blocks
from ..core.geometry import DEFAULT_EPS, check_eps
from ..model.handle import device_of
from ..model.indices import normalize_layers
from ..model.inputs import TokenBatch, iter_batches, prepare_inputs
from ..model.mlp_carrier import carrier_site, down_weight
from ..model.positions import first_token_mask

#: The columns :func:`carrier_table` adds per layer.
CARRIER_COLUMNS = ("carrier_blocks", "carrier_input_par_share", "carrier_input_energy_ratio",
                   "carrier_block_par_share", "carrier_block_energy_ratio")


def carrier_table(model, batches: Iterable[tuple[TokenBatch, Bool[Tensor, "batch pos"]]], *,
                  eps: float = DEFAULT_EPS, remainder: str = "pad", layers=None) -> pd.DataFrame:
    """One row per layer: ``layer``, ``carrier_tokens`` and :data:`CARRIER_COLUMNS`, measured on
    ``batches``, pairs of a :class:`~tl_directional.model.inputs.TokenBatch` and the ``[batch, pos]``
    bool mask of the tokens to count (padding must be False in it).

    Raises :class:`~tl_directional.model.mlp_carrier.CarrierUnavailableError` on a model whose MLP
    has no separable carrier (mixture of experts), and
    :class:`~tl_directional.core.carrier.CarrierShapeError` for ``d_mlp`` not a multiple of
    ``d_model`` with ``remainder="error"``.
    """
    eps = check_eps(eps)
    check_remainder(remainder)
    n_layers, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    chosen = normalize_layers(layers, n_layers, "layers")
    sites = {L: carrier_site(model, L) for L in chosen}
    for cs in sites.values():
        n_carrier_blocks(cs.d_mlp, d, remainder)
    sums = {L: torch.zeros(5, dtype=torch.float64) for L in chosen}  # tokens, in par, in tot, blk par, blk tot
    state: dict = {}
    hooks = []
    for L, cs in sites.items():
        def keep_x(t, hook, L=L, scale=cs.input_scale):  # noqa: ARG001
            state[("x", L)] = t if scale is None else t * scale.to(t.device, t.dtype)
            return t

        def measure(h, hook, L=L):  # noqa: ARG001
            mask = state["mask"]
            x = state.pop(("x", L))[mask]
            hs = h[mask]
            p_in, t_in = carrier_split_energy(hs, reference=x, eps=eps, remainder=remainder)
            p_blk, t_blk = carrier_split_energy(hs, w_down=down_weight(model, L), eps=eps, remainder=remainder)
            sums[L] += torch.stack([torch.tensor(float(hs.shape[0]), dtype=torch.float64)]
                                   + [v.double().sum().cpu() for v in (p_in, t_in, p_blk, t_blk)])
            return h

        hooks += [(cs.input_hook, keep_x), (cs.carrier_hook, measure)]
    device = device_of(model)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for part, mask in batches:
            part = part.to(device)
            state.clear()
            state["mask"] = mask.to(device).bool() & part.attention_mask.bool()
            model(part.tokens, attention_mask=part.attention_mask)
    state.clear()
    rows = []
    for L in chosen:
        n, p_in, t_in, p_blk, t_blk = sums[L].tolist()
        rows.append({"layer": L, "carrier_tokens": int(n),
                     "carrier_blocks": n_carrier_blocks(sites[L].d_mlp, d, remainder),
                     "carrier_input_par_share": _share(p_in, t_in),
                     "carrier_input_energy_ratio": _ratio(p_in, t_in),
                     "carrier_block_par_share": _share(p_blk, t_blk),
                     "carrier_block_energy_ratio": _ratio(p_blk, t_blk)})
    return pd.DataFrame(rows)


def add_carrier_columns(residual: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``residual`` (a :class:`~tl_directional.Profile`'s residual table) with ``table``'s
    :data:`CARRIER_COLUMNS` on its ``mlp`` rows (NaN on the other components' rows)."""
    keyed = table.set_index("layer")[list(CARRIER_COLUMNS)]
    out = residual.copy()
    is_mlp = out["component"] == "mlp"
    for col in CARRIER_COLUMNS:
        out[col] = float("nan")
        out.loc[is_mlp, col] = out.loc[is_mlp, "layer"].map(keyed[col]).astype(float)
    return out


def _share(par: float, total: float) -> float:
    return par / total if total > 0 else float("nan")


def _ratio(par: float, total: float) -> float:
    perp = total - par
    return math.sqrt(par / perp) if perp > 0 else (float("inf") if par > 0 else float("nan"))


def carrier_profile(model, inputs, *, batch_size: int = 8, exclude_first_token: bool = True,
                    eps: float = DEFAULT_EPS, remainder: str = "pad", layers=None) -> pd.DataFrame:
    """:func:`carrier_table` over ``inputs`` (a string, list of strings or token tensor), every real
    token counted except, by default, each sequence's first (BOS: the attention sink, an outlier
    in every statistic, as in :func:`~tl_directional.profile`)."""
    batch = prepare_inputs(model, inputs)

    def parts():
        for part in iter_batches(batch, batch_size):
            mask = part.attention_mask.bool()
            if exclude_first_token:
                mask = mask & ~first_token_mask(part.attention_mask)
            yield part, mask

    return carrier_table(model, parts(), eps=eps, remainder=remainder, layers=layers)


__all__ = ["CARRIER_COLUMNS", "add_carrier_columns", "carrier_profile", "carrier_table"]
