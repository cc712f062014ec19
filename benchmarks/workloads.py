"""Workloads shared by the records and the memory worker: inputs, forwards, hook names."""

from __future__ import annotations

import torch

from tl_directional.measure.cache_hooks import required_hooks
from tl_directional.model.inputs import TokenBatch
from tl_directional.model.sites import resolve_sites


def text_batch(model, n_seq: int, seq: int) -> TokenBatch:
    """``n_seq`` windows of ``seq`` tokens of the bundled held-out text (BOS first where the
    tokenizer has one), on the CPU. Windows repeat from the start if the text runs out."""
    from tl_directional.model.inputs import load_text_sequences

    n_ctx = int(getattr(model.cfg, "n_ctx", seq) or seq)
    if seq > n_ctx:
        raise ValueError(f"seq={seq} is longer than the model's context n_ctx={n_ctx}")
    base = load_text_sequences(model, None, max_sequences=n_seq, seq_len=seq)
    # Keep full windows only, so every row has exactly `seq` tokens and no padding.
    full = base.attention_mask.sum(-1) == seq
    tokens, mask = base.tokens[full], base.attention_mask[full]
    if tokens.shape[0] == 0:
        raise ValueError(f"the bundled held-out text has no window of {seq} tokens")
    reps = -(-n_seq // tokens.shape[0])
    tokens, mask = tokens.repeat(reps, 1)[:n_seq], mask.repeat(reps, 1)[:n_seq]
    return TokenBatch(tokens.contiguous(), mask.contiguous())


def forward(model, batch: TokenBatch, return_type: str | None = "logits"):
    """One plain forward pass without gradients (the baseline of most records)."""
    with torch.no_grad():
        return model(batch.tokens, attention_mask=batch.attention_mask, return_type=return_type)


def all_components(model) -> tuple[str, ...]:
    """Every component ``profile`` can measure on this model: its residual units plus
    ``"value"`` (per head)."""
    return resolve_sites(model, warn=False).components + ("value",)


def needed_hooks(model, components=None) -> list[str]:
    """Hook names ``Profile.from_cache`` reads for ``components`` (default: all): what a naive
    user would cache with ``run_with_cache(names_filter=...)``; :func:`tl_directional.required_hooks`,
    sorted."""
    return sorted(required_hooks(model, components=components))


def naive_profile(model, batch: TokenBatch, components=None, names: list[str] | None = None):
    """The naive way: cache every needed hook for the whole batch, then decompose the cache."""
    from tl_directional import Profile

    names = needed_hooks(model, components) if names is None else names
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                        names_filter=names, return_type=None)
    return Profile.from_cache(model, cache, attention_mask=batch.attention_mask,
                              components=components, exclude_first_token=False)


def _summary(x: torch.Tensor) -> dict:
    """What a user reports per metric: mean, std and five quantiles (exact, torch.quantile)."""
    x = x.double()
    q = torch.quantile(x, torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64))
    return {"mean": x.mean(), "std": x.std(), "q": q}


def split_by_hand(u: torch.Tensor, r: torch.Tensor) -> dict:
    """The residual split a user writes in torch: the four per-token metrics and the energy
    ratio, no degenerate-token handling (random-weight and trained models have none)."""
    u, r = u.float(), r.float()
    a = (u * r).sum(-1) / (r * r).sum(-1)
    par = a[:, None] * r
    perp = u - par
    par_n, perp_n, u_n, r_n = par.norm(dim=-1), perp.norm(dim=-1), u.norm(dim=-1), r.norm(dim=-1)
    return {"alpha": _summary(a), "par_frac": _summary(par_n / u_n),
            "par_perp_ratio": _summary(par_n / perp_n), "rel_update": _summary(u_n / r_n),
            "energy_ratio": ((par_n ** 2).sum() / (perp_n ** 2).sum()).sqrt()}


def handwritten_profile(model, batch: TokenBatch, names: list[str] | None = None,
                        components=None) -> dict:
    """What a user writes by hand for the same statistics as ``profile``: one
    ``run_with_cache`` of the needed hooks, then torch math per layer and unit (and per head in
    value space), summarised with exact ``torch.quantile``. Not the library's own code."""
    sites = resolve_sites(model, warn=False)
    comps = all_components(model) if components is None else tuple(components)
    names = needed_hooks(model, comps) if names is None else names
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                        names_filter=names, return_type=None)
        mask = batch.attention_mask.bool()
        out: dict = {"tokens": int(mask.sum())}
        for L in range(sites.n_layers):
            for c in comps:
                if c == "value":
                    continue
                u = sites.units[c][L]
                upd, ref = cache[u.update_hook][mask], cache[u.reference_hook][mask]
                if u.update_is_difference:
                    upd = upd - ref
                out[(L, c)] = split_by_hand(upd, ref)
            if "value" in comps:
                vs = sites.value[L]
                rep = sites.n_heads // sites.n_kv_heads
                v = cache[vs.v_hook].repeat_interleave(rep, dim=2)[mask].float()  # [n, h, e]
                z = cache[vs.z_hook][mask].float()
                a_tt = cache[vs.pattern_hook].diagonal(dim1=-2, dim2=-1).transpose(1, 2)[mask].float()
                x = cache[vs.resid_hook][mask].float()
                W_O = model.blocks[L].attn.W_O.float()
                beta = (z * v).sum(-1) / (v * v).sum(-1)
                cross = z - a_tt[..., None] * v
                gamma = (cross * v).sum(-1) / (v * v).sum(-1)
                wx = torch.einsum("nd,hed->nhe", x, W_O)
                x_sq = (x * x).sum(-1, keepdim=True)
                alpha_head = (z * wx).sum(-1) / x_sq
                phi = (v * wx).sum(-1) / x_sq
                for h in range(sites.n_heads):
                    out[(L, "value", h)] = {
                        "beta": _summary(beta[:, h]), "A_tt": _summary(a_tt[:, h]),
                        "gamma": _summary(gamma[:, h]), "phi": _summary(phi[:, h]),
                        "alpha_head": _summary(alpha_head[:, h]),
                        "full": split_by_hand(z[:, h], v[:, h]),
                        "exclusive": split_by_hand(cross[:, h], v[:, h]),
                    }
    return out


__all__ = ["all_components", "forward", "handwritten_profile", "naive_profile", "needed_hooks",
           "split_by_hand", "text_batch"]
