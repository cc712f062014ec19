"""Toy-scale data and the plain-PyTorch training recipe for edited ``transformers`` models.

:func:`token_dataset` cuts the bundled held-out text (:func:`tl_directional.corpus.heldout_text`)
into seeded token windows for ``transformers.Trainer``; :func:`train_plain` is the nanoGPT-style
loop of docs/hf_training.md (edits installed once, differentiable, AdamW, fixed data order),
which also runs under ``torchrun`` with DDP or FSDP: every rank takes its slice of each global
batch and the loss is the global-batch mean, so the curve equals one process's to round-off.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..edit import Edit
from .edits import install_edits


class TokenWindows(torch.utils.data.Dataset):
    """``[n_seqs, seq_len]`` token windows as Trainer examples (``input_ids``, ``labels``,
    ``attention_mask``; labels are the inputs: the model shifts them)."""

    def __init__(self, ids: Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        x = self.ids[i]
        return {"input_ids": x, "labels": x.clone(), "attention_mask": torch.ones_like(x)}


def token_windows(model_dir: str | os.PathLike[str], *, n_seqs: int, seq_len: int, seed: int = 0,
                  text: str | None = None) -> Tensor:
    """``[n_seqs, seq_len]`` int64 windows of ``text`` (default: the bundled held-out text) under the
    tokenizer of ``model_dir``, at seeded random non-overlapping offsets."""
    from transformers import AutoTokenizer

    if text is None:
        from ..corpus import heldout_text

        text = heldout_text()
    for name, v in (("n_seqs", n_seqs), ("seq_len", seq_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    tok = AutoTokenizer.from_pretrained(str(Path(model_dir)))
    ids = torch.tensor(tok(text)["input_ids"], dtype=torch.long)
    n_windows = ids.numel() // seq_len
    if n_windows < n_seqs:
        raise ValueError(f"n_seqs={n_seqs} windows of seq_len={seq_len} need {n_seqs * seq_len} tokens; "
                         f"the text has {ids.numel()}; use fewer or shorter windows")
    order = torch.randperm(n_windows, generator=torch.Generator().manual_seed(seed))[:n_seqs]
    return torch.stack([ids[i * seq_len:(i + 1) * seq_len] for i in order.tolist()])


def token_dataset(model_dir, *, n_seqs: int, seq_len: int, seed: int = 0) -> TokenWindows:
    """:func:`token_windows` as a ``torch.utils.data.Dataset`` for ``transformers.Trainer``."""
    return TokenWindows(token_windows(model_dir, n_seqs=n_seqs, seq_len=seq_len, seed=seed))


def next_token_loss_sum(model, ids: Tensor) -> tuple[Tensor, int]:
    """``(sum of next-token cross-entropies, number of predicted tokens)`` of ``ids`` [batch, pos]."""
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             ids[:, 1:].reshape(-1), reduction="sum")
    return loss, ids[:, 1:].numel()


def train_plain(model, batches: Sequence[Tensor], edits: Sequence[Edit] = (), *, lr: float = 1e-3,
                rank: int = 0, world: int = 1, wrapped=None) -> list[float]:
    """The plain-PyTorch recipe: AdamW on the global-batch mean next-token loss, edits active.

    ``batches``: the *global* batches, ``[global_batch, pos]`` each; rank ``r`` of ``world`` trains on
    rows ``r::world`` of every batch. ``wrapped``: the DDP / FSDP wrapper of ``model`` (None: a single
    process). The loss of each rank is its token sum divided by the global token count, so the
    gradient all-reduce (a sum under DDP x world / world, a mean under FSDP) yields the global mean's
    gradient. Returns the global mean loss per step (all-reduced when ``world > 1``).
    """
    net = model if wrapped is None else wrapped
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    handle = install_edits(model, *edits) if edits else None
    losses = []
    try:
        net.train()
        for batch in batches:
            local = batch[rank::world]
            total_tokens = batch[:, 1:].numel()
            loss_sum, _ = next_token_loss_sum(net, local)
            # DDP and FSDP average gradients over ranks: scale by world so the result is the gradient
            # of the global mean (sum over all ranks' tokens / all tokens)
            loss = loss_sum * world / total_tokens
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            reported = loss_sum.detach() / total_tokens
            if world > 1:
                torch.distributed.all_reduce(reported)
            losses.append(float(reported))
    finally:
        if handle is not None:
            handle.remove()
    return losses


__all__ = ["TokenWindows", "next_token_loss_sum", "token_dataset", "token_windows", "train_plain"]
