"""Directions from where people get them, each a :class:`~tl_directional.Direction` that records
where it came from (source, hook point, layer, whether the model's weights were processed):

* :func:`unembedding_direction`: a logit (or logit-difference) direction ``W_U[:, a] - W_U[:, b]``,
  with the final norm's effect on the stream stated and chosen explicitly;
* :func:`probe_direction`: a linear probe's weights (a tensor, a numpy array, a ``torch.nn.Linear``
  or a scikit-learn style object with ``coef_``);
* :func:`mean_difference_direction`: the mean of one prompt set's cached activations minus the
  other's (padding-aware).

Each returns vectors in float32 (the probe's own floating dtype for :func:`probe_direction`), to be
used as a ``reference=`` or as the vector of :class:`~tl_directional.edit.steering.ActivationAddition`.
Bad input (a wrong width, a zero or non-finite direction, an unknown token, an empty prompt set)
is a :class:`~tl_directional.DirectionError` naming the argument and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..core.direction import Direction, DirectionError
from ..model.handle import capture_hooks, device_of, run_hooked
from ..model.inputs import iter_batches, prepare_inputs, token_ids
from ..model.structure import detect_weight_processing
from ..model.weights import final_norm_weight

_LAYER = re.compile(r"^blocks\.(\d+)\.")
_VALUE_HOOKS = (".hook_z", ".hook_v", ".hook_q", ".hook_k")


def _processed(model) -> bool:
    return detect_weight_processing(model).any


def _layer_of(hook_name: str | None) -> int | None:
    m = _LAYER.match(hook_name or "")
    return int(m.group(1)) if m else None


def _check_rows(v: Tensor, argument: str) -> None:
    if not bool(torch.isfinite(v).all()):
        raise DirectionError(f"{argument} has NaN or inf entries; pass finite weights")
    sq = v.double().square().sum(-1)
    if bool((sq == 0).any()):
        rows = "it is" if v.ndim == 1 else f"row(s) {(sq == 0).nonzero().flatten().tolist()[:8]} are"
        raise DirectionError(f"{argument} is a zero direction ({rows} all zeros); there is nothing to "
                             "split against or add: pass a nonzero direction")


# ---------------------------------------------------------------------------------------------
# the unembedding
# ---------------------------------------------------------------------------------------------


def _one_token(model, token, argument: str) -> int:
    try:
        return int(token_ids(model, [token], n=1, argument=argument)[0])
    except (ValueError, TypeError) as err:
        raise DirectionError(str(err)) from None


def unembedding_direction(model, a, b=None, *, through_final_norm: bool = True) -> Direction:
    """The residual-stream direction the logit of token ``a`` (minus that of ``b``) reads.

    The logits are ``ln_final(x) @ W_U + b_U`` of the final stream ``x``
    (``blocks.{n_layers-1}.hook_resid_post``), so the logit difference is
    ``ln_final(x) . d + (b_U[a] - b_U[b])`` with ``d = W_U[:, a] - W_U[:, b]`` (``W_U[:, a]`` when ``b``
    is None). The final norm divides ``x`` by its scale (``ln_final.hook_scale``), multiplies by its
    weight ``w`` and, for LayerNorm, first removes the mean of ``x``. Hence two choices:

    * ``through_final_norm=True`` (default): the stream direction ``r = w * d`` (RMSNorm), centred,
      ``r = w * d - mean(w * d)`` (LayerNorm), so that exactly
      ``logit[a] - logit[b] = (x . r) / scale + details["offset"]`` with
      ``offset = b_ln . d + b_U[a] - b_U[b]`` (the final norm's bias, the unembedding bias). Recorded
      at ``blocks.{n_layers-1}.hook_resid_post``.
    * ``through_final_norm=False``: ``d`` itself, the direction in the final norm's output (what the
      unembedding reads: TransformerLens's ``unembed.hook_in`` on a bridge), which is the stream
      direction only on a model whose norm weight was folded into ``W_U`` and whose writing weights
      were centred (``fold_ln`` / ``center_writing_weights``). ``hook_name`` and ``layer`` are None.

    A logit soft-cap (Gemma-2) makes the logit a nonlinear function of ``ln_final(x) . d``; the
    direction is still the one the capped logit grows along (``details["softcap"]``).

    Args:
        model: a ``TransformerBridge`` or ``HookedTransformer``.
        a, b: token ids or single-token strings (mind the leading space, ``" Paris"``).
        through_final_norm: whether to fold the final norm's weight and centring in (above).

    Raises:
        DirectionError: an unknown token or a multi-token string (naming it), ``a == b``, or a
            zero direction.
    """
    ia = _one_token(model, a, "a")
    ib = None if b is None else _one_token(model, b, "b")
    if ib == ia:
        raise DirectionError(f"a and b are the same token ({ia}); W_U[:, a] - W_U[:, b] is zero: pass two "
                             "different tokens")
    with torch.no_grad():
        W_U = model.W_U
        d = W_U[:, ia].float() - (W_U[:, ib].float() if ib is not None else 0.0)
        offset = _unembedding_offset(model, d, ia, ib)
        r = _through_final_norm(model, d) if through_final_norm else d.clone()
    _check_rows(r, "the unembedding direction")
    n = int(model.cfg.n_layers)
    softcap = getattr(model.cfg, "output_logits_soft_cap", None)
    details = {"a": ia, "b": ib, "through_final_norm": bool(through_final_norm), "offset": offset,
               "normalization_type": getattr(model.cfg, "normalization_type", None),
               "softcap": softcap if softcap not in (None, 0, 0.0, -1, -1.0) else None,
               "reads": ("the final stream x: logit diff = (x . r) / ln_final.hook_scale + offset"
                         if through_final_norm else "the final norm's output (the unembedding's input)")}
    return Direction(r, source="unembedding", space="resid",
                     hook_name=f"blocks.{n - 1}.hook_resid_post" if through_final_norm else None,
                     layer=n - 1 if through_final_norm else None,
                     weights_processed=_processed(model), details=details)


def _through_final_norm(model, d: Tensor) -> Tensor:
    norm = str(getattr(model.cfg, "normalization_type", "LN") or "")
    w = final_norm_weight(model) if norm else None
    r = d * w.detach().float() if w is not None else d.clone()
    if norm.startswith("LN"):  # x - mean(x) . r == x . (r - mean(r))
        r = r - r.mean()
    return r


def _unembedding_offset(model, d: Tensor, ia: int, ib: int | None) -> float:
    """``b_ln . d + b_U[a] - b_U[b]``: the part of the logit difference no stream direction carries."""
    b_u = getattr(model, "b_U", None)
    offset = 0.0
    if b_u is not None:
        offset += float(b_u[ia]) - (float(b_u[ib]) if ib is not None else 0.0)
    ln = getattr(model, "ln_final", None)
    if ln is not None and getattr(model.cfg, "normalization_type", None):
        # the final norm of a zero stream is its bias (0 for RMSNorm), on either lane
        zero = torch.zeros(1, 1, d.shape[0], dtype=model.W_U.dtype, device=d.device)
        offset += float((ln(zero).float().reshape(-1) * d).sum())
    return offset


# ---------------------------------------------------------------------------------------------
# probes
# ---------------------------------------------------------------------------------------------


def _probe_weights(weights) -> tuple[Tensor, dict]:
    """``(rows, details)`` of any accepted probe form."""
    if isinstance(weights, torch.nn.Linear):
        bias = weights.bias
        return weights.weight.detach().clone(), {
            "form": "torch.nn.Linear", "bias": None if bias is None else bias.detach().clone()}
    if hasattr(weights, "coef_"):
        intercept = getattr(weights, "intercept_", None)
        return torch.as_tensor(np.asarray(weights.coef_)), {
            "form": type(weights).__name__, "intercept": None if intercept is None else np.asarray(intercept)}
    if isinstance(weights, np.ndarray):
        return torch.as_tensor(weights), {"form": "numpy"}
    if isinstance(weights, Tensor):
        return weights.detach().clone(), {"form": "tensor"}
    raise DirectionError(f"weights must be a tensor, a numpy array, a torch.nn.Linear or an object with "
                         f"coef_ (scikit-learn), got {type(weights).__name__}")


def probe_direction(weights, *, hook_name: str, layer: int | None = None, model=None,
                    space: str | None = None) -> Direction:
    """A linear probe's weight vector(s) as a :class:`~tl_directional.Direction`.

    A binary probe has one weight row: the direction it reads. Several rows (a multi-class probe,
    a ``torch.nn.Linear`` with ``out_features > 1``) are a ``[k, d]`` subspace. The bias / intercept
    is not a direction; it is kept in ``details``.

    Args:
        weights: a ``[d]`` or ``[k, d]`` tensor or numpy array, a ``torch.nn.Linear`` (its
            ``weight``, ``[out_features, in_features]``) or a scikit-learn style object with
            ``coef_`` (``[1, d]`` for a binary classifier, ``[n_classes, d]`` otherwise).
        hook_name: the hook point the probe was trained on (``"blocks.3.hook_resid_post"``).
        layer: its layer; None: read from ``hook_name`` (``blocks.L.``).
        model: the model the probe reads, optional: its ``d_model`` (or ``d_head`` for a
            value-space hook) is then checked and its weight processing recorded.
        space: ``"resid"`` or ``"value"``; None: ``"value"`` for ``hook_z`` / ``hook_v`` /
            ``hook_q`` / ``hook_k`` hooks, else ``"resid"``.

    Raises:
        DirectionError: an unsupported form, a shape that is not ``[d]`` / ``[k, d]``, NaN / inf,
            a zero row, or (with ``model``) a width that is not the model's.
    """
    if not isinstance(hook_name, str) or not hook_name:
        raise DirectionError(f"hook_name must name the hook point the probe reads, got {hook_name!r}")
    rows, details = _probe_weights(weights)
    if rows.ndim == 2 and rows.shape[0] == 1:
        rows = rows[0]  # a binary probe: one direction
    if rows.ndim not in (1, 2) or rows.numel() == 0:
        raise DirectionError(f"weights must be [d] or [k, d], got shape {tuple(rows.shape)}")
    if not rows.is_floating_point():
        rows = rows.float()
    _check_rows(rows, "weights")
    space = space or ("value" if hook_name.endswith(_VALUE_HOOKS) else "resid")
    if model is not None:
        want = int(model.cfg.d_model if space == "resid" else model.cfg.d_head)
        if rows.shape[-1] != want:
            what = "d_model" if space == "resid" else "d_head"
            raise DirectionError(f"weights have width {rows.shape[-1]} but the model's {what} is {want} "
                                 f"(hook_name={hook_name!r}); was the probe trained on another model or hook?")
    return Direction(rows, source="probe", space=space, hook_name=hook_name,
                     layer=_layer_of(hook_name) if layer is None else int(layer),
                     weights_processed=None if model is None else _processed(model), details=details)


# ---------------------------------------------------------------------------------------------
# mean differences of two prompt sets
# ---------------------------------------------------------------------------------------------


def _set_mean(model, prompts, argument: str, hook_name: str, position, exclude_first_token: bool,
              batch_size: int) -> tuple[Tensor, int, int]:
    """``(mean, n_prompts, n_tokens)`` of one prompt set's activations at ``hook_name``, float64."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if prompts is None or (isinstance(prompts, Sequence) and len(prompts) == 0) or (
            isinstance(prompts, Tensor) and prompts.numel() == 0):
        raise DirectionError(f"{argument} is empty: pass at least one prompt")
    try:
        batch = prepare_inputs(model, prompts, argument=argument)
    except (ValueError, TypeError) as err:
        raise DirectionError(str(err)) from None
    device = device_of(model)
    total, n_tokens = None, 0
    for part in iter_batches(batch, batch_size):
        store: dict = {}
        tokens, mask = part.tokens.to(device), part.attention_mask.to(device)
        run_hooked(model, tokens, mask, capture_hooks([hook_name], store), stop_at=hook_name)
        act = store[hook_name]
        if act.ndim != 3 or act.shape[-1] != int(model.cfg.d_model):
            raise DirectionError(f"hook_name={hook_name!r} carries {tuple(act.shape)} activations; a mean "
                                 "difference direction is read where the hook is [batch, pos, d_model] "
                                 "(the residual stream, hook_attn_out, hook_mlp_out)")
        weights = _position_weights(mask.bool(), position, exclude_first_token, argument)
        n_tokens += int((weights > 0).sum())
        per_prompt = torch.einsum("bp,bpd->bd", weights, act.double())
        total = per_prompt.sum(0) if total is None else total + per_prompt.sum(0)
    return total / len(batch), len(batch), n_tokens


