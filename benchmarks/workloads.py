"""Workloads shared by the records and the memory worker: inputs, forwards, hook names."""

from __future__ import annotations

import torch

from tl_directional.inputs import TokenBatch
from tl_directional.sites import resolve_sites


def text_batch(model, n_seq: int, seq: int) -> TokenBatch:
    """``n_seq`` windows of ``seq`` tokens of the bundled held-out text (BOS first where the
    tokenizer has one), on the CPU. Windows repeat from the start if the text runs out."""
    from tl_directional.cli import load_text_sequences

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
    user would cache with ``run_with_cache(names_filter=...)``."""
    sites = resolve_sites(model, warn=False)
    comps = all_components(model) if components is None else tuple(components)
    names: set[str] = set()
    for comp in comps:
        if comp == "value":
            for vs in sites.value:
                names |= {vs.v_hook, vs.pattern_hook, vs.z_hook, vs.resid_hook}
            # the factorization check reads the attention update and its reference
            for u in sites.units["attn"]:
                names |= {u.update_hook, u.reference_hook}
        else:
            for u in sites.units[comp]:
                names |= {u.update_hook, u.reference_hook}
    return sorted(names)


def naive_profile(model, batch: TokenBatch, components=None, names: list[str] | None = None):
    """The naive way: cache every needed hook for the whole batch, then decompose the cache."""
    from tl_directional import Profile

    names = needed_hooks(model, components) if names is None else names
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                        names_filter=names, return_type=None)
    return Profile.from_cache(model, cache, attention_mask=batch.attention_mask,
                              components=components)


__all__ = ["all_components", "forward", "naive_profile", "needed_hooks", "text_batch"]
