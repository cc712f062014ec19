"""The MLP carrier edits (:class:`~tl_directional.edit.carrier.MLPCarrierScale`) on plain Hugging
Face ``transformers`` models, as torch module hooks (METHOD.md sec. 4, "MLP carrier").

On each decoder layer's ``mlp`` module (the families of :data:`tl_directional.model.hf_layout.MODEL_TYPES`):

* ``x``, the MLP's input ``[batch, pos, d_model]``: the first argument of ``mlp.forward`` (the
  normalised stream, norm gain included), read in a forward pre-hook;
* ``h``, the carrier ``[batch, pos, d_mlp]``: the input of the down projection (``down_proj``;
  GPT-2 ``c_proj``, a ``Conv1D``; GPT-NeoX ``dense_4h_to_h``), edited in its forward pre-hook
  (``site="input"``);
* the down projection's output ``h W_down + b``, edited in its forward hook (``site="block"``),
  with ``W_down`` read from the module's live weight (``[d_mlp, d_model]`` after transposing a
  ``Linear``'s), so gradients reach it.

The math is :mod:`tl_directional.core.carrier`, as on the TransformerLens lane, so the edited HF
model gives that lane's logits to float32 round-off. Scales and layer scopes are the edit's own;
``positions`` is not supported here (refused with the fix: use the TransformerLens lane).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ...core.carrier import carrier_block_delta, carrier_input_delta, n_carrier_blocks
from ...core.geometry import compute_dtype
from ...model.hf_layout import resolve_hf_sites
from ...model.indices import normalize_layers
from ..carrier import MLPCarrierScale
from ..tensors import cast_back, scale_specs

#: ``config.model_type`` -> the down projection's name under the layer's ``mlp`` (default ``down_proj``).
DOWN_PROJECTIONS = {"gpt2": "c_proj", "gpt_neox": "dense_4h_to_h"}


class HFCarrierHandle:
    """The hooks :func:`install_carrier_edits` put on a model; :meth:`remove` takes them all off."""

    def __init__(self, handles: list):
        self._handles = handles

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _down_weight(module: torch.nn.Module) -> Tensor:
    """``W_down`` as ``[d_mlp, d_model]`` (``y = h @ W_down``): a ``torch.nn.Linear`` stores its
    transpose, GPT-2's ``Conv1D`` (the one other down projection of the supported families)
    stores it so."""
    w = module.weight
    return w.T if isinstance(module, torch.nn.Linear) else w


def install_carrier_edits(model: Any, *edits: Any) -> HFCarrierHandle:
    """Install ``edits`` (:class:`~tl_directional.edit.carrier.MLPCarrierScale`) on a plain
    ``transformers`` causal LM until ``handle.remove()``; they compose in the order given."""
    if not edits:
        raise ValueError("install_carrier_edits needs at least one MLPCarrierScale")
    for i, e in enumerate(edits):
        if not isinstance(e, MLPCarrierScale):
            raise TypeError(f"edits[{i}] is a {type(e).__name__}; install_carrier_edits takes MLPCarrierScale "
                            "objects (the other edits go through tl_directional.edit.hf.install_edits)")
        if e.positions is not None:
            raise ValueError(f"edits[{i}] has positions={e.positions!r}, which the plain-transformers carrier edit "
                             "does not support; pass positions=None, or use the TransformerLens lane "
                             "(tl_directional.apply_edits)")
    sites = resolve_hf_sites(model)
    shapes = sites.model_sites()
    down_name = DOWN_PROJECTIONS.get(sites.model_type, "down_proj")
    handles: list = []
    try:
        for e in edits:
            s_par, s_perp = scale_specs(e, shapes.n_layers, shapes.n_heads, allow_heads=False)
            for L in normalize_layers(e.layers, shapes.n_layers, "layers"):
                mlp = sites.module(L, "mlp")
                down = getattr(mlp, down_name)
                n_carrier_blocks(_down_weight(down).shape[0], shapes.d_model, e.remainder)
                if e.site == "input":
                    state: dict = {}
                    handles.append(mlp.register_forward_pre_hook(_keep_input(state), with_kwargs=True))
                    handles.append(down.register_forward_pre_hook(_input_hook(e, L, state, s_par, s_perp)))
                else:
                    handles.append(down.register_forward_hook(_block_hook(e, L, down, s_par, s_perp)))
    except Exception:
        for h in handles:
            h.remove()
        raise
    return HFCarrierHandle(handles)


@contextmanager
def apply_carrier_edits(model: Any, *edits: Any) -> Iterator[Any]:
    """Context manager: ``with apply_carrier_edits(hf_model, MLPCarrierScale(0.0)): hf_model(ids)``;
    the hooks are removed on exit, also when the body raises."""
    handle = install_carrier_edits(model, *edits)
    try:
        yield model
    finally:
        handle.remove()


def _keep_input(state: dict):
    def pre_hook(module, args, kwargs):  # noqa: ARG001
        state["x"] = args[0] if args else next(iter(kwargs.values()))

    return pre_hook


def _scales(s_par, s_perp, layer, t: Tensor, dtype):
    batch = t.shape[0]
    return (s_par.at(layer, batch, t.device, dtype)[:, :1], s_perp.at(layer, batch, t.device, dtype)[:, :1])


def _input_hook(edit, layer, state, s_par, s_perp):
    def pre_hook(module, args):  # noqa: ARG001
        h, x = args[0], state.pop("x")
        dtype = compute_dtype(torch.promote_types(h.dtype, x.dtype))
        sp, sq = _scales(s_par, s_perp, layer, h, dtype)
        delta = carrier_input_delta(h, x, sp, sq, edit.eps, edit.remainder)
        return (cast_back(h.to(delta.dtype) + delta, h, edit, layer), *args[1:])

    return pre_hook


def _block_hook(edit, layer, down, s_par, s_perp):
    def hook(module, args, output):  # noqa: ARG001
        h, w = args[0], _down_weight(down)
        dtype = compute_dtype(torch.promote_types(h.dtype, w.dtype))
        sp, sq = _scales(s_par, s_perp, layer, output, dtype)
        delta = carrier_block_delta(h, w, sp, sq, edit.eps, edit.remainder)
        return cast_back(output.to(delta.dtype) + delta, output, edit, layer)

    return hook


__all__ = ["DOWN_PROJECTIONS", "HFCarrierHandle", "apply_carrier_edits", "install_carrier_edits"]
