"""The one place that knows how the two TransformerLens lanes differ internally.

Two lanes are supported: the TL 4 ``TransformerBridge`` (``"bridge"``: a wrapper around a
Hugging Face ``transformers`` model, each wrapped HF module reachable as a component's
``_original_component``) and the legacy ``HookedTransformer`` (``"legacy"``: TL 2.x / 3.x,
TL-format weights ``W_Q [head, d_model, d_head]`` ...). Everything else in the package asks
this module: which lane a model is on, its device, the HF module behind a bridge component,
the HF state dict and a plain HF copy of a bridge, an independent clone, how to attach an
extra hook point, and the architecture flags (post-LN encoder, parallel blocks).

This module sits below :mod:`tl_directional.sites` and imports nothing from the package.
``transformer_lens`` and ``transformers`` are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch import Tensor

Lane = Literal["bridge", "legacy"]

#: The bridge's attribute holding the wrapped Hugging Face module of a component.
_HF_CHILD = "_original_component"


# ---------------------------------------------------------------------------------------------
# Lanes and devices
# ---------------------------------------------------------------------------------------------


def installed_lane() -> Lane:
    """Which TransformerLens API is installed: ``"legacy"`` when
    ``transformer_lens.HookedTransformer`` exists (TL 2.x / 3.x), else ``"bridge"`` (TL >= 4)."""
    # find_spec, not hasattr: on TL >= 4, touching transformer_lens.HookedTransformer raises
    # ImportError (a migration message) rather than returning False.
    if importlib.util.find_spec("transformer_lens") is None:
        raise ImportError("transformer_lens is not installed: pip install transformer-lens.")
    if importlib.util.find_spec("transformer_lens.HookedTransformer") is not None:
        return "legacy"
    return "bridge"


def lane_of(model) -> Lane:
    """``"bridge"`` for a TL 4 ``TransformerBridge``, ``"legacy"`` for a ``HookedTransformer``."""
    names = {cls.__name__ for cls in type(model).__mro__}
    if "TransformerBridge" in names or "BridgeCore" in names:
        return "bridge"
    return "legacy"


def is_bridge(model) -> bool:
    """Whether ``model`` is on the bridge lane (see :func:`lane_of`)."""
    return lane_of(model) == "bridge"


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
    before a LayerNorm, attention is not causal, there is no block update."""
    return "Bert" in architecture_name(model)


def is_parallel(model) -> bool:
    """Whether attention and MLP read the same stream (GPT-J, Pythia / NeoX)."""
    return bool(getattr(model.cfg, "parallel_attn_mlp", False))


# ---------------------------------------------------------------------------------------------
# The Hugging Face side of a bridge
# ---------------------------------------------------------------------------------------------


def hf_module(component):
    """The Hugging Face module a bridge component wraps (``attn.q`` -> its ``nn.Linear`` /
    ``Conv1D``); follows nested wrappers. A module that wraps nothing is returned as is."""
    obj = component
    while _HF_CHILD in getattr(obj, "_modules", {}):
        obj = obj._modules[_HF_CHILD]
    return obj


def hf_attention_module(attn):
    """The HF attention module behind a bridge attention component (``original_component``
    where the bridge exposes one, else the wrapped child)."""
    return getattr(attn, "original_component", None) or hf_module(attn)


def hf_state_key(name: str) -> str:
    """A bridge-wrapped HF parameter name with the wrapper hops removed
    (``transformer.h.0.attn._original_component.c_attn.weight`` -> ``...attn.c_attn.weight``)."""
    return name.replace(f".{_HF_CHILD}", "").replace(f"{_HF_CHILD}.", "")


def hf_state_dict(model, *, keep_vars: bool = False) -> dict[str, Tensor]:
    """The wrapped HF model's state dict of a bridge under the HF model's own names
    (what ``save_pretrained`` of the unwrapped model holds)."""
    return {hf_state_key(k): v for k, v in model.original_model.state_dict(keep_vars=keep_vars).items()}


def to_hf_model(model):
    """A plain ``transformers`` model (fresh, same class and config) holding a bridge's weights.

    The bridge's own ``save_pretrained`` path fails on GPT-2's split-qkv views, so every
    parameter of a fresh model is read, name by name, through the wrappers.
    """
    import transformers

    if lane_of(model) != "bridge":
        raise NotImplementedError("to_hf_model needs a TransformerLens 4 bridge model")
    hf = model.original_model
    config = hf.config
    arch = (getattr(config, "architectures", None) or [type(hf_module(hf)).__name__])[0]
    fresh = getattr(transformers, arch)(config)
    with torch.no_grad():
        for name, p in fresh.named_parameters():
            obj = hf
            for part in name.split("."):
                obj = getattr(hf_module(obj), part)
            p.copy_(obj.detach().to(p.dtype))
    return fresh


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


