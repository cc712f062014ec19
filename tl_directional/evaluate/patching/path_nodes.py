"""Senders and receivers of directional path patching, and the sender's difference along a path.

A :class:`Sender` is what is patched (a head's output, a whole attention or MLP update); a
:class:`Receiver` is where its difference is delivered (the query, key or value input of a later
head, the MLP input of a block, the residual stream entering a block, or the logits). This module
parses and checks them against a model's resolved sites and computes the sender's difference in
residual coordinates, ``delta = u* - u_x`` with ``u*`` the directional patch of METHOD.md sec. 5
(:func:`~tl_directional.core.geometry.patch_components`) and ``u_x`` the corrupted update, which
:func:`~tl_directional.evaluate.patching.path_patching.path_patch` then adds along the chosen path.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ...core.errors import TLDirectionalError
from ...core.geometry import decompose, patch_components
from ...model.handle import StopForward, from_block
from ...model.sites import ModelSites, kv_head_index
from ...model.weights import attention_output_weights
from .patch_hooks import patch_against

SENDER_KINDS = ("head", "attn", "mlp")
RECEIVER_KINDS = ("q", "k", "v", "mlp", "resid", "logits")
SPACES = ("residual", "value")


class PathPatchError(TLDirectionalError, ValueError):
    """A sender, receiver, metric, model state or input that path patching cannot use."""


@dataclass(frozen=True)
class Sender:
    """The patched node: ``kind`` in :data:`SENDER_KINDS`, its ``layer``, and ``head`` for a head."""

    kind: str
    layer: int
    head: int | None = None


@dataclass(frozen=True)
class Receiver:
    """One reader of the sender's write: ``kind`` in :data:`RECEIVER_KINDS`, its ``layer`` (the
    block whose input it reads; ``n_layers - 1`` for ``logits``, the final stream) and ``head``
    (a query head for ``q``; a key/value head for ``k`` / ``v``, so on grouped-query models one
    receiver is the key or value input shared by a group of query heads)."""

    kind: str
    layer: int
    head: int | None = None


def _index(value, size: int, argument: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -size <= value < size:
        raise PathPatchError(
            f"{argument} has {what} {value!r}; it must be an integer in [0, {size})"
        )
    return value % size


def parse_sender(sender, sites: ModelSites) -> Sender:
    """``sender`` (a :class:`Sender`, ``("head", L, h)``, ``("attn", L)`` or ``("mlp", L)``) checked."""
    if isinstance(sender, Sender):
        sender = (sender.kind, sender.layer) + (() if sender.head is None else (sender.head,))
    if not isinstance(sender, (tuple, list)) or not sender or sender[0] not in SENDER_KINDS:
        raise PathPatchError(
            f"sender={sender!r} is not a sender; pass ('head', layer, head), ('attn', layer) or ('mlp', layer)"
        )
    kind = sender[0]
    if len(sender) != (3 if kind == "head" else 2):
        raise PathPatchError(
            f"sender={tuple(sender)!r}: a {kind!r} sender is "
            + ("('head', layer, head)" if kind == "head" else f"({kind!r}, layer)")
        )
    if kind not in sites.units and kind != "head":
        raise PathPatchError(f"sender={tuple(sender)!r}: this model has no {kind!r} unit")
    layer = _index(sender[1], sites.n_layers, "sender", "layer")
    head = _index(sender[2], sites.n_heads, "sender", "head") if kind == "head" else None
    return Sender(kind, layer, head)


def _first_reader_layer(sender: Sender, kind: str, sites: ModelSites) -> int:
    """The first layer whose ``kind`` input reads the sender's write."""
    if kind == "mlp" and sender.kind in ("head", "attn") and sites.arch == "sequential":
        return sender.layer  # the MLP of the same block reads resid_mid, which holds the write
    return sender.layer + 1


def downstream_receivers(sender: Sender, kinds, sites: ModelSites, layers=None) -> list[Receiver]:
    """Every receiver of the ``kinds`` that reads the sender's write (optionally only in ``layers``)."""
    out: list[Receiver] = []
    for kind in kinds:
        if kind == "logits":
            out.append(Receiver("logits", sites.n_layers - 1))
            continue
        first = _first_reader_layer(sender, kind, sites)
        for L in range(first, sites.n_layers):
            if layers is not None and L not in layers:
                continue
            n = sites.n_heads if kind == "q" else sites.n_kv_heads if kind in ("k", "v") else 1
            out += [Receiver(kind, L, h if kind in ("q", "k", "v") else None) for h in range(n)]
    return out


