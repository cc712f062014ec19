"""The model runs behind the views that show one text (the views themselves only draw).

:func:`edited_patterns` reads one head's attention pattern under named edits (the
attention triptych); :func:`token_profile` is the per-token profile of a few
sequences (the coloured-token and top-perpendicular views). Both run the model
through the public :mod:`tl_directional.edit` and :mod:`tl_directional.measure` APIs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..edit import edit_hooks, edits_for_space
from ..measure import profile as run_profile
from ..model.handle import capture_hooks, device_of
from ..model.indices import normalize_index
from ..model.inputs import pad_sequences, prepare_inputs
from ..model.sites import resolve_sites


def str_tokens(model, ids) -> list[str]:
    """Each token id decoded on its own (what circuitsvis shows)."""
    tok = getattr(model, "tokenizer", None)
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
    if tok is None:
        return [str(i) for i in ids]
    return [tok.decode([i]) for i in ids]


def one_sequence(model, inputs, sequence: int, max_tokens: int | None) -> torch.Tensor:
    """Real tokens of one sequence as a ``[1, pos]`` tensor (padding dropped)."""
    batch = prepare_inputs(model, inputs)
    if not 0 <= sequence < len(batch):
        raise ValueError(f"sequence={sequence} is out of range for {len(batch)} input sequence(s)")
    row = batch.tokens[sequence][batch.attention_mask[sequence].bool()]
    if max_tokens is not None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
        row = row[:max_tokens]
    return row.unsqueeze(0)


def check_layer_head(sites, layer: int, head: int | None) -> tuple[int, int | None]:
    """``(layer, head)`` in ``0..n-1`` (negative indices count from the end)."""
    layer = normalize_index(layer, sites.n_layers, "layer")
    return layer, None if head is None else normalize_index(head, sites.n_heads, "head", "head")


def triptych_edits(layer: int, head: int, s_par: float = 0.0) -> dict[str, list]:
    """The three settings of the paper's three-map figure, scoped to one head: the
    ``hard-diag`` and ``eff-diag`` spaces of :data:`~tl_directional.edit.EDIT_SPACES`."""
    return {
        "baseline": [],
        "hard diagonal removal": edits_for_space("hard-diag", layers=[layer], heads=[head]),
        f"V-Para effective diagonal (s_par={s_par:g})": edits_for_space("eff-diag", s_par, layers=[layer],
                                                                         heads=[head]),
    }


@torch.no_grad()
def edited_patterns(
    model,
    inputs,
    layer: int,
    head: int,
    edits: Mapping[str, Sequence] | None = None,
    *,
    sequence: int = 0,
    max_tokens: int | None = 32,
) -> tuple[list[str], dict[str, np.ndarray]]:
    """Attention pattern ``[query, key]`` of one head as each edit leaves it.

    The pattern is read at ``blocks.{layer}.attn.hook_pattern`` by a hook added *after*
    the edits' hooks, so it is the row the head actually uses. ``edits`` maps a name to
    a list of edits (default: :func:`triptych_edits`: baseline, hard diagonal removal,
    V-Para effective diagonal at ``s_par = 0``).

    Returns:
        The token strings and ``{name: float32 array [pos, pos]}``.
    """
    sites = resolve_sites(model, warn=False)
    layer, head = check_layer_head(sites, layer, head)
    tokens = one_sequence(model, inputs, sequence, max_tokens).to(device_of(model))
    edits = triptych_edits(layer, head) if edits is None else edits
    hook_name = sites.value[layer].pattern_hook
    out: dict[str, np.ndarray] = {}
    for name, ed in edits.items():
        store: dict = {}
        hooks = edit_hooks(model, *ed) + capture_hooks([hook_name], store)  # after the edits' hooks
        model.run_with_hooks(tokens, attention_mask=torch.ones_like(tokens), return_type=None, fwd_hooks=hooks)
        if hook_name not in store:  # pragma: no cover - hook names come from resolve_sites
            raise RuntimeError(f"{hook_name} did not fire")
        out[name] = store[hook_name][0, head].float().cpu().numpy()
    return str_tokens(model, tokens[0]), out


def token_profile(model, sequences, components: Sequence[str]):
    """Per-token profile (first token kept) of ``sequences`` for ``components``: a
    ``[batch, pos]`` token tensor, or a list of 1-D token tensors (right-padded together)."""
    if isinstance(sequences, torch.Tensor):
        tokens = sequences
    else:
        tokens = pad_sequences([s.tolist() for s in sequences], pad_id=0, padding_side="right")
    return run_profile(model, tokens, per_token=True, components=tuple(components), progress=False,
                       exclude_first_token=False)


__all__ = ["check_layer_head", "edited_patterns", "one_sequence", "str_tokens", "token_profile", "triptych_edits"]