def _position_weights(real, position, exclude_first_token: bool, argument: str) -> Tensor:
    """``[batch, pos]`` float64 weights: one-hot at the chosen position of each row, or uniform
    over the row's real tokens (``"mean"``)."""
    b, p = real.shape
    rows = torch.arange(b, device=real.device)
    if position == "mean":
        keep = real.clone()
        if exclude_first_token:
            first = real.long().argmax(-1)
            several = real.sum(-1) > 1  # a one-token prompt keeps its only token
            keep[rows[several], first[several]] = False
        return keep.double() / keep.sum(-1, keepdim=True).double()
    if isinstance(position, bool) or not isinstance(position, int):
        raise DirectionError(f"position must be an int or 'mean', got {position!r}")
    last = p - 1 - real.flip(-1).long().argmax(-1)  # each row's last real token (either padding side)
    idx = last + 1 + position if position < 0 else torch.full_like(last, position)
    ok = (idx >= 0) & (idx < p)
    ok = ok & real[rows, idx.clamp(0, p - 1)]
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten().tolist()[:8]
        raise DirectionError(f"position={position} is not a real token of {argument} row(s) {bad} (too short, "
                             "or padding there); pass position=-1 (each row's last token) or 'mean'")
    out = torch.zeros((b, p), dtype=torch.float64, device=real.device)
    out[rows, idx] = 1.0
    return out


