"""Reference computations of the real-model and sandwich-norm tests, written independently of
the library under test: plain torch (float64) on ``run_with_cache`` activations and hand-written
hooks (tests/real/test_real_models.py, tests/integration/test_sandwich_norm.py)."""

from __future__ import annotations

import torch

from tl_directional.io.corpus import heldout_text

# ---------------------------------------------------------------------------------------------
# independent reference computations (plain torch, float64)
# ---------------------------------------------------------------------------------------------


def _coef(u: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Projection coefficient (u . r) / ||r||^2 along the last axis, float64."""
    u, r = u.double(), r.double()
    return (u * r).sum(-1) / (r * r).sum(-1)


def _par_frac(u: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    u, r = u.double(), r.double()
    return ((u * r).sum(-1).abs() / (u.norm(dim=-1) * r.norm(dim=-1))).clamp(0, 1)


def _energy_ratio(u: torch.Tensor, r: torch.Tensor) -> float:
    a = _coef(u, r).unsqueeze(-1)
    par = a * r.double()
    perp = u.double() - par
    return float(((par**2).sum() / (perp**2).sum()).sqrt())


def _kv_index(n_heads: int, n_kv: int) -> torch.Tensor:
    """kv(h) = h // (n_heads // n_kv), written out."""
    group = n_heads // n_kv
    return torch.tensor([h // group for h in range(n_heads)])


def _tokens(model, n_seq: int = 2, n_pos: int = 16) -> torch.Tensor:
    """``n_seq`` windows of held-out text, each BOS + ``n_pos - 1`` tokens."""
    bos = model.tokenizer.bos_token_id
    ids = model.to_tokens(heldout_text()[:4000], prepend_bos=False)[0]
    ids = ids[ids != bos]  # Gemma's tokenizer adds its own BOS
    rows = [[bos] + ids[i * (n_pos - 1):(i + 1) * (n_pos - 1)].tolist() for i in range(n_seq)]
    return torch.tensor(rows)


def _vpara_hooks(n_layers: int, n_heads: int, n_kv: int, s_par: float):
    """V-Para by hand: at each hook_z, o_t -> o_t + (s_par - 1) * coef * v_t(kv(h))."""
    idx = _kv_index(n_heads, n_kv)
    state: dict = {}
    hooks = []
    for L in range(n_layers):
        def keep_v(v, hook, L=L):
            state[L] = v
            return v

        def edit_z(z, hook, L=L):
            v = state[L][:, :, idx]  # [batch, pos, n_heads, d_head]
            c = _coef(z, v).unsqueeze(-1)
            return (z.double() + (s_par - 1.0) * c * v.double()).to(z.dtype)

        hooks += [(f"blocks.{L}.attn.hook_v", keep_v), (f"blocks.{L}.attn.hook_z", edit_z)]
    return hooks


def _residual_removal_hooks(n_layers: int):
    """Remove the part of each attention update along resid_pre, by hand."""
    state: dict = {}
    hooks = []
    for L in range(n_layers):
        def keep(x, hook, L=L):
            state[L] = x
            return x

        def edit(u, hook, L=L):
            r = state[L]
            return (u.double() - _coef(u, r).unsqueeze(-1) * r.double()).to(u.dtype)

        hooks += [(f"blocks.{L}.hook_resid_pre", keep), (f"blocks.{L}.hook_attn_out", edit)]
    return hooks


def _greedy(model, tokens: torch.Tensor, steps: int, fwd_hooks) -> torch.Tensor:
    out = tokens
    with torch.no_grad():
        for _ in range(steps):
            logits = model.run_with_hooks(out, fwd_hooks=fwd_hooks)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out
