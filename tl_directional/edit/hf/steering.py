""":class:`~tl_directional.edit.steering.ActivationAddition` on plain ``transformers`` models: the
same object, as torch module hooks on the decoder layers (installed by
:func:`tl_directional.edit.hf.install_edits` with the other edits, in the order given).

Where each site lives on an HF decoder layer:

* ``resid_pre`` of layer ``L``: the layer's input ``hidden_states`` (a forward pre-hook on the
  layer replaces it);
* ``resid_post``: the layer's output (a forward hook), where the ``steering-vectors`` package adds;
* ``resid_mid``: HF adds the attention update to the stream inside the layer, with no module in
  between, so the vector is added to the attention update (the attention module's output;
  sandwich-norm Gemma-3: ``post_attention_layernorm``'s), split against the stream it forms,
  ``resid_pre + attention update``. The sum is then ``resid_pre + (update + alpha v~)`` rather than
  ``(resid_pre + update) + alpha v~``: equal to float round-off, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ...model.hf_layout import HFSites
from ..steering import ActivationAddition
from .value_chain import _Run


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output, new):
    return (new, *output[1:]) if isinstance(output, tuple) else new


def install_steering(add: Callable, sites: HFSites, e: ActivationAddition, run: _Run) -> None:
    """Register ``e``'s module hooks on the model of ``sites`` (``add`` keeps each handle)."""
    ns = sites.model_sites()
    if e.hook == "resid_mid" and sites.parallel:
        raise ValueError(f"hook='resid_mid' does not exist in {sites.model_type}'s parallel attn+MLP blocks "
                         "(both read resid_pre); use hook='resid_pre' or 'resid_post'")
    vectors = e.layer_vectors(ns, weights_processed=False)  # a transformers model holds raw weights
    specs = e.scale_specs(ns)
    for L, vector in vectors.items():
        if e.hook == "resid_pre":
            add(sites.layers[L].register_forward_pre_hook(_pre_hook(e, L, vector, specs, run), with_kwargs=True))
        elif e.hook == "resid_post":
            add(sites.layers[L].register_forward_hook(_post_hook(e, L, vector, specs, run)))
        else:
            state: dict = {}

            def keep(module, args, state=state):  # noqa: ARG001
                if run.on:
                    state["pre"] = args[0]

            add(sites.module(L, sites.layout.attn_norm).register_forward_pre_hook(keep))
            target = sites.module(L, sites.layout.attn_out)
            add(target.register_forward_hook(_mid_hook(e, L, vector, specs, run, state)))


def _pre_hook(e: ActivationAddition, layer: int, vector: Tensor, specs, run: _Run):
    def hook(module, args, kwargs):  # noqa: ARG001
        if not run.on:
            return None
        if args:
            return (e.apply(args[0], vector, layer, run.offset, specs), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": e.apply(kwargs["hidden_states"], vector, layer, run.offset, specs)}

    return hook


def _post_hook(e: ActivationAddition, layer: int, vector: Tensor, specs, run: _Run):
    def hook(module, args, output):  # noqa: ARG001
        if not run.on:
            return None
        return _replace_first(output, e.apply(_first(output), vector, layer, run.offset, specs))

    return hook


def _mid_hook(e: ActivationAddition, layer: int, vector: Tensor, specs, run: _Run, state: dict):
    def hook(module, args, output):  # noqa: ARG001
        if not run.on:
            return None
        update = _first(output)
        stream = state["pre"] + update  # resid_mid, as the layer forms it
        return _replace_first(output, e.apply(stream, vector, layer, run.offset, specs, target=update))

    return hook


__all__ = ["install_steering"]