def mean_difference_direction(model, prompts_a, prompts_b, *, hook_name: str, position: int | str = -1,
                              exclude_first_token: bool = True, batch_size: int = 16) -> Direction:
    """The mean activation of ``prompts_a`` minus that of ``prompts_b`` at ``hook_name``.

    Each prompt gives one vector, read at ``position`` of its own tokens (padding-aware: prompts of
    different lengths are padded with an attention mask, :func:`~tl_directional.prepare_inputs`),
    and each set's mean weighs its prompts equally; computed in float64, returned in float32.

    Args:
        model: a ``TransformerBridge`` or ``HookedTransformer``.
        prompts_a, prompts_b: the two sets (strings, token-id lists or a ``[batch, pos]`` tensor).
        hook_name: a hook point carrying ``[batch, pos, d_model]`` (``"blocks.3.hook_resid_pre"``).
        position: ``-1`` (each prompt's last real token, the default), another negative int
            (counted back from the last real token), an int ``>= 0`` (that absolute position, which
            must be a real token of every prompt) or ``"mean"`` (the mean over the prompt's tokens).
        exclude_first_token: with ``"mean"``, leave each prompt's first real token out (BOS, the
            attention sink, whose stream has a norm unlike any other: METHOD.md sec. 1).
        batch_size: prompts per forward pass.

    Returns:
        A resid-space :class:`~tl_directional.Direction` with ``details``: ``n_a`` / ``n_b``
        (prompts), ``tokens_a`` / ``tokens_b`` (tokens averaged), ``norm_a`` / ``norm_b`` (the norms
        of the two means), ``norm`` (of the difference), ``position``.

    Raises:
        DirectionError: an empty prompt set, a hook point the model does not have or whose
            activations are not ``[batch, pos, d_model]``, a position outside a prompt, or two sets
            with the same mean (a zero direction).
    """
    if not isinstance(hook_name, str) or hook_name not in model.hook_dict:
        near = [n for n in model.hook_dict if n.endswith(str(hook_name).rsplit(".", 1)[-1])][:3]
        raise DirectionError(f"hook_name={hook_name!r} is not a hook point of this model"
                             + (f"; e.g. {near}" if near else "") + " (see model.hook_dict)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DirectionError(f"batch_size must be a positive int, got {batch_size!r}")
    mean_a, n_a, tok_a = _set_mean(model, prompts_a, "prompts_a", hook_name, position, exclude_first_token, batch_size)
    mean_b, n_b, tok_b = _set_mean(model, prompts_b, "prompts_b", hook_name, position, exclude_first_token, batch_size)
    diff = mean_a - mean_b
    if float(diff.square().sum()) == 0.0:
        raise DirectionError("prompts_a and prompts_b have the same mean activation: the difference is zero; "
                             "pass two sets that differ in what the direction should capture")
    details = {"n_a": n_a, "n_b": n_b, "tokens_a": tok_a, "tokens_b": tok_b,
               "norm_a": float(mean_a.norm()), "norm_b": float(mean_b.norm()), "norm": float(diff.norm()),
               "position": position, "exclude_first_token": bool(exclude_first_token) if position == "mean" else None}
    return Direction(diff.float(), source="mean_difference", space="resid", hook_name=hook_name,
                     layer=_layer_of(hook_name), weights_processed=_processed(model), details=details)


__all__ = ["mean_difference_direction", "probe_direction", "unembedding_direction"]
