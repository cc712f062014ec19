"""The scores of directional attribution patching: the split of one dot product and every
node's ``full`` / ``par`` / ``perp`` / ``frac`` from the corrupted run's activations and gradients
(:mod:`tl_directional.evaluate.patching.attribution` runs the model; this module only reads tensors).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from ...core.geometry import DEFAULT_EPS
from ...model.sites import ModelSites, expand_kv_heads
from ...model.weights import attention_output_weights
from .cache_input import PatchingInputError


class AttributionError(PatchingInputError):
    """Attribution patching was called with inputs it cannot score (see the message for the fix)."""



# ---------------------------------------------------------------------------------------------
# the split of one dot product
# ---------------------------------------------------------------------------------------------


def split_dot(
    delta: Float[Tensor, "*lead d"],
    reference: Float[Tensor, "*lead d"],
    grad: Float[Tensor, "*lead d"],
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(full, par, perp, par_frac)`` of the estimate ``delta . grad`` against ``reference``, in
    float64, each shaped ``lead``: ``par = (delta . r)(r . g) / ||r||^2``, ``perp = full - par``,
    ``par_frac = |cos(delta, r)|`` (the share of the difference along ``r``). A reference with
    ``||r||^2 <= eps`` (or a zero difference) is degenerate: ``par = 0``, ``par_frac = 0``."""
    d, r, g = delta.double(), reference.double(), grad.double()
    full = (d * g).sum(-1)
    rr = (r * r).sum(-1)
    dd = (d * d).sum(-1)
    dr = (d * r).sum(-1)
    ok = (rr > eps) & (dd > eps)
    safe = torch.where(ok, rr, torch.ones_like(rr))
    par = torch.where(ok, dr * (r * g).sum(-1) / safe, torch.zeros_like(full))
    frac = torch.where(
        ok,
        dr.abs() / torch.sqrt(safe * torch.where(ok, dd, torch.ones_like(dd))),
        torch.zeros_like(full),
    )
    return full, par, full - par, frac


