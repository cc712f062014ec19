"""Toy-scale data and the plain-PyTorch training recipe for edited ``transformers`` models.

:func:`token_dataset` cuts the bundled held-out text (:func:`tl_directional.io.corpus.heldout_text`)
into seeded token windows for ``transformers.Trainer``; :func:`train_plain` is the nanoGPT-style
loop of docs/hf_training.md (edits installed once, differentiable, AdamW, fixed data order),
which also runs under ``torchrun`` with DDP or FSDP: every rank takes its slice of each global
batch and the loss is the global-batch mean, so the curve equals one process's to round-off.

:func:`train_like_own_trainer` reruns one run of the project's own trainer
(:mod:`tl_directional.training`, ``tl-directional train``) through ``transformers.Trainer`` and
:class:`~tl_directional.training.hf_callback.DirectionalEditCallback`: the same seeded initial GPT-2
(``build_init_dir``), the same global batches in the same order (``batch_indices``), the same
AdamW parameter groups, learning-rate schedule (``lr_at``) and gradient clipping, the variant's
edit active in training and in the final validation (``studies/explore/hf_toy_experiment.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..edit import Edit
from ..edit.apply import apply_edits
from ..edit.hf.edits import install_edits
from ..io.corpus import heldout_text
from ..model.load import load_hf_model
from ..training.config import lr_at, variant_edits
from ..training.data import batch_indices
from ..training.model import build_init_dir
from .hf_callback import DirectionalEditCallback


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


class _Rows(torch.utils.data.Dataset):
    """Rows of ``[n, n_ctx]`` token windows as causal-LM examples (labels = inputs)."""

    def __init__(self, ids: Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        x = self.ids[i]
        return {"input_ids": x, "labels": x.clone()}


def own_trainer_optimizer(model: torch.nn.Module, cfg) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The own trainer's AdamW (weight decay on matrices only, its betas and eps) and its
    learning rate per optimiser step (:func:`tl_directional.training.config.lr_at`) as a
    ``LambdaLR``, for ``Trainer(optimizers=...)``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_at(step, cfg) / cfg.lr)
    return opt, sched


@torch.no_grad()
def validation_loss(model, windows: Tensor, batch_size: int) -> float:
    """Mean next-token loss over ``windows`` in chunks of ``batch_size`` (the own trainer's
    ``evaluate``: chunk means weighted by chunk size), with whatever edits are installed."""
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        total += float(model(input_ids=chunk, labels=chunk).loss) * len(chunk)
        n += len(chunk)
    model.train(was_training)
    return total / n


def train_like_own_trainer(cfg, data, run_dir: str | os.PathLike[str], *, edits: Sequence[Edit] | None = None,
                           max_steps: int | None = None, evaluate: bool = True,
                           save_every: int | None = None) -> dict:
    """One run of the own trainer's recipe through ``transformers.Trainer`` + the callback.

    Args:
        cfg: a :class:`tl_directional.training.config.TrainConfig` (model shape, batch, schedule,
            seed, variant).
        data: its :class:`tl_directional.training.data.Data` (tokenizer, train / validation windows).
        run_dir: where the seeded initial model (``run_dir/init``) and the Trainer's output go.
        edits: the edits to train with (default: the variant's, ``variant_edits(cfg.variant)``);
            none: a plain ``Trainer`` run.
        max_steps: stop after this many steps (default ``cfg.max_steps``; the schedule is still
            ``cfg``'s).
        evaluate: compute the final validation loss (edits active).
        save_every: write a Trainer checkpoint (``run_dir/trainer/checkpoint-STEP``, the last two
            kept, each with the training losses so far in ``tld_train_losses.json``) every this
            many steps, and resume from the latest one when there is one (None: no checkpoints,
            always from the start). A resumed run continues the same batches, optimiser and
            schedule state.

    Returns:
        ``{"train_losses": [...], "val_loss": float | None, "seconds": float, "tokens": int}``
        (``tokens``: training tokens seen, ``steps x batch x n_ctx``).
    """
    import time

    from transformers import Trainer, TrainingArguments

    steps = cfg.max_steps if max_steps is None else int(max_steps)
    edits = variant_edits(cfg.variant) if edits is None else list(edits)
    run_dir = Path(run_dir)
    init = build_init_dir(cfg, data.tokenizer, run_dir / "init")
    model = load_hf_model(init).train()  # eager attention, float32
    # the global batches of the own trainer, in its order; read sequentially below
    rows = torch.cat([data.train[batch_indices(cfg.seed, k, cfg.batch_size, len(data.train))] for k in range(steps)])

    class _InOrder(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            # The model's own mean over its B x (T - 1) predicted tokens, as the own trainer: with
            # loss kwargs the Trainer divides the loss sum by the labels it counts, which on these
            # versions includes position 0 (B x T), a loss (T - 1) / T too small.
            self.model_accepts_loss_kwargs = False

        def _get_train_sampler(self, *args, **kwargs):  # noqa: ARG002 - signature differs by version
            return torch.utils.data.SequentialSampler(self.train_dataset)

        def compute_loss(self, *args, **kwargs):
            # each step's loss unrounded (transformers 4 rounds the logged loss to 4 decimals)
            out = super().compute_loss(*args, **kwargs)
            losses.append(float((out[0] if isinstance(out, tuple) else out).detach()))
            return out

    saving = {"save_strategy": "no"} if save_every is None else {
        "save_strategy": "steps", "save_steps": int(save_every), "save_total_limit": 2}
    args = TrainingArguments(
        output_dir=str(run_dir / "trainer"), max_steps=steps, per_device_train_batch_size=cfg.batch_size,
        max_grad_norm=cfg.grad_clip if cfg.grad_clip > 0 else 0.0, logging_steps=1, **saving,
        report_to=[], use_cpu=True, seed=cfg.seed, dataloader_num_workers=0, disable_tqdm=True)
    callbacks = [DirectionalEditCallback(edits)] if edits else []
    losses: list[float] = []
    resume_from = None
    if save_every is not None:
        from transformers import TrainerCallback
        from transformers.trainer_utils import get_last_checkpoint

        class _KeepLosses(TrainerCallback):
            # the per-step losses beside each checkpoint, so a resumed run returns the whole curve
            def on_save(self, args, state, control, **kwargs):
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                (ckpt / "tld_train_losses.json").write_text(json.dumps(losses[: state.global_step]))

        callbacks.append(_KeepLosses())
        if (run_dir / "trainer").is_dir():
            resume_from = get_last_checkpoint(str(run_dir / "trainer"))
        if resume_from is not None:
            kept = Path(resume_from) / "tld_train_losses.json"
            done = int(Path(resume_from).name.rsplit("-", 1)[1])
            # a stop between the Trainer's save and ours leaves no losses: NaN for those steps
            losses.extend(json.loads(kept.read_text()) if kept.is_file() else [float("nan")] * done)
    trainer = _InOrder(model=model, args=args, train_dataset=_Rows(rows), callbacks=callbacks,
                       optimizers=own_trainer_optimizer(model, cfg))
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume_from)
    seconds = time.perf_counter() - t0
    val = None
    if evaluate:
        if edits:
            with apply_edits(model, *edits):
                val = validation_loss(model, data.validation, cfg.batch_size)
        else:
            val = validation_loss(model, data.validation, cfg.batch_size)
    return {"train_losses": losses, "val_loss": val, "seconds": seconds,
            "tokens": steps * cfg.batch_size * cfg.n_ctx}


__all__ = ["TokenWindows", "next_token_loss_sum", "own_trainer_optimizer", "token_dataset", "token_windows",
           "train_like_own_trainer", "train_plain", "validation_loss"]
