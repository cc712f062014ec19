"""What the analyses do with a loaded model handle: its device and architecture flags, capture
hooks and early stops, partial forwards, extra hook points, the unembedding, clone and HF export.
(Named for that job; TransformerLens's "adapters" are its per-architecture bridge classes, which
this module is not.) The lane-neutral parts are written here; the lane-specific ones are
functions of the model that ask its lane.

Two lanes are supported: the TL 4 ``TransformerBridge`` (``"bridge"``: a wrapper around a
Hugging Face ``transformers`` model) and the legacy ``HookedTransformer`` (``"legacy"``: TL 2.x /
3.x, TL-format weights ``W_Q [head, d_model, d_head]`` ...). How they differ lives in one object
per lane, :mod:`tl_directional.model.lanes` (:func:`lane_of` returns it); the functions here that
differ by lane (HF modules and HF save, clone, extra hook points, partial forwards, the
unembedding) ask the model's lane. The rest is the same on both: device, architecture flags,
capture hooks, early stop.

This module sits below :mod:`tl_directional.model.sites` and imports only :mod:`tl_directional.model.lanes`
from the package. ``transformer_lens`` and ``transformers`` are imported inside the functions
that need them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .families import BY_ARCH
from .generation import carry_generate_fix
from .lanes import (
    BlockInput,
    Unembedding,
    lane_of,
)
from .lanes.bridge import hf_state_dict as _bridge_hf_state_dict

# ---------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------


def device_of(model) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover - every TL model has parameters
        return torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Architecture flags
# ---------------------------------------------------------------------------------------------


def architecture_name(model) -> str:
    """The HF architecture class name (``cfg.original_architecture`` on the legacy
    lane, ``cfg.architecture`` on the bridge), or ""."""
    cfg = model.cfg
    for name in ("original_architecture", "architecture"):
        value = getattr(cfg, name, None)
        if value is not None:
            return str(value or "")
    return ""


def is_encoder(model) -> bool:
    """Whether ``model`` is a post-LN bidirectional encoder (BERT family): each update is added
    before a LayerNorm, attention is not causal, there is no block update. Read from the
    family record (``Family.encoder``); an
    architecture outside the registry counts as one when its name says BERT."""
    return encoder_architecture(architecture_name(model))


def encoder_architecture(name: str) -> bool:
    """Whether HF architecture ``name`` is a post-LN encoder (see :func:`is_encoder`)."""
    family = BY_ARCH.get(name)
    return family.encoder if family is not None else "Bert" in name


def is_parallel(model) -> bool:
    """Whether attention and MLP read the same stream (GPT-J, Pythia / NeoX)."""
    return bool(getattr(model.cfg, "parallel_attn_mlp", False))


# ---------------------------------------------------------------------------------------------
# The Hugging Face side of a bridge
# ---------------------------------------------------------------------------------------------


def hf_state_dict(model, *, keep_vars: bool = False) -> dict[str, Tensor]:
    """The wrapped HF model's state dict of a bridge under the HF model's own names
    (what ``save_pretrained`` of the unwrapped model holds)."""
    return _bridge_hf_state_dict(model, keep_vars=keep_vars)


def to_hf_model(model):
    """A plain ``transformers`` model (fresh, same class and config) holding a bridge's weights.

    The bridge's own ``save_pretrained`` path fails on GPT-2's split-qkv views, so every
    parameter of a fresh model is read, name by name, through the wrappers.

    A plain ``transformers`` model (:data:`tl_directional.model.lanes.TRANSFORMERS`) is returned as is.

    Raises:
        NotImplementedError: ``model`` is not on a lane with HF export (the legacy lane).
    """
    return lane_of(model).to_hf_model(model)


def save_hf_directory(model, directory, *, tokenizer: Any = None) -> None:
    """Write a bridge model's weights (via :func:`to_hf_model`) and ``tokenizer`` (when given)
    into ``directory`` with ``save_pretrained``. The caller owns atomicity (``replace_dir``)."""
    lane_of(model).save_hf_directory(model, directory, tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------
# Clone
# ---------------------------------------------------------------------------------------------


def clone_model(model):
    """An independent copy of a TransformerLens model whose weights can be changed freely.

    Legacy ``HookedTransformer``: ``copy.deepcopy`` (tensors cached by a previous forward
    that are not graph leaves are detached first, since deepcopy refuses them).

    ``TransformerBridge``: a deep copy is *not* safe. The bridge wires some hook points
    through forward hooks whose closures point at the original's hook points (BERT's
    ``mlp.hook_out`` on a deep copy fires on the original model, not on the copy), and
    GPT-2's split ``q, k, v`` weights stop being views into the fused weight. So the bridge
    is booted afresh from the directory or name it was loaded from, and every parameter and
    buffer of the wrapped ``transformers`` model is copied over; the copy is then checked
    to give the same logits as the original on a probe sequence.

    A plain ``transformers`` model is deep-copied like the legacy lane's.

    A copy of a model whose ``generate`` was fixed (:func:`tl_directional.model.generation.fix_generate`,
    done by :func:`~tl_directional.model.load.load_model`) gets its own fixed ``generate``.
    """
    return carry_generate_fix(model, lane_of(model).clone(model))


# ---------------------------------------------------------------------------------------------
# Extra hook points
# ---------------------------------------------------------------------------------------------


def add_hook_point(model, name: str, hook_point) -> None:
    """Register an extra ``HookPoint`` under ``name`` so that ``run_with_hooks``,
    ``run_with_cache``, ``hooks()``, ``reset_hooks`` and ``model.hook_dict`` see it (both lanes).

    Legacy ``HookedTransformer`` (TL 2.x / 3.x), the public route: where ``name`` is
    ``<an existing module>.<child>`` the hook point becomes a real submodule of that module (the
    SAELens way) and ``HookedRootModule.setup()`` rebuilds ``hook_dict`` / ``mod_dict`` from
    ``named_modules``; a name with no module above it (an alias such as TL's
    ``blocks.L.hook_z.hook_par`` spelling) is an entry of those two public dicts.

    TL 4 ``TransformerBridge`` (checked on TL 4.3): there is no public call to add a hook point.
    ``hook_dict`` is built from the bridge's private ``_hook_registry``; the public
    ``clear_hook_registry()`` has only a private re-scan (``_initialize_hook_registry``), and the
    scan would name a nested point by its component path, not by the TL names the package uses.
    So the bridge lane (:meth:`tl_directional.model.lanes.bridge.BridgeLane.add_hook_point`) is the one
    place that writes the private registry.
    """
    if name in getattr(model, "hook_dict", ()):  # a plain transformers model has none: its lane refuses
        raise ValueError(f"hook point {name!r} already exists on this model; remove it first")
    hook_point.name = name
    lane_of(model).add_hook_point(model, name, hook_point)


def remove_hook_point(model, name: str) -> None:
    """Undo :func:`add_hook_point` (a missing name is ignored)."""
    lane_of(model).remove_hook_point(model, name)


# ---------------------------------------------------------------------------------------------
# Capturing activations
# ---------------------------------------------------------------------------------------------


def hook_state(model, names) -> tuple:
    """An identity of the hooks now attached to the hook points ``names`` of ``model`` (and
    their modules' other forward hooks): torch gives every registered hook a fresh id, so the
    tuple changes whenever a hook is added or removed there."""
    out = []
    for name in sorted(names):
        hp = model.hook_dict.get(name)
        out.append((name, tuple(getattr(hp, "_forward_hooks", {}).keys()),
                    tuple(getattr(hp, "_forward_pre_hooks", {}).keys())))
    return tuple(out)


def capture_hooks(names, store: dict, *, clone: bool = False) -> list[tuple[str, Any]]:
    """Forward hooks, one per hook point in ``names`` (sorted, repeats dropped), that keep the
    activation there in ``store[name]`` (detached; copied when ``clone``) and change nothing.

    The building block of :func:`capture`, for callers that add hooks of their own to the
    same forward (an edit, an early stop)."""

    def keep(name):
        def hook(tensor, hook):  # noqa: ARG001 - TL hook signature
            store[name] = tensor.detach().clone() if clone else tensor.detach()
            return tensor

        return hook

    return [(n, keep(n)) for n in sorted(set(names))]


def capture(model, tokens: Tensor, names, *, attention_mask: Tensor | None = None, clone: bool = False,
            logits: bool = False) -> tuple[Tensor | None, dict[str, Tensor]]:
    """One no-grad forward keeping the activations at the hook points ``names``.

    Returns ``(output, {name: tensor})``: ``output`` is the logits when ``logits`` (else None,
    skipping the unembedding: ``[batch, pos, vocab]`` is 1 GB at 8 x 128 tokens for a 262k
    vocabulary); tensors are detached, and copied when ``clone`` (for callers that keep them
    past another forward that may write in place).
    """
    store: dict[str, Tensor] = {}
    kwargs: dict[str, Any] = {} if attention_mask is None else {"attention_mask": attention_mask}
    if not logits:
        kwargs["return_type"] = None
    with torch.no_grad():
        out = model.run_with_hooks(tokens, fwd_hooks=capture_hooks(names, store, clone=clone), **kwargs)
    return (out if logits else None), store


# ---------------------------------------------------------------------------------------------
# Partial forwards: stopping early, starting from a recorded block input
# ---------------------------------------------------------------------------------------------


class StopForward(Exception):  # noqa: N818 - control flow, not an error
    """Raised from a hook to end a forward pass whose remaining part is not needed (later
    blocks, the final norm, the unembedding); :func:`run_hooked` catches it."""


def _raise_stop(tensor, hook):  # noqa: ARG001 - TL hook signature
    raise StopForward


def run_hooked(model, tokens: Tensor, attention_mask: Tensor | None, fwd_hooks, stop_at: str | None = None) -> None:
    """One forward (``return_type=None``) with ``fwd_hooks`` on; with ``stop_at``, the forward
    ends right after the hook point ``stop_at`` fired (its own hooks in ``fwd_hooks`` run first).
    Hooks may also raise :class:`StopForward` themselves."""
    hooks = list(fwd_hooks) + ([(stop_at, _raise_stop)] if stop_at is not None else [])
    try:
        model.run_with_hooks(tokens, attention_mask=attention_mask, return_type=None, fwd_hooks=hooks)
    except StopForward:
        pass


def forward_recording_block_input(model, tokens: Tensor, attention_mask: Tensor | None,
                                  start: int) -> tuple[Tensor, BlockInput]:
    """A plain forward (logits) that also records ``blocks.{start}.hook_resid_pre`` (copied)
    and, on the bridge, the form of block 0's output."""
    got: dict = {}

    def keep(t, hook):  # noqa: ARG001 - TL hook signature
        got["resid"] = t.detach().clone()

    def form(module, args, output):  # noqa: ARG001 - torch forward-hook signature
        got["form"] = ("tensor" if isinstance(output, Tensor) else
                       "tuple1" if isinstance(output, tuple) and len(output) == 1 else None)

    handle = model.blocks[0].register_forward_hook(form)
    try:
        with model.hooks(fwd_hooks=[(f"blocks.{start}.hook_resid_pre", keep)]):
            logits = model(tokens, attention_mask=attention_mask)
    finally:
        handle.remove()
    return logits, BlockInput(start, got["resid"], got.get("form"))


def forward_from_block(model, tokens: Tensor, attention_mask: Tensor | None, block_input: BlockInput,
                       repeat: int = 1) -> Tensor:
    """The logits of a forward that starts at block ``block_input.start`` from the recorded
    residual, without computing the blocks before it (see :func:`from_block`)."""
    with from_block(model, block_input, repeat) as run:
        return run(tokens, attention_mask)


@contextlib.contextmanager
def from_block(model, block_input: BlockInput, repeat: int = 1) -> Iterator:
    """Within: ``run(tokens, attention_mask) -> logits``, a forward that starts at block
    ``block_input.start`` from the recorded residual (repeated ``repeat`` times along the
    batch, for ``tokens`` stacked as many times) and computes no block before it. Hooks added
    inside the context fire from block ``start`` on, after the residual is put in (so an edit
    reading ``hook_resid_pre`` of block ``start`` sees the recorded residual).

    Legacy: ``HookedTransformer.forward(resid, start_at_layer=start, attention_mask=...)``
    (no embedding either). Bridge: its own ``start_at_layer`` still runs the earlier blocks,
    so they are replaced for the call by pass-throughs (the wrapped HF model still builds its
    masks and positions from ``tokens``) and the residual is put in at block ``start``'s
    ``hook_resid_pre``. With an unknown block output form the earlier blocks run (exact, not
    faster).
    """
    with lane_of(model).from_block(model, block_input, repeat) as run:
        yield run


def unembedding(model) -> Unembedding | None:
    """The :class:`Unembedding` of ``model``, or None where the logits are not exactly the
    unembedding of that hook (logit softcapping or scaling, a missing hook point, an
    unembedding that is not a linear map). Callers still check it once against the model's
    own logits (:func:`unembedding_matches`)."""
    return lane_of(model).unembedding(model)


def unembedding_matches(unembed: Unembedding, hidden: Tensor, logits: Tensor, rows: int = 8) -> bool:
    """Whether :meth:`Unembedding.logits` of the first ``rows`` positions of ``hidden``
    (``[batch, pos, d_model]`` at its hook) reproduces the model's ``logits`` there (relative
    to the largest logit: 1e-10 in float64, 1e-5 in float32, 2e-2 below)."""
    want = logits.reshape(-1, logits.shape[-1])[:rows]
    got = unembed.logits(hidden.reshape(-1, hidden.shape[-1])[:rows])
    if got.shape != want.shape:
        return False
    tol = 1e-10 if want.dtype == torch.float64 else 1e-5 if want.dtype == torch.float32 else 2e-2
    err = float((got.double() - want.double()).abs().max())
    return err <= tol * (float(want.double().abs().max()) + 1.0)


def logits_at(model, tokens: Tensor, batch_index: Tensor, pos_index: Tensor,
              attention_mask: Tensor | None = None) -> Tensor:
    """``[n, d_vocab]``: the model's logits at rows ``(batch_index[k], pos_index[k])`` of one
    forward on ``tokens`` (``[batch, pos]``; both indices ``[n]`` long), with the unembedding
    applied to those rows only: the forward ends at the :class:`Unembedding`'s hook point and
    its modules map the gathered rows. On a large vocabulary (Gemma-3: 262,144) the unembedding
    is most of a small model's forward, so reading a few positions costs a fraction of it.

    Hooks active on the model (an edit's ``model.hooks()`` context) act as in a plain forward,
    except hooks on the final norm or the unembedding, which would see ``[1, n, d_model]`` rows
    instead of ``[batch, pos, d_model]``. Where :func:`unembedding` is None (logit softcapping or
    scaling), the full forward's logits are indexed instead: exact, not faster."""
    unembed = unembedding(model)
    if unembed is None:
        out = model(tokens, attention_mask=attention_mask) if attention_mask is not None else model(tokens)
        return out[batch_index, pos_index]
    got: dict = {}

    def keep(t, hook):  # noqa: ARG001 - TL hook signature
        got["h"] = t

    run_hooked(model, tokens, attention_mask, [(unembed.hook, keep)], stop_at=unembed.hook)
    return unembed.logits(got["h"][batch_index, pos_index])


__all__ = [
    "StopForward",
    "add_hook_point",
    "architecture_name",
    "capture",
    "capture_hooks",
    "clone_model",
    "device_of",
    "forward_from_block",
    "from_block",
    "forward_recording_block_input",
    "hf_state_dict",
    "encoder_architecture",
    "is_encoder",
    "is_parallel",
    "logits_at",
    "remove_hook_point",
    "run_hooked",
    "save_hf_directory",
    "to_hf_model",
    "unembedding",
    "unembedding_matches",
]
