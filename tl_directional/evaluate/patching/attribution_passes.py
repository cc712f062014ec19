"""The corrupted run of attribution patching: activations and their metric gradients, in one
forward and backward over every layer, or in passes over a few layers at a time (``layers_per_pass``).

:mod:`tl_directional.evaluate.patching.attribution` scores what these return. Memory: a backward
keeps every tensor the forward saved for it until it reaches that tensor; that graph, the logits
and their gradient make most of the peak. Two things here keep it down:

* the parameters are frozen for the run (:func:`frozen_parameters`), so autograd keeps no linear
  map's input for a weight gradient nobody asked for, and the graph starts at the first stream;
* with ``layers``, a pass ``[lo, hi)`` recomputes the forward from the tokens, turns the stream
  entering block ``lo`` into a leaf (nothing below it is kept), stops the forward at block
  ``hi``'s input and backpropagates ``(stream_hi . g_hi)`` from there, ``g_hi`` being the
  gradient the pass above returned for that stream. The chain rule makes every gradient the one
  of the single pass; the passes run top-down, so the top one (unembedding and metric) comes first.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
from torch import Tensor

from ...model.handle import StopForward
from .attribution_scores import AttributionError
from .cache_input import check_finite_metric


@contextmanager
def frozen_parameters(model):
    """``requires_grad=False`` on every parameter of ``model`` for the block, restored after.

    The estimate needs gradients at hook points only; with trainable weights autograd would also
    keep every linear map's input for the weight gradient, a large share of the backward's saved
    tensors. The forward's values and the activation gradients are the same either way.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def metric_vector(metric, logits: Tensor, batch: int) -> Tensor:
    """The metric as a differentiable ``[batch]`` tensor (per pair) or a 0-d tensor (the batch's)."""
    value = metric(logits)
    if not isinstance(value, Tensor):
        raise AttributionError(
            f"metric must return a tensor computed from the logits (one number per pair, shape [batch], or "
            f"one for the batch), got {type(value).__name__}; e.g. lambda logits: logits[:, -1, a] - logits[:, -1, b]"
        )
    if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != batch):
        raise AttributionError(
            f"metric returned shape {tuple(value.shape)}; it must return shape [batch] (={batch}, one number "
            "per pair) or a scalar, e.g. lambda logits: logits[:, -1, a] - logits[:, -1, b]"
        )
    if not value.requires_grad:
        raise AttributionError(
            "metric has no gradient with respect to the logits (it returned a tensor that does not require "
            "grad: detached, built from .item(), or computed under torch.no_grad()); build it from the "
            "logits tensor with torch operations"
        )
    return check_finite_metric(value, AttributionError)


def hook_layer(name: str) -> int:
    """The block index of a ``blocks.{L}.…`` hook point."""
    return int(name.split(".")[1])


def forward_backward(model, tokens: Tensor, mask: Tensor, act_names: set[str], grad_names: set[str], metric,
                     *, layers: range, n_layers: int, grad_above: Tensor | None = None):
    """One forward of ``tokens`` keeping (copies of) the ``act_names`` in ``layers`` and one
    backward keeping ``d metric / d a`` at the ``grad_names`` in ``layers``.

    ``layers`` is ``range(lo, hi)``: the graph starts at ``blocks.{lo}.hook_resid_pre``; when
    ``hi < n_layers`` the forward stops at ``blocks.{hi}.hook_resid_pre`` and the backward starts
    there with ``grad_above`` (that stream's metric gradient), else at the metric's sum.

    Returns ``(metric or None, acts, grads, g_lo)``: the metric (top pass only), the dicts, and
    the gradient at the stream entering block ``lo`` (``grad_above`` of the pass below).
    """
    acts: dict[str, Tensor] = {}
    live: dict[str, Tensor] = {}
    grads: dict[str, Tensor] = {}
    first = f"blocks.{layers.start}.hook_resid_pre"
    stop = f"blocks.{layers.stop}.hook_resid_pre" if layers.stop < n_layers else None
    grad_names = {n for n in grad_names if hook_layer(n) in layers}

    def fwd(name):
        def hook(t, hook):  # noqa: ARG001 - TL hook signature
            if name == stop:
                live[name] = t
                raise StopForward
            acts[name] = t.detach().clone()
            if name == first and not t.requires_grad:
                t = t.detach().requires_grad_(True)  # parameters frozen: the graph starts here
            if name in grad_names or name == first:
                live[name] = t
            return t

        return hook

    def bwd(name):
        def hook(g, hook):  # noqa: ARG001
            if isinstance(g, Tensor):
                grads[name] = g.detach().clone()

        return hook

    names = sorted({n for n in act_names if hook_layer(n) in layers} | grad_names | {first}
                   | ({stop} if stop else set()))
    value = None
    with (
        warnings.catch_warnings(),
        torch.enable_grad(),
        frozen_parameters(model),
        model.hooks(fwd_hooks=[(n, fwd(n)) for n in names], bwd_hooks=[(n, bwd(n)) for n in sorted(grad_names)]),
    ):
        # the hook module at ``first`` has no input requiring grad (its output is the leaf): by design
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        try:
            logits = model(tokens, attention_mask=mask)
        except StopForward:
            target = (live.pop(stop) * grad_above).sum()
        else:
            value = metric_vector(metric, logits, tokens.shape[0])
            target = value.sum()
        inputs = [n for n in sorted(live) if live[n].requires_grad]
        returned = torch.autograd.grad(target, [live[n] for n in inputs], allow_unused=True)
    # the most upstream point's backward hook need not fire (nothing requested lies above it);
    # its gradient is what autograd.grad returned for it
    got = dict(zip(inputs, returned, strict=True))
    for n, g in got.items():
        if n in grad_names and n not in grads and g is not None:
            grads[n] = g.detach().clone()
    missing = sorted(grad_names - set(grads))
    if missing:
        raise AttributionError(
            f"no gradient reached {missing[:3]}: the metric does not depend on them "
            "(check that metric reads the logits of the corrupted run)"
        )
    g_lo = got.get(first)
    return (None if value is None else value.detach()), acts, grads, (None if g_lo is None else g_lo.detach())


def check_layers_per_pass(layers_per_pass, n_layers: int) -> int:
    """``layers_per_pass`` as a block count (None: every layer in one pass)."""
    if layers_per_pass is None:
        return n_layers
    if isinstance(layers_per_pass, bool) or not isinstance(layers_per_pass, int) or layers_per_pass < 1:
        raise AttributionError(
            f"layers_per_pass must be None (one pass over all {n_layers} layers) or a positive integer "
            f"(blocks per forward/backward pass, 1..{n_layers}), got {layers_per_pass!r}; e.g. "
            f"layers_per_pass={max(1, n_layers // 4)} keeps about a quarter of the backward's graph"
        )
    return min(layers_per_pass, n_layers)


def layer_passes(n_layers: int, per_pass: int) -> list[range]:
    """The passes' layer ranges, top first (each needs the gradient of the one above)."""
    return [range(lo, min(n_layers, lo + per_pass)) for lo in range(0, n_layers, per_pass)][::-1]


__all__ = ["check_layers_per_pass", "forward_backward", "frozen_parameters", "hook_layer", "layer_passes",
           "metric_vector"]