def parse_receivers(receivers, sender: Sender, sites: ModelSites, layers=None) -> list[Receiver]:
    """``receivers``: a kind or a list of kinds (every later node of those kinds), or explicit nodes
    ``(kind, layer[, head])`` / :class:`Receiver`; each checked to read the sender's write."""
    if isinstance(receivers, (str, Receiver)) or (
        isinstance(receivers, tuple) and len(receivers) > 1 and isinstance(receivers[1], int)
    ):
        receivers = [receivers]  # one kind or one node, e.g. ("q", 2, 0)
    try:
        items = list(receivers)
    except TypeError:
        raise PathPatchError(
            f"receivers={receivers!r}: pass a kind from {RECEIVER_KINDS}, a list of them, "
            "or nodes such as ('q', layer, head), ('mlp', layer), ('resid', layer), 'logits'"
        ) from None
    if not items:
        raise PathPatchError(f"receivers is empty; choose from {RECEIVER_KINDS}")
    out: list[Receiver] = []
    for item in items:
        if isinstance(item, str):
            if item not in RECEIVER_KINDS:
                raise PathPatchError(
                    f"receivers has unknown kind {item!r}; choose from {RECEIVER_KINDS}"
                )
            out += downstream_receivers(sender, [item], sites, layers)
            continue
        if isinstance(item, Receiver):
            item = (item.kind, item.layer) + (() if item.head is None else (item.head,))
        if not isinstance(item, (tuple, list)) or not item or item[0] not in RECEIVER_KINDS:
            raise PathPatchError(
                f"receivers has unknown receiver {item!r}; choose a kind from {RECEIVER_KINDS}"
            )
        kind = item[0]
        if kind == "logits":
            out.append(Receiver("logits", sites.n_layers - 1))
            continue
        headed = kind in ("q", "k", "v")
        if len(item) != (3 if headed else 2):
            raise PathPatchError(
                f"receivers has {tuple(item)!r}; a {kind!r} receiver is "
                + (f"({kind!r}, layer, head)" if headed else f"({kind!r}, layer)")
            )
        L = _index(item[1], sites.n_layers, "receivers", "layer")
        n = sites.n_heads if kind == "q" else sites.n_kv_heads
        h = (
            _index(item[2], n, "receivers", "key/value head" if kind in ("k", "v") else "head")
            if headed
            else None
        )
        if L < _first_reader_layer(sender, kind, sites):
            raise PathPatchError(
                f"receivers has {tuple(item)!r}, which does not read the write of sender {sender}: "
                f"choose a layer >= {_first_reader_layer(sender, kind, sites)}"
            )
        out.append(Receiver(kind, L, h))
    return list(dict.fromkeys(out))


def hook_names(sites: ModelSites, layer: int, hook_dict=None) -> dict[str, str]:
    """The hook points one receiver layer reads, from the layer's value site (same parent module).

    The MLP input is read after the norm: ``mlp.hook_in`` where the model has it (the bridge: an
    edit there leaves the wrapped norm on its native path), else ``ln2.hook_normalized``."""
    vs = sites.value[layer]
    attn = vs.v_hook.rsplit(".", 1)[0]
    block = f"blocks.{layer}"
    return {
        "resid_pre": f"{block}.hook_resid_pre",
        "resid_mid": f"{block}.hook_resid_mid",
        "q": f"{attn}.hook_q",
        "k": f"{attn}.hook_k",
        "v": vs.v_hook,
        "ln1_scale": f"{block}.ln1.hook_scale",
        "ln2_scale": f"{block}.ln2.hook_scale",
        "mlp_in": f"{block}.mlp.hook_in"
        if hook_dict is not None and f"{block}.mlp.hook_in" in hook_dict
        else f"{block}.ln2.hook_normalized",
    }


def sender_hooks(sender: Sender, sites: ModelSites, space: str) -> tuple[set[str], set[str]]:
    """``(clean, corrupted)``: the hook points whose clean / corrupted activations the difference reads."""
    if sender.kind == "head":
        vs = sites.value[sender.layer]
        corr = {vs.z_hook, vs.resid_hook, sites.units["attn"][sender.layer].update_hook}
        return {vs.z_hook}, corr | ({vs.v_hook} if space == "value" else set())
    u = sites.units[sender.kind][sender.layer]
    return {u.update_hook}, {u.update_hook, u.reference_hook}


