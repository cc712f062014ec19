"""The :class:`Lane` protocol: what differs between the kinds of model the package takes (the
two TransformerLens generations and plain ``transformers``).

A lane is a frozen singleton (a ``str`` subclass whose value is its name, ``"bridge"``,
``"legacy"`` or ``"transformers"``, so that records written to JSON keep the plain name). Each
method takes the model as its first argument; the implementations live in
:mod:`tl_directional.model.lanes.bridge`, :mod:`tl_directional.model.lanes.legacy` and
:mod:`tl_directional.model.lanes.transformers`, and the methods here are the ones the two
TransformerLens lanes share (they use only TransformerLens's public hook API, identical on both
generations) and the deep copy that the legacy and plain lanes share.

This module imports nothing from the package; ``transformers`` is imported inside functions.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

#: One linear of a block as the lanes hand it to :mod:`tl_directional.compression.compressors`:
#: ``(key, (out, in), get, set)``; ``get()`` returns an ``[out, in]`` float copy, ``set(m)``
#: writes an ``[out, in]`` matrix back in place.
LinearSpec = tuple[str, tuple[int, int], Callable[[], Tensor], Callable[[Tensor], None]]


class BlockInput:
    """The residual entering block ``start`` in one batch's unedited forward, and how the
    model's blocks return their output (``"tensor"``, ``"tuple1"`` or None if unknown; needed to
    skip blocks on the bridge). Made by :func:`tl_directional.model.handle.forward_recording_block_input`;
    fed back by :meth:`Lane.from_block`."""

    def __init__(self, start: int, resid: Tensor, output_form: str | None):
        self.start, self.resid, self.output_form = start, resid, output_form


class Unembedding:
    """How a model's logits follow from one hook point: ``hook`` carries ``[batch, pos,
    d_model]`` and :meth:`logits` maps rows of it to their logits with the model's own modules
    (bridge: the unembedding's input, through ``model.unembed``; legacy: the last block's
    ``resid_post``, through ``ln_final`` and ``unembed``). Lets a caller that only reduces the
    logits (the sweep's metrics) compute them a chunk of positions at a time instead of
    holding ``[batch, pos, vocab]``. Made by :meth:`Lane.unembedding`."""

    def __init__(self, hook: str, modules: tuple):
        self.hook, self._modules = hook, modules

    def logits(self, rows: Tensor) -> Tensor:
        """``[n, d_model]`` rows at :attr:`hook` -> their ``[n, vocab]`` logits."""
        x = rows.unsqueeze(0)
        for module in self._modules:
            x = module(x)
        return x.squeeze(0)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence ``transformers``' progress bars (shard writing / weight loading) for a block.

    transformers 5 draws a tqdm bar on every ``save_pretrained`` / ``from_pretrained``; for
    models this small that is pure noise. The caller's setting is restored afterwards.
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def float_copy(t: Tensor) -> Tensor:
    """A detached float32 copy of ``t`` (float64 stays float64)."""
    return t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32).clone()


#: The lane singletons, by name (each is built once, in :mod:`tl_directional.model.lanes`).
BUILT: dict[str, "Lane"] = {}


class Lane(str):
    """One kind of model (a TransformerLens generation, or plain ``transformers``): everything the
    package does differently on it.

    Get the lane of a model with :func:`tl_directional.model.lanes.lane_of`; never construct one (the
    three instances are :data:`tl_directional.model.lanes.BRIDGE`,
    :data:`tl_directional.model.lanes.LEGACY` and :data:`tl_directional.model.lanes.TRANSFORMERS`).
    ``str(lane)`` / :attr:`name` is ``"bridge"``, ``"legacy"`` or ``"transformers"`` (what records
    store). Callers ask the lane's capabilities (:attr:`hook_kind`, :attr:`hf_export`,
    :attr:`resolves_encoders`) and methods instead of comparing names.
    """

    __slots__ = ()

    def __new__(cls, name: str):
        lane = super().__new__(cls, name)
        BUILT.setdefault(name, lane)
        return BUILT[name]

    #: Whether a model on this lane wraps a ``transformers`` model whose weights are written back
    #: as a plain Hugging Face directory (:meth:`to_hf_model` builds it, :meth:`save_hf_directory`
    #: writes it; a plain ``transformers`` model needs no export: it is its own HF model).
    hf_export: bool = False
    #: Whether post-LN encoders (BERT) are a supported model on this lane.
    resolves_encoders: bool = False
    #: The ``pip`` requirement that provides this lane.
    requirement: str = ""
    #: How edits and captures attach to a model of this lane: ``"transformer_lens"`` (hook points,
    #: ``model.hooks(fwd_hooks=...)``) or ``"module"`` (torch module hooks on a plain
    #: ``transformers`` model, :mod:`tl_directional.edit.hf`). What the edit floor dispatches on.
    hook_kind: str = "transformer_lens"

    @property
    def name(self) -> str:
        """``"bridge"``, ``"legacy"`` or ``"transformers"``, as a plain ``str``."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<lane {self.name!r}>"

    def __reduce__(self):  # pickles as the singleton, not as a new instance
        return (built_lane, (self.name,))

    def family_refusal(self, family) -> str:
        """Why this lane refuses a model family (a :class:`~tl_directional.model.families.Family`),
        "" if it loads."""
        raise NotImplementedError

    # -- the model's own structure -------------------------------------------------------------

    def claims(self, model) -> bool:
        """Whether ``model`` is a model of this lane (:func:`~tl_directional.model.lanes.lane_of`
        asks the lanes in :data:`~tl_directional.model.lanes.LANES` order and takes the first:
        a bridge also has the hook API that the legacy lane claims)."""
        raise NotImplementedError

    def hook_layout_key(self, model) -> tuple:
        """A cheap identity of the model's set of hook point names (changes when one is added or
        removed): what :func:`tl_directional.model.sites.resolve_sites` keys its cache on."""
        raise NotImplementedError

    def weights_processed_flag(self, model) -> bool | None:
        """The model's own record of whether its weights were processed, where it has one."""
        return None

    def final_norm_weight(self, model) -> Tensor | None:
        """Effective gain of the final norm (``ln_final``), ``[d_model]``, or None without a gain."""
        raise NotImplementedError

    def linear_inputs(self, model, layer: int, hook_names) -> dict[str, tuple[str, Tensor | None]]:
        """``{key: (hook, scale)}`` of the attention / MLP linears of block ``layer`` (see
        :func:`tl_directional.model.weights.linear_input_hooks`); ``hook_names`` is the model's
        ``hook_dict`` (read once by the caller)."""
        raise NotImplementedError

    def linear_weights(self, model, layer: int) -> list[LinearSpec]:
        """The attention / MLP linears of block ``layer`` as ``[out, in]`` :data:`LinearSpec` s."""
        raise NotImplementedError

    def output_biases(self, model, layer: int) -> list[Tensor]:
        """The output biases of block ``layer``'s attention and MLP (those that exist)."""
        raise NotImplementedError

    def native_state_dict(self, model, *, keep_vars: bool = False) -> dict[str, Tensor]:
        """The weights under the names the lane stores them by (the HF names on the bridge,
        TL's ``blocks.0.attn.W_Q`` ... on the legacy lane)."""
        return dict(model.state_dict(keep_vars=keep_vars))

    # -- loading, copying, saving --------------------------------------------------------------

    def boot_by_name(self, name: str, *, device: Any, dtype: torch.dtype):
        """A model of this lane from a TransformerLens / hub model name (eval mode)."""
        raise NotImplementedError

    def load_dir(self, path, *, device: Any, dtype: torch.dtype):
        """A model of this lane from a Hugging Face model directory."""
        raise NotImplementedError

    def clone(self, model):
        """An independent copy of ``model`` whose weights can be changed freely."""
        raise NotImplementedError

    def to_hf_model(self, model):
        """A plain ``transformers`` model holding ``model``'s weights (lanes with :attr:`hf_export`)."""
        raise NotImplementedError("to_hf_model needs a TransformerLens 4 bridge model")

    def save_hf_directory(self, model, directory, *, tokenizer: Any = None) -> None:
        """Write ``model`` (and ``tokenizer``) as a Hugging Face directory (lanes with :attr:`hf_export`)."""
        self.to_hf_model(model)  # raises with the reason
        raise NotImplementedError  # pragma: no cover

    # -- hooks -----------------------------------------------------------------------------------

    def add_hook_point(self, model, name: str, hook_point) -> None:
        """Register an extra ``HookPoint`` under ``name`` (see
        :func:`tl_directional.model.handle.add_hook_point`); ``name`` is new (checked by the caller)."""
        raise NotImplementedError

    def remove_hook_point(self, model, name: str) -> None:
        """Undo :meth:`add_hook_point` (a missing name is ignored)."""
        raise NotImplementedError

    def add_last_hook(self, hook_point, fn) -> Callable[[], None]:
        """Add ``fn`` as a permanent hook of ``hook_point`` that always runs *last*; returns a
        callable that removes exactly it (other hooks stay).

        HookPoint hooks are PyTorch forward hooks on the hook point module (both lanes:
        ``HookPoint.add_hook`` calls ``register_forward_hook``), run in registration order,
        so hooks added later (edits, ``run_with_cache``'s cache hooks, user hooks) would run
        after ours. A forward pre-hook, which PyTorch runs before it reads the forward hooks,
        moves ours to the end of the hook point's ``_forward_hooks`` on every call (one dict
        operation). The handle bookkeeping (``HookPoint.fwd_hooks`` of ``LensHandle`` s) is
        the same on both lanes.
        """
        before = list(hook_point.fwd_hooks)
        hook_point.add_hook(fn, dir="fwd", is_permanent=True)
        ours = [h for h in hook_point.fwd_hooks if h not in before]
        keepers = [hook_point.register_forward_pre_hook(_keep_last(h.hook.id)) for h in ours]

        def remove() -> None:
            for h in ours:
                for i, other in enumerate(hook_point.fwd_hooks):
                    if other is h:
                        h.hook.remove()
                        del hook_point.fwd_hooks[i]
                        break
            for k in keepers:
                k.remove()
            ours.clear()
            keepers.clear()

        return remove

    # -- partial forwards and the unembedding ---------------------------------------------------

    @contextlib.contextmanager
    def from_block(self, model, block_input: BlockInput, repeat: int = 1) -> Iterator:
        """Within: ``run(tokens, attention_mask) -> logits``, a forward that starts at block
        ``block_input.start`` from the recorded residual (see
        :func:`tl_directional.model.handle.from_block`).

        This shared form: the earlier blocks are replaced for the call by pass-throughs (the
        wrapped HF model still builds its masks and positions from ``tokens``) and the residual
        is put in at block ``start``'s ``hook_resid_pre``. With an unknown block output form the
        earlier blocks run (exact, not faster).
        """
        b = block_input
        resid = b.resid.repeat(repeat, 1, 1) if repeat > 1 else b.resid

        def inject(t, hook):  # noqa: ARG001 - TL hook signature
            return resid

        def run(tokens, attention_mask):
            return model(tokens, attention_mask=attention_mask)

        with blocks_passed_through(model, b.start, b.output_form), \
                model.hooks(fwd_hooks=[(f"blocks.{b.start}.hook_resid_pre", inject)]):
            yield run

    def unembedding(self, model) -> Unembedding | None:
        """The :class:`Unembedding` of ``model``, or None where the logits are not exactly the
        unembedding of one hook point."""
        raise NotImplementedError

    # -- generate --------------------------------------------------------------------------------

    def wrap_generate(self, model, original):
        """``original`` (``model.generate``) with this lane's fix (see
        :mod:`tl_directional.model.generation`)."""
        raise NotImplementedError


