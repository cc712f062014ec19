"""Where an MLP's carrier lives on a TransformerLens model: its input, its carrier and its down
projection, per layer (the hook points and the weight the carrier edits need; METHOD.md sec. 4,
"MLP carrier").

* bridge (TL 4): ``x`` = ``blocks.L.mlp.in.hook_in`` (the input of ``W_in``: the normalised
  stream, norm gain included); ``h`` = ``blocks.L.mlp.out.hook_in`` (TL's ``mlp.hook_post``, the
  input of ``W_out``); the MLP output = ``blocks.L.mlp.out.hook_out`` (``h @ W_out + b_out``).
* legacy (``HookedTransformer``): ``x`` = ``blocks.L.ln2.hook_normalized`` (times ``ln2.w`` for
  RMSNorm, whose hook fires before the gain); ``h`` = ``blocks.L.mlp.hook_post``; the MLP output =
  ``blocks.L.hook_mlp_out``.

``W_down`` is the live ``mlp.W_out`` (``[d_mlp, d_model]``, ``y = h @ W_out``), not a copy, so an
edit built on it is differentiable in the weights too. Gated MLPs (Llama, Qwen, Mistral, Gemma:
``h = phi(W_gate x) * (W_in x)``) and plain ones (GPT-2, NeoX, GPT-J, OPT, BLOOM, BERT:
``h = phi(W_in x)``) are both supported; mixture-of-experts MLPs (Mixtral, Qwen3-MoE, GPT-OSS)
have one carrier per expert and no single ``W_down``, and are refused
(:class:`CarrierUnavailableError`), as is any MLP without the hook points above.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float
from torch import Tensor

from ..core.errors import TLDirectionalError
from .families import BY_ARCH
from .handle import architecture_name
from .indices import check_layer
from .lanes import is_bridge
from .structure import is_sandwich_norm
from .weights import linear_input_hooks


class CarrierUnavailableError(TLDirectionalError, ValueError):
    """The model's MLP has no single separable carrier the carrier edits can read (a
    mixture-of-experts MLP, or hook points missing); the message names the family and the fix."""


@dataclass(frozen=True)
class CarrierSite:
    """The hook points of one layer's MLP carrier.

    ``input_hook`` carries the MLP input ``x`` (``[batch, pos, d_model]``; multiply by
    ``input_scale`` along the last axis when it is not None: legacy RMSNorm); ``carrier_hook``
    carries ``h`` (``[batch, pos, d_mlp]``), whose edit reaches ``W_down``; ``output_hook``
    carries the MLP output ``h @ W_down + b`` (``[batch, pos, d_model]``), or None where it is not
    the down projection's own output (legacy sandwich-norm models, whose ``hook_mlp_out`` follows
    a norm).
    """

    layer: int
    input_hook: str
    input_scale: Tensor | None
    carrier_hook: str
    output_hook: str | None
    gated: bool
    d_mlp: int


def _refuse_moe(model) -> None:
    name = architecture_name(model)
    family = BY_ARCH.get(name)
    if (family is not None and family.layout.moe) or "Moe" in name or "Mixtral" in name:
        raise CarrierUnavailableError(
            f"{name or type(model).__name__} has a mixture-of-experts MLP: each expert has its own carrier "
            "and down projection, so there is no single carrier h to cut into blocks. The carrier edits "
            "need a dense MLP (gated: Llama, Qwen, Mistral, Gemma; plain: GPT-2, NeoX, GPT-J, OPT); on "
            "this model use the residual MLP edit (ResidualScale('mlp') / space 'resid-mlp') instead")


def carrier_site(model, layer: int) -> CarrierSite:
    """The :class:`CarrierSite` of block ``layer``; :class:`CarrierUnavailableError` when its MLP has
    no separable carrier (mixture of experts, missing hook points)."""
    _refuse_moe(model)
    layer = check_layer(layer, int(model.cfg.n_layers), "layer")
    block = model.blocks[layer]
    mlp = getattr(block, "mlp", None)
    if mlp is None:
        raise CarrierUnavailableError(f"block {layer} of {type(model).__name__} has no MLP; nothing to edit")
    inputs = linear_input_hooks(model, layer)
    if "mlp.in" not in inputs or "mlp.out" not in inputs:
        raise CarrierUnavailableError(
            f"block {layer}: no hook points for the MLP's input and carrier (found {sorted(inputs)}); "
            "the carrier edits need the input of W_in and of W_out")
    hook_dict = model.hook_dict
    b = f"blocks.{layer}"
    if is_bridge(model):
        output = f"{b}.mlp.out.hook_out"
    else:
        output = None if is_sandwich_norm(model) else f"{b}.hook_mlp_out"
    if output is not None and output not in hook_dict:
        output = None
    w_out = mlp.W_out
    return CarrierSite(layer=layer, input_hook=inputs["mlp.in"].hook, input_scale=inputs["mlp.in"].scale,
                       carrier_hook=inputs["mlp.out"].hook, output_hook=output,
                       gated=getattr(mlp, "W_gate", None) is not None, d_mlp=int(w_out.shape[0]))


def down_weight(model, layer: int) -> Float[Tensor, "d_mlp d_model"]:
    """``W_down`` of block ``layer`` in TransformerLens orientation, ``[d_mlp, d_model]``
    (``y = h @ W_down``): the live weight (a view on the bridge), so gradients reach it."""
    return model.blocks[check_layer(layer, int(model.cfg.n_layers), "layer")].mlp.W_out


__all__ = ["CarrierSite", "CarrierUnavailableError", "carrier_site", "down_weight"]