def sender_deltas(
    model,
    sites: ModelSites,
    sender: Sender,
    space: str,
    parts,
    clean: dict,
    corr: dict,
    block0,
    xt: Tensor,
    am: Tensor,
    sandwich: bool,
    eps: float,
    reference=None,
):
    """Per part, the sender's difference ``u* - u_x`` in residual coordinates ``[batch, pos, d_model]``,
    and the share ``|cos(u_c - u_x, r)|`` of the full difference along its reference ``[batch]``.
    ``reference``: a resolved non-stream :class:`~tl_directional.model.reference.Reference` that
    replaces the stream in residual space (:func:`patch_against`), or None.

    Residual space: ``u*`` is :func:`patch_components` of the clean and corrupted writes against
    the stream the write is added to (the corrupted run's). Value space (heads only): the head's
    ``z`` is patched against its own corrupted value vector (the KV head it reads), then written
    out. A head's write is ``z_h W_O[h]``; on sandwich-norm models it is what reaches the stream,
    the post-attention norm's output with only head ``h``'s ``z`` changed (one forward of the
    sender block)."""
    if sender.kind != "head":
        u = sites.units[sender.kind][sender.layer]
        u_c, u_x, r = clean[u.update_hook], corr[u.update_hook], corr[u.reference_hook]
        deltas = {p: patch_against(reference, sender.layer, u_c, u_x, r, p, eps) - u_x for p in parts}
        return deltas, _share(u_c - u_x, r, eps, reference, sender.layer)
    vs = sites.value[sender.layer]
    h = sender.head
    z_c, z_x = clean[vs.z_hook][:, :, h], corr[vs.z_hook][:, :, h]
    r = corr[vs.resid_hook]
    if space == "value":
        v = corr[vs.v_hook][:, :, kv_head_index(h, sites.n_heads, corr[vs.v_hook].shape[2])]
        z_new = {p: patch_components(z_c, z_x, v, p, eps) for p in parts}
        share = _share(z_c - z_x, v, eps)
    else:
        z_new = {"full": z_c}
    if sandwich:
        writes = _sandwich_writes(model, sites, sender, z_new, corr, block0, xt, am)
        u_x = corr[sites.units["attn"][sender.layer].update_hook]
    else:
        W_O = attention_output_weights(model, sender.layer)[0][h].to(z_x.dtype)  # noqa: N806 - TL's name
        writes = {p: z @ W_O for p, z in z_new.items()}
        u_x = z_x @ W_O
    if space == "value":
        return {p: writes[p] - u_x for p in parts}, share
    u_c = writes["full"]
    return {p: patch_against(reference, sender.layer, u_c, u_x, r, p, eps) - u_x for p in parts}, _share(
        u_c - u_x, r, eps, reference, sender.layer
    )


def _share(delta: Tensor, r: Tensor, eps: float, reference=None, layer: int = 0) -> Tensor:
    """Mean over positions of ``|cos(delta, r)|`` per sequence (``[batch]``, float64); against a
    non-stream ``reference``, ``||P delta|| / ||delta||``."""
    if reference is not None and not reference.is_stream:
        return reference.stats(delta, None, layer, eps).par_frac.double().mean(-1)
    return decompose(delta, r, eps).par_frac.double().mean(-1)


def _sandwich_writes(
    model,
    sites: ModelSites,
    sender: Sender,
    z_new: dict,
    corr: dict,
    block0,
    xt: Tensor,
    am: Tensor,
) -> dict[str, Tensor]:
    """The attention write (after the post-attention norm) with head ``h``'s ``z`` replaced by each of
    ``z_new``, one stacked forward of the sender block from the corrupted stream."""
    L, h = sender.layer, sender.head
    keys = list(z_new)
    k, b = len(keys), xt.shape[0]
    vs, out_hook = sites.value[L], sites.units["attn"][L].update_hook
    got: dict[str, Tensor] = {}

    def z_hook(z, hook):  # noqa: ARG001 - TL hook signature
        z = z.clone()
        for i, key in enumerate(keys):
            z[i * b : (i + 1) * b, :, h] = z_new[key].to(z.dtype)
        return z

    def out(t, hook):  # noqa: ARG001
        got["w"] = t.detach().clone()
        raise StopForward  # the sender block's write is all that is needed

    resid = corr[f"blocks.{L}.hook_resid_pre"].repeat(k, 1, 1)
    block_input = type(block0)(L, resid, block0.output_form)
    with (
        from_block(model, block_input) as run,
        model.hooks(fwd_hooks=[(vs.z_hook, z_hook), (out_hook, out)]),
    ):
        try:
            run(xt.repeat(k, 1), am.repeat(k, 1))
        except StopForward:
            pass
    return {key: got["w"][i * b : (i + 1) * b] for i, key in enumerate(keys)}


__all__ = [
    "RECEIVER_KINDS",
    "SENDER_KINDS",
    "SPACES",
    "PathPatchError",
    "Receiver",
    "Sender",
    "downstream_receivers",
    "hook_names",
    "parse_receivers",
    "parse_sender",
    "sender_deltas",
    "sender_hooks",
]
