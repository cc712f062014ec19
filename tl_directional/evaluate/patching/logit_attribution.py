"""Split direct logit attribution (METHOD.md sec. 2-3): each head's and each sub-layer's direct
logit attribution split into the part carried by its parallel and its perpendicular component
against the stream it writes into, with the final norm linearised at the run's own scale.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from ...core.errors import renamed_argument
from ...core.geometry import DEFAULT_EPS, check_eps
from ...model.handle import capture, device_of
from ...model.inputs import prepare_inputs, token_ids
from ...model.reference import resolve_reference
from ...model.sites import ModelSites, analysis_sites
from ...model.weights import final_norm_weight
from .cache_input import PatchingInputError, cache_tensor, is_cache
from .patch_hooks import integer_columns


def _final_norm_linear(model, sites: ModelSites, x: Tensor, scale: Tensor) -> Tensor:
    """Apply the final norm *linearised* at the cached scale: centre (LayerNorm) and
    divide by the cached scale, then the norm's weight. Linear in ``x``, so the
    attribution of a sum is the sum of attributions."""
    norm_type = str(getattr(model.cfg, "normalization_type", "LN") or "LN")
    if norm_type.startswith("LN"):
        x = x - x.mean(-1, keepdim=True)
    x = x / scale
    w = final_norm_weight(model)
    return x * w if w is not None else x


#: ``unit=`` values (TransformerLens 4.3's ``direct_logit_attribution`` names, and ``"all"``).
_UNITS = ("all", "component", "head")

_CACHE_HINT = ("model.run_with_cache(tokens) (no names_filter), or a names_filter keeping "
               "ln_final.hook_scale, hook_attn_out, hook_mlp_out, hook_resid_pre / hook_resid_mid and "
               "attn.hook_z of every layer")


def _hook_names(sites: ModelSites) -> list[str]:
    names = ["ln_final.hook_scale"]
    for L in range(sites.n_layers):
        names += [sites.value[L].z_hook, sites.value[L].resid_hook]
        for c in ("attn", "mlp"):
            u = sites.units[c][L]
            names += [u.update_hook, u.reference_hook]
    return names


def _activations(model, sites: ModelSites, inputs, cache) -> tuple[Tensor, Tensor, dict]:
    """``(tokens, attention_mask, {hook: [batch, pos, ...]})``: from a run of ``inputs``, or read
    from ``cache`` (checked: every hook present, finite, of the tokens' batch and positions)."""
    device = device_of(model)
    names = _hook_names(sites)
    if cache is None or inputs is not None:
        if inputs is None:
            raise ValueError("inputs is None and no cache was given; pass the texts / tokens, or cache=")
        if cache is not None and not isinstance(inputs, Tensor):
            # texts would be tokenised and padded here, maybe not as the cached run was: the last
            # real token read could silently be another position
            raise ValueError(f"with cache=, inputs must be None or the [batch, pos] token tensor the cache "
                             f"was run on, got {type(inputs).__name__}; pass model.to_tokens(texts) to both")
        # a cut text would be attributed at its last kept token, not where the answer follows it
        batch = prepare_inputs(model, inputs, too_long=(
            "the answer follows the text's last token, which a cut text would not reach, so nothing is "
            "attributed; pass a shorter text (at most n_ctx tokens, BOS included), or the text's last "
            "n_ctx token ids as a [1, pos] tensor"))
        tokens, am = batch.tokens.to(device), batch.attention_mask.to(device)
    if cache is None:
        _, acts = capture(model, tokens, names, attention_mask=am, clone=True)
        return tokens, am, acts
    if not is_cache(cache):
        raise ValueError(f"cache must be an ActivationCache or a mapping of hook names to tensors, got "
                         f"{type(cache).__name__}; pass the cache of model.run_with_cache(tokens)")
    if inputs is None:  # the cache's own batch and positions, no padding
        try:
            first = cache[names[0]]
        except (KeyError, IndexError, ValueError):
            raise PatchingInputError(f"cache has no {names[0]!r}; cache the run with {_CACHE_HINT}") from None
        tokens = torch.zeros(tuple(first.shape[:2]), dtype=torch.long, device=device)
        am = torch.ones_like(tokens)
    shape = tuple(tokens.shape)
    return tokens, am, {h: cache_tensor(cache, h, shape, "cache", _CACHE_HINT) for h in names}


def _logit_direction(model, answer_tokens, incorrect_tokens, n: int, device) -> Tensor:
    """``W_U[:, answer] - W_U[:, incorrect]`` (or ``W_U[:, answer]``) per sequence: ``[batch, d_model]``."""
    answer = token_ids(model, answer_tokens, n=n, argument="answer_tokens").to(device)
    W_U = model.W_U  # [d_model, vocab]
    direction = W_U[:, answer].T
    if incorrect_tokens is not None:
        wrong = token_ids(model, incorrect_tokens, n=n, argument="incorrect_tokens").to(device)
        direction = direction - W_U[:, wrong].T
    return direction


def _read_positions(position: int, tokens: Tensor, am: Tensor, device) -> Tensor:
    """The position read per sequence: ``[batch]``."""
    if position == -1:
        return am.long().cumsum(-1).argmax(-1)  # last real token (right or left padding)
    if not 0 <= position < tokens.shape[1]:
        raise ValueError(f"position {position} is outside 0..{tokens.shape[1] - 1} (or -1 for the last token)")
    return torch.full((tokens.shape[0],), position, device=device)


def _unit_rows(sites: ModelSites, L: int, at, dla_of, split_ref, eps: float, n: int) -> list[dict]:
    """The ``attn`` and ``mlp`` rows of layer ``L``: each update split against its stream."""
    rows = []
    for c in ("attn", "mlp"):
        u = sites.units[c][L]
        upd = at(u.update_hook)
        d = split_ref.decompose(upd, at(u.reference_hook), L, eps)
        total, par, perp = dla_of(upd.to(d.par.dtype)), dla_of(d.par), dla_of(d.perp)
        for b in range(n):
            rows.append({"sequence": b, "layer": L, "unit": c, "head": None, "dla": float(total[b]),
                         "dla_par": float(par[b]), "dla_perp": float(perp[b]), "par_frac": float(d.par_frac[b])})
    return rows


def _head_rows(model, sites: ModelSites, L: int, at, dla_of, split_ref, eps: float, n: int) -> list[dict]:
    """Layer ``L``'s heads: ``W_O[h]^T z_h`` split against ``resid_pre`` (NaN on sandwich norms)."""
    z = at(sites.value[L].z_hook)  # [batch, heads, d_head]
    x = at(sites.value[L].resid_hook)  # [batch, d_model]
    out = torch.einsum("bhe,hed->bhd", z, model.blocks[L].attn.W_O)
    d = split_ref.decompose(out, x.unsqueeze(1), L, eps)
    total, par, perp = dla_of(out.to(d.par.dtype)), dla_of(d.par), dla_of(d.perp)
    exact = sites.factorization_applicable  # else W_O[h]^T z_h is not what the head adds
    if not exact:
        total, par, perp = (torch.full_like(t, float("nan")) for t in (total, par, perp))
    return [{"sequence": b, "layer": L, "unit": "head", "head": h, "dla": float(total[b, h]),
             "dla_par": float(par[b, h]), "dla_perp": float(perp[b, h]),
             "par_frac": float(d.par_frac[b, h]) if exact else float("nan")}
            for b in range(n) for h in range(sites.n_heads)]


def split_logit_attribution(
    model,
    inputs,
    answer_tokens: Int[Tensor, " batch"] | Sequence[int] | Sequence[str] | int | str,
    *,
    incorrect_tokens: Int[Tensor, " batch"] | Sequence[int] | Sequence[str] | int | str | None = None,
    position: int = -1,
    unit: str = "all",
    cache=None,
    eps: float = DEFAULT_EPS,
    wrong_tokens=None,
    reference=None,
    per_layer: bool | None = None,
) -> pd.DataFrame:
    """Direct logit attribution of each head and sub-layer, split into parallel and
    perpendicular parts against the stream each writes into (METHOD.md sec. 2-3).

    The logit direction is ``W_U[:, answer] - W_U[:, incorrect]`` (or ``W_U[:, answer]``),
    read at ``position`` (absolute, or -1 for each sequence's last real token); the
    final norm is linearised at the run's own scale (``ln_final.hook_scale``), so
    ``dla == dla_par + dla_perp`` exactly for every row. Heads' outputs are
    ``W_O[h]^T z_h`` (no bias) split against ``resid_pre``; sub-layers use their
    sites (attention update vs ``resid_pre``, MLP update vs its reference).

    ``answer_tokens`` / ``incorrect_tokens`` (TransformerLens 4.3's names; the old keyword
    ``wrong_tokens`` raises a renamed-argument error): one per sequence (or one for all), as token
    ids or single-token strings (``" light"``). A text longer than the model's context is a
    ValueError (attributing at the last token that fits would not be where the answer follows
    the text); token-id inputs longer than ``n_ctx`` are refused as everywhere.

    Versus TransformerLens's ``cache.logit_attrs``: TL's applies the final norm's
    centring and scale but not its weight ``ln_final.w`` (it assumes the weight was
    folded into ``W_U``, as ``fold_ln`` does). The unprocessed models this library
    measures keep that weight, so here it is applied: ``dla`` equals TL's
    ``logit_attrs`` with the direction multiplied by ``ln_final.w``, and the rows
    (with the embedding and bias terms) add up to the true logit difference.

    On sandwich-norm models (Gemma-2/3, OLMo-2) a norm follows ``W_O``, so what a head adds
    to the stream is not ``W_O[h]^T z_h`` and per-head attributions are not defined: head rows
    carry NaN and ``table.attrs["notes"]`` says why; the ``attn`` / ``mlp`` rows (the normalised
    updates actually added) stay exact.

    ``reference`` (:func:`~tl_directional.model.reference.resolve_reference`, residual space:
    every row here is a ``d_model`` vector written into the stream): None / ``"input"`` (default,
    the stream each unit writes into; exactly today's table), a ``[d_model]`` direction, a
    ``[n_layers, d_model]`` per-layer set (``per_layer=True``; row ``L`` for layer ``L``'s units and
    heads), a ``[k, d_model]`` subspace, or a ``Direction(space="resid")``. With a reference each
    written vector is split against it instead (``dla == dla_par + dla_perp`` still holds), and the
    table gets a ``reference`` column and ``random_energy_share`` (``k / d_model``).
    ``table.attrs["reference"]`` / ``["random_energy_share"]`` say the same for every call.

    ``unit`` (TransformerLens 4.3's ``direct_logit_attribution`` name): ``"all"`` (default: the
    ``attn`` / ``mlp`` rows and the heads), ``"component"`` (the ``attn`` / ``mlp`` rows only) or
    ``"head"`` (the heads only). TL's ``"layer"`` (the cumulative stream after each sub-layer) is
    :func:`~tl_directional.split_logit_lens`'s job here and is refused with that pointer.

    ``cache``: an ``ActivationCache`` (or a mapping of hook names to tensors) from
    ``model.run_with_cache(tokens)`` to read instead of running the model; it must hold
    ``ln_final.hook_scale``, each layer's update and stream hooks and ``attn.hook_z`` (a missing
    one is an error naming it).
    ``inputs`` may then be None (no padding assumed: ``position=-1`` is the last position), or the
    token tensor the cache was run on (texts are refused: tokenised here they might be padded
    differently from the cached run).

    Returns:
        A DataFrame with one row per (sequence, layer, unit): ``unit`` is ``"attn"``,
        ``"mlp"`` or ``"head"`` (with ``head``), and ``dla``, ``dla_par``, ``dla_perp``,
        ``par_frac`` of the written vector.
    """
    eps = check_eps(eps)
    if wrong_tokens is not None:
        raise renamed_argument("split_logit_attribution", "wrong_tokens", "incorrect_tokens")
    split_ref = resolve_reference(model, reference, per_layer=per_layer)
    if unit not in _UNITS:
        raise ValueError(
            f"unit must be one of {_UNITS} (TransformerLens's direct_logit_attribution names), got {unit!r}"
            + ("; the cumulative stream after each sub-layer is split_logit_lens(model, tokens, targets=...)"
               if unit == "layer" else ""))
    sites = analysis_sites(model, "split_logit_attribution", ValueError,
                           "dropout would make the attribution random")
    if not sites.causal:
        raise ValueError("split_logit_attribution needs a causal LM with an unembedding")
    tokens, am, acts = _activations(model, sites, inputs, cache)
    device = device_of(model)
    n = tokens.shape[0]
    direction = _logit_direction(model, answer_tokens, incorrect_tokens, n, device)
    pos = _read_positions(position, tokens, am, device)
    rows_idx = torch.arange(n, device=device)
    scale = acts["ln_final.hook_scale"].to(device)[rows_idx, pos]  # [batch, 1]

    def dla_of(vec: Tensor) -> Tensor:  # [batch, ..., d_model] -> [batch, ...]
        normed = _final_norm_linear(model, sites, vec, scale.view(-1, *([1] * (vec.ndim - 1))))
        return (normed * direction.view(direction.shape[0], *([1] * (vec.ndim - 2)), -1)).sum(-1)

    def at(name: str) -> Tensor:
        return acts[name].to(device)[rows_idx, pos]

    rows = []
    with torch.no_grad():
        for L in range(sites.n_layers):
            if unit in ("all", "component"):
                rows += _unit_rows(sites, L, at, dla_of, split_ref, eps, n)
            if unit in ("all", "head"):
                rows += _head_rows(model, sites, L, at, dla_of, split_ref, eps, n)
    table = integer_columns(pd.DataFrame(rows), ("sequence", "layer", "head"))
    if not split_ref.is_stream:
        table["reference"] = split_ref.describe()
        table["random_energy_share"] = split_ref.random_energy_share
    table.attrs["reference"] = split_ref.describe()
    table.attrs["random_energy_share"] = split_ref.random_energy_share
    table.attrs["notes"] = [] if sites.factorization_applicable else [
        "sandwich-norm model: a norm follows W_O, so per-head DLA (W_O[h]^T z_h) is not what a head "
        "adds; head rows are NaN, the attn / mlp rows are exact."
    ]
    return table


__all__ = ["split_logit_attribution"]
