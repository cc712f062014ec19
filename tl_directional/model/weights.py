"""The weights and linear inputs of one block, asked of the model's lane.

The final norm's gain, an attention layer's ``W_O`` / ``b_O``, where each attention / MLP
linear reads its input (compression calibration) and the MLP branch as a callable.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float
from torch import Tensor

from .handle import is_encoder, is_parallel
from .indices import check_layer
from .lanes import lane_of
from .sites import SiteResolutionError
from .structure import is_sandwich_norm


def final_norm_weight(model) -> Tensor | None:
    """Effective gain of the final norm (``ln_final``), ``[d_model]``, or None without a gain.

    HF's ``Gemma*RMSNorm`` computes ``x * (1 + weight)``: on the bridge (which wraps the HF
    module and exposes its raw ``weight`` as ``w``) the gain is ``1 + weight``; the legacy
    converters fold the 1 into ``ln_final.w`` already.
    """
    return lane_of(model).final_norm_weight(model)


def attention_output_weights(model, layer: int) -> tuple[Float[Tensor, "n_heads d_head d_model"], Float[Tensor, " d_model"] | None]:
    """``(W_O, b_O)`` of one layer; ``b_O`` is None when the model has no output bias."""
    attn = model.blocks[layer].attn
    b_o = getattr(attn, "b_O", None)
    return attn.W_O, b_o


@dataclass(frozen=True)
class LinearInput:
    """Where the input of one attention / MLP linear layer can be read (compression calibration).

    ``key`` names the linear within its block (``"attn.q"``, ``"attn.k"``, ``"attn.v"``,
    ``"attn.o"``, ``"mlp.in"``, ``"mlp.gate"``, ``"mlp.out"``); ``hook`` is the hook point whose
    activation, with heads flattened when it is ``[batch, pos, head, d_head]`` and multiplied by
    ``scale`` along the last axis when ``scale`` is not None, is that linear's input.
    """

    key: str
    hook: str
    scale: Tensor | None = None


def linear_input_hooks(model, layer: int) -> dict[str, LinearInput]:
    """``{key: LinearInput}`` for the attention and MLP linears of one block.

    Bridge (TL 4): each wrapped linear has its own ``blocks.L.<attn|mlp>.<name>.hook_in``; the
    combined ``qkv`` of GPT-2 / NeoX is skipped (its split ``q``, ``k``, ``v`` are what forward
    reads). Legacy (``HookedTransformer``): ``W_Q/W_K/W_V`` read ``ln1.hook_normalized``
    (times ``ln1.w`` for RMSNorm, whose hook fires before the weight), ``W_O`` reads
    ``attn.hook_z``, ``W_in``/``W_gate`` read ``ln2.hook_normalized``, ``W_out`` reads
    ``mlp.hook_post``.
    """
    layer = check_layer(layer, int(model.cfg.n_layers), "layer")
    hook_dict = model.hook_dict
    out = {key: LinearInput(key, hook, scale)
           for key, (hook, scale) in lane_of(model).linear_inputs(model, layer, hook_dict).items()}
    missing = [li.hook for li in out.values() if li.hook not in hook_dict]
    if missing:
        raise SiteResolutionError(f"layer {layer}: no hook point(s) {sorted(set(missing))} for linear inputs")
    return out


def mlp_branch(model, layer: int):
    """A callable mapping a sequential pre-LN block's MLP reference stream (``resid_mid``)
    to its MLP update (``ln2`` then ``mlp``), or None where that is not the structure
    (parallel / post-LN blocks, sandwich norms). Callers should still check it against the
    block's own ``hook_mlp_out`` once before trusting it."""
    if is_encoder(model) or is_parallel(model):
        return None
    if is_sandwich_norm(model):
        return None
    block = model.blocks[layer]
    ln2, mlp = getattr(block, "ln2", None), getattr(block, "mlp", None)
    if ln2 is None or mlp is None or getattr(block, "ln2_post", None) is not None:
        return None
    return lambda x: mlp(ln2(x))