def save_hf_directory(model, directory, *, tokenizer: Any = None) -> None:
    """Write a bridge model's weights (via :func:`to_hf_model`) and ``tokenizer`` (when given)
    into ``directory`` with ``save_pretrained``. The caller owns atomicity (``replace_dir``)."""
    fresh = to_hf_model(model)
    with quiet_transformers():
        fresh.save_pretrained(str(directory))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


# ---------------------------------------------------------------------------------------------
# Clone
# ---------------------------------------------------------------------------------------------


def _shared_storage_groups(model) -> dict[int, list[tuple[str, int, tuple, tuple]]]:
    """Parameters that share one storage (views), grouped by storage pointer."""
    groups: dict[int, list[tuple[str, int, tuple, tuple]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        key = p.untyped_storage().data_ptr()
        groups.setdefault(key, []).append((name, p.storage_offset(), tuple(p.shape), p.stride()))
    return {k: v for k, v in groups.items() if len({n for n, *_ in v}) > 1}


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
    """
    if lane_of(model) == "bridge":
        return _reboot_bridge(model)
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


def _reboot_bridge(model):
    from transformer_lens.model_bridge import TransformerBridge

    hf = model.original_model
    source = getattr(hf.config, "_name_or_path", None) or getattr(model.cfg, "model_name", None)
    if not source:
        raise ValueError("cannot copy this TransformerBridge: it records no directory or model name "
                         "to boot a fresh copy from (config._name_or_path is empty)")
    param = next(hf.parameters())
    try:
        with quiet_transformers():
            fresh = TransformerBridge.boot_transformers(str(source), device=param.device, dtype=param.dtype)
    except Exception as exc:  # pragma: no cover - depends on what the source is
        raise ValueError(f"cannot copy this TransformerBridge: booting a fresh copy from {source!r} "
                         f"failed ({type(exc).__name__}: {exc})") from exc
    state = hf.state_dict()
    with torch.no_grad():
        missing, unexpected = fresh.original_model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"cannot copy this TransformerBridge: the fresh copy booted from {source!r} has "
                         f"a different structure (missing {missing[:3]}, unexpected {unexpected[:3]})")
    fresh.eval()
    probe = torch.arange(min(8, int(model.cfg.d_vocab)), device=param.device).unsqueeze(0)
    with torch.no_grad():
        same = torch.equal(model(probe), fresh(probe))
    if not same:
        raise ValueError(f"cannot copy this TransformerBridge: a fresh copy booted from {source!r} with "
                         "the same weights gives different logits")
    return fresh


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
    So this is the one place that writes the private registry.
    """
    if name in model.hook_dict:
        raise ValueError(f"hook point {name!r} already exists on this model; remove it first")
    hook_point.name = name
    if lane_of(model) == "bridge":
        model._hook_registry[name] = hook_point  # no public registration in TL 4.3 (see above)
        return
    parent_name, _, child = name.rpartition(".")
    parent = model.mod_dict.get(parent_name) if parent_name else None
    if parent is not None and child.isidentifier() and child not in parent._modules and not hasattr(parent, child):
        parent.add_module(child, hook_point)
        _legacy_setup(model)
    else:
        model.hook_dict[name] = hook_point
        model.mod_dict[name] = hook_point


def remove_hook_point(model, name: str) -> None:
    """Undo :func:`add_hook_point` (a missing name is ignored)."""
    if lane_of(model) == "bridge":
        model._hook_registry.pop(name, None)
        return
    parent_name, _, child = name.rpartition(".")
    parent = model.mod_dict.get(parent_name) if parent_name else None
    hook_point = model.mod_dict.get(name)
    model.hook_dict.pop(name, None)
    model.mod_dict.pop(name, None)
    if parent is not None and hook_point is not None and parent._modules.get(child) is hook_point:
        delattr(parent, child)  # a real submodule: drop it and rebuild the dicts
        _legacy_setup(model)


def _legacy_setup(model) -> None:
    """``HookedRootModule.setup()`` (rebuild ``hook_dict`` / ``mod_dict`` from ``named_modules``),
    keeping the entries that are not module paths (aliases added by :func:`add_hook_point`)."""
    modules = {n for n, _ in model.named_modules() if n}
    extra_hooks = {n: hp for n, hp in model.hook_dict.items() if n not in modules}
    extra_mods = {n: m for n, m in model.mod_dict.items() if n not in modules}
    model.setup()
    model.hook_dict.update(extra_hooks)
    model.mod_dict.update(extra_mods)


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


class BlockInput:
    """The residual entering block ``start`` in one batch's unedited forward, and how the
    model's blocks return their output (``"tensor"``, ``"tuple1"`` or None if unknown; needed to
    skip blocks on the bridge). Made by :func:`forward_recording_block_input`; fed back by
    :func:`forward_from_block`."""

    def __init__(self, start: int, resid: Tensor, output_form: str | None):
        self.start, self.resid, self.output_form = start, resid, output_form


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
    b = block_input
    resid = b.resid.repeat(repeat, 1, 1) if repeat > 1 else b.resid
    if lane_of(model) == "legacy" and getattr(model.cfg, "positional_embedding_type", "") != "shortformer":
        def run_legacy(tokens, attention_mask):  # noqa: ARG001 - tokens: same call on both lanes
            mask = None if attention_mask is None else attention_mask.to(resid.device)
            return model(resid, start_at_layer=b.start, attention_mask=mask)

        yield run_legacy
        return

    def inject(t, hook):  # noqa: ARG001 - TL hook signature
        return resid

    def run_bridge(tokens, attention_mask):
        return model(tokens, attention_mask=attention_mask)

    with _blocks_passed_through(model, b.start, b.output_form), \
            model.hooks(fwd_hooks=[(f"blocks.{b.start}.hook_resid_pre", inject)]):
        yield run_bridge


class Unembedding:
    """How a model's logits follow from one hook point: ``hook`` carries ``[batch, pos,
    d_model]`` and :meth:`logits` maps rows of it to their logits with the model's own modules
    (bridge: the unembedding's input, through ``model.unembed``; legacy: the last block's
    ``resid_post``, through ``ln_final`` and ``unembed``). Lets a caller that only reduces the
    logits (the sweep's metrics) compute them a chunk of positions at a time instead of
    holding ``[batch, pos, vocab]``. Made by :func:`unembedding`."""

    def __init__(self, hook: str, modules: tuple):
        self.hook, self._modules = hook, modules

    def logits(self, rows: Tensor) -> Tensor:
        """``[n, d_model]`` rows at :attr:`hook` -> their ``[n, vocab]`` logits."""
        x = rows.unsqueeze(0)
        for module in self._modules:
            x = module(x)
        return x.squeeze(0)


#: HF config fields that change the logits after the unembedding's linear map (softcapping,
#: scaling); a model that sets one is not given an :class:`Unembedding`.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def unembedding(model) -> Unembedding | None:
    """The :class:`Unembedding` of ``model``, or None where the logits are not exactly the
    unembedding of that hook (logit softcapping or scaling, a missing hook point, an
    unembedding that is not a linear map). Callers still check it once against the model's
    own logits (:func:`unembedding_matches`)."""
    hooks = model.hook_dict
    if lane_of(model) == "bridge":
        hf_cfg = getattr(getattr(model, "original_model", None), "config", None)
        for name in _LOGIT_TRANSFORMS:
            value = getattr(hf_cfg, name, None)
            if value not in (None, 0, 0.0, 1, 1.0):
                return None
        unembed = getattr(model, "unembed", None)
        if unembed is None or "unembed.hook_in" not in hooks or not isinstance(hf_module(unembed), torch.nn.Linear):
            return None
        return Unembedding("unembed.hook_in", (unembed,))
    if float(getattr(model.cfg, "output_logits_soft_cap", 0.0) or 0.0) > 0.0:
        return None
    last = f"blocks.{int(model.cfg.n_layers) - 1}.hook_resid_post"
    if last not in hooks or not hasattr(model, "unembed"):
        return None
    ln_final = getattr(model, "ln_final", None)
    return Unembedding(last, (model.unembed,) if ln_final is None else (ln_final, model.unembed))


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


@contextlib.contextmanager
def _blocks_passed_through(model, stop: int, output_form: str | None) -> Iterator[None]:
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


__all__ = [
    "BlockInput",
    "Lane",
    "StopForward",
    "Unembedding",
    "add_hook_point",
    "architecture_name",
    "capture",
    "capture_hooks",
    "clone_model",
    "device_of",
    "forward_from_block",
    "from_block",
    "forward_recording_block_input",
    "hf_attention_module",
    "hf_module",
    "hf_state_dict",
    "hf_state_key",
    "installed_lane",
    "is_bridge",
    "is_encoder",
    "is_parallel",
    "lane_of",
    "quiet_transformers",
    "remove_hook_point",
    "run_hooked",
    "save_hf_directory",
    "to_hf_model",
    "unembedding",
    "unembedding_matches",
]