def _keep_last(hook_id):
    def pre_hook(module, args):  # noqa: ARG001
        hooks = module._forward_hooks
        if hook_id in hooks:
            hooks.move_to_end(hook_id)
    return pre_hook


@contextlib.contextmanager
def blocks_passed_through(model, stop: int, output_form: str | None) -> Iterator[None]:
    """Within: blocks ``0..stop-1`` return their input unchanged (in ``output_form``); no-op
    when the form is unknown."""
    patched: list = []
    if output_form is not None:
        tuple_out = output_form == "tuple1"

        def passthrough(*args, **kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            return (h,) if tuple_out else h

        for L in range(stop):
            block = model.blocks[L]
            patched.append((block, block.__dict__.get("forward")))
            # straight into the instance dict: the bridge's __setattr__ would forward the
            # assignment to the wrapped HF module
            object.__setattr__(block, "forward", passthrough)
    try:
        yield
    finally:
        for block, fwd in reversed(patched):
            if fwd is None:
                block.__dict__.pop("forward", None)
            else:
                object.__setattr__(block, "forward", fwd)


def _shared_storage_groups(model) -> dict[int, list[tuple[str, int, tuple, tuple]]]:
    """Parameters that share one storage (views), grouped by storage pointer."""
    groups: dict[int, list[tuple[str, int, tuple, tuple]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        key = p.untyped_storage().data_ptr()
        groups.setdefault(key, []).append((name, p.storage_offset(), tuple(p.shape), p.stride()))
    return {k: v for k, v in groups.items() if len({n for n, *_ in v}) > 1}


def deep_copy_model(model):
    """``copy.deepcopy(model)`` in eval mode, for a model whose copy is safe to deep-copy (the
    legacy ``HookedTransformer``, a plain ``transformers`` model): tensors cached by a previous
    forward that are not graph leaves are detached first (deepcopy refuses them), parameters that
    were views of one storage are re-tied in the copy, and TransformerLens hooks (where the
    model has ``reset_hooks``) are removed from the copy."""
    for mod in model.modules():
        for k, v in list(vars(mod).items()):
            if isinstance(v, Tensor) and not isinstance(v, torch.nn.Parameter) and v.grad_fn is not None:
                setattr(mod, k, v.detach())
    groups = _shared_storage_groups(model)
    clone = copy.deepcopy(model)
    if groups:
        params = dict(clone.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for members in groups.values():
                # the owner: the member that covers the most elements
                owner = max(members, key=lambda m: math.prod(m[2]))
                base = params[owner[0]]
                for name, offset, shape, stride in members:
                    p = params[name]
                    if p.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
                        p.set_(base.untyped_storage(), offset, shape, stride)
    if hasattr(clone, "reset_hooks"):
        clone.reset_hooks()
    clone.eval()
    return clone


def built_lane(name: str) -> Lane:
    """The lane singleton called ``name`` (how a pickled lane comes back as the same object)."""
    return BUILT[name]


__all__ = ["BUILT", "BlockInput", "Lane", "LinearSpec", "Unembedding", "blocks_passed_through", "built_lane",
           "deep_copy_model", "float_copy", "quiet_transformers"]