def split_dot_against(
    delta: Float[Tensor, "*lead d"],
    stream: Float[Tensor, "*lead d"],
    grad: Float[Tensor, "*lead d"],
    reference,
    layer: int,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`split_dot` against ``stream`` (``reference`` None or the stream: bit for bit), or
    against a resolved :class:`~tl_directional.model.reference.Reference` at ``layer``: a
    direction ``r`` as :func:`split_dot`; a subspace with orthonormal rows ``Q``:
    ``par = (P delta) . g`` with ``P delta = (delta Q^T) Q``, ``par_frac = ||P delta|| / ||delta||``
    (0 where ``||delta||^2 <= eps``), in float64."""
    if reference is None or reference.is_stream:
        return split_dot(delta, stream, grad, eps)
    if reference.kind != "subspace":
        r = reference.vector(layer).to(device=delta.device, dtype=torch.float64)
        return split_dot(delta, r.expand(delta.shape), grad, eps)
    d, g = delta.double(), grad.double()
    q = reference.rows.to(device=d.device, dtype=torch.float64)
    pd = (d @ q.T) @ q
    full = (d * g).sum(-1)
    dd = (d * d).sum(-1)
    ok = dd > eps
    par = torch.where(ok, (pd * g).sum(-1), torch.zeros_like(full))
    frac = torch.where(ok, ((pd * pd).sum(-1) / torch.where(ok, dd, torch.ones_like(dd))).sqrt().clamp(0, 1),
                       torch.zeros_like(full))
    return full, par, full - par, frac


# ---------------------------------------------------------------------------------------------
# sandwich norms: what one head's write becomes after the post-attention norm, to first order
# ---------------------------------------------------------------------------------------------


def post_attention_norm(model, layer: int):
    norm = getattr(model.blocks[layer], "ln1_post", None)
    if norm is None:
        raise AttributionError(
            f"model is a sandwich-norm model but block {layer} has no ln1_post module; the head nodes "
            "need the post-attention norm (leave 'head' out of node_types)"
        )
    return norm


def linearised_norm(model, layer: int, pre: Tensor, vectors: Tensor) -> Tensor:
    """``J vectors``: the post-attention norm's Jacobian at the corrupted pre-norm write ``pre``
    (``[b, p, d]``) applied to ``vectors`` (``[b, p, h, d]``), by a double backward (a local
    Jacobian-vector product through one norm, no model forward)."""
    norm = post_attention_norm(model, layer)
    with torch.enable_grad():
        dtype = next((p.dtype for p in norm.parameters()), pre.dtype)
        y = (
            pre.detach()
            .to(dtype)
            .unsqueeze(2)
            .expand(*vectors.shape[:3], pre.shape[-1])
            .contiguous()
            .requires_grad_(True)
        )
        out = norm(y)
        u = torch.zeros_like(out, requires_grad=True)
        (vjp,) = torch.autograd.grad(out, y, grad_outputs=u, create_graph=True)
        (jvp,) = torch.autograd.grad(vjp, u, grad_outputs=vectors.to(vjp.dtype))
    return jvp.detach()


def node_scores(
    model,
    sites: ModelSites,
    sandwich: bool,
    node_types,
    clean: dict,
    acts: dict,
    grads: dict,
    eps: float,
    reference=None,
    layers=None,
) -> dict[str, dict[str, Tensor]]:
    """Every node's ``full``, ``par``, ``perp`` and ``frac``, stacked over ``layers`` (default:
    all) on axis 1; ``reference`` (a resolved non-stream Reference, or None) replaces the residual
    nodes' own."""
    out: dict[str, dict[str, list[Tensor]]] = {
        n: {"full": [], "par": [], "perp": [], "frac": []} for n in node_types
    }
    for L in range(sites.n_layers) if layers is None else layers:
        for n in node_types:
            if n == "resid":
                h = f"blocks.{L}.hook_resid_pre"
                res = split_dot_against(clean[h].to(acts[h].device) - acts[h], acts[h], grads[h], reference, L, eps)
            elif n in ("attn", "mlp"):
                u = sites.units[n][L]
                res = split_dot_against(
                    clean[u.update_hook].to(acts[u.update_hook].device) - acts[u.update_hook],
                    acts[u.reference_hook],
                    grads[u.update_hook],
                    reference, L, eps,
                )
            else:
                vs = sites.value[L]
                z = acts[vs.z_hook]
                dz = (clean[vs.z_hook].to(z.device) - z).double()
                gz = grads[vs.z_hook].double()
                if n == "value":
                    v = expand_kv_heads(
                        acts[vs.v_hook], sites.n_heads
                    )  # GQA: the KV head each query head reads
                    res = split_dot(dz, v, gz, eps)
                else:
                    res = head_split(model, sites, sandwich, L, dz, gz, z, acts, grads, eps, reference)
            for w, t in zip(("full", "par", "perp", "frac"), res, strict=True):
                out[n][w].append(t)
    return {n: {w: torch.stack(ts, dim=1) for w, ts in d.items()} for n, d in out.items()}


def head_split(
    model,
    sites: ModelSites,
    sandwich: bool,
    L: int,
    dz: Tensor,
    gz: Tensor,
    z: Tensor,
    acts: dict,
    grads: dict,
    eps: float,
    reference=None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One layer's head nodes: the residual-space split of ``W_O[h]^T dz_h`` (sandwich norms: after
    the linearised post-attention norm) against ``hook_resid_pre``, gradient at the attention
    update; ``full`` is ``dz_h . g_z`` (TransformerLens's head node score)."""
    W_O, b_O = attention_output_weights(model, L)
    W = W_O.detach().double()
    write = torch.einsum("bphe,hed->bphd", dz, W)  # [b, p, h, d_model]
    if sandwich:
        pre = torch.einsum("bphe,hed->bpd", z.double(), W)
        if b_O is not None:
            pre = pre + b_O.detach().double()
        write = linearised_norm(model, L, pre, write).double()
    x = acts[sites.value[L].resid_hook].double().unsqueeze(2)
    g = grads[sites.units["attn"][L].update_hook].double().unsqueeze(2)
    _, par, _, frac = split_dot_against(write, x.expand_as(write), g.expand_as(write), reference, L, eps)
    full = (dz * gz).sum(-1)
    return full, par, full - par, frac


__all__ = ["AttributionError", "head_split", "linearised_norm", "node_scores", "post_attention_norm", "split_dot", "split_dot_against"]
