"""The training loop: :class:`Trainer` (model, AdamW, data, checkpoints), :func:`train` (lock,
resume, distributed set-up and tear-down) and the ``torchrun`` helpers (METHOD.md sec. 7).

Reproducibility: the data order is a pure function of ``(seed, step)``, dropout is 0 and the
learning rate is a pure function of the step, so a run resumed from a checkpoint continues
bit-exactly (same thread count, same machine).

Distributed: launched with ``torchrun --nproc_per_node N -m tl_directional.training train ...`` the run uses
PyTorch ``DistributedDataParallel`` (gloo on CPU, nccl on CUDA); ``batch_size`` stays the *global*
batch, rank ``r`` takes rows ``r::N`` of it, so the run matches a single-process run up to float
reduction order.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..edit import edit_hooks
from ..io.atomic import atomic_write_bytes
from ..io.distributed import destroy_process_group
from ..io.locks import exclusive_lock
from ..model.sites import lane_of
from .checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    check_resumable,
    checkpoint_paths,
    json_bytes,
    read_checkpoint,
    remove_orphan_temporaries,
    write_checkpoint,
    write_metrics_csv,
)
from .config import INIT_DIR, METRICS_FILE, SUMMARY_FILE, TrainConfig, lr_at, variant_edits
from .data import Data, batch_indices, data_sha256, prepare_data
from .model import (
    build_init_dir,
    canonical_state_dict,
    load_canonical_state_dict_,
    load_init,
    trainable_parameters,
)


@dataclass
class Dist:
    """This process's place in a ``torchrun`` job (rank 0 of 1 without one)."""

    rank: int = 0
    world_size: int = 1
    initialized_here: bool = False

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()


def init_distributed() -> Dist:
    """Join the process group that ``torchrun`` describes in the environment (if any)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        return Dist(dist.get_rank(), dist.get_world_size(), True)
    return Dist(dist.get_rank(), dist.get_world_size(), False)


@dataclass
class TrainResult:
    """What a finished (or stopped) run returns."""

    run_dir: Path
    config: TrainConfig
    step: int
    metrics: list[dict[str, Any]]
    final_val_loss: float | None
    resumed_from: int | None
    wall_s: float
    tokens_per_s: float
    model: Any = None

    def curve(self):
        import pandas as pd

        return pd.DataFrame(self.metrics)


class Trainer:
    """A training run in ``run_dir``: model, AdamW, data, checkpoints.

    Most users call :func:`train`; the class is exposed for benchmarks and notebooks
    (``trainer.train_step(step)`` runs one optimiser step with the variant's edit active).
    """

    def __init__(self, cfg: TrainConfig, run_dir: str | os.PathLike[str], *, data: Data | None = None,
                 device: str | torch.device = "cpu", dist: Dist | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.device = torch.device(device)
        self.dist = dist or Dist()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if data is None:
            if self.dist.rank == 0:
                data = prepare_data(cfg, self.run_dir)
            self.dist.barrier()
            if data is None:
                data = prepare_data(cfg, self.run_dir, train_tokenizer_if_missing=False)
        self.data = data
        self.data_sha256 = data_sha256(data)
        if self.dist.rank == 0:
            build_init_dir(cfg, data.tokenizer, self.run_dir / INIT_DIR)
        self.dist.barrier()
        self.model = load_init(self.run_dir / INIT_DIR, self.device)
        self.named_params = trainable_parameters(self.model)
        decay = [p for n, p in self.named_params if p.ndim >= 2]
        no_decay = [p for n, p in self.named_params if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=lr_at(0, cfg), betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
        )
        self.edits = variant_edits(cfg.variant)
        self.hooks = edit_hooks(self.model, *self.edits)
        self.step = 0
        self.metrics: list[dict[str, Any]] = []
        self.resumed_from: int | None = None
        self._train_losses: list[float] = []
        self.forward_model = self.model
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.forward_model = DistributedDataParallel(self.model, device_ids=ids)

    # -- one step ---------------------------------------------------------------------------
    def batch(self, step: int) -> Tensor:
        """This rank's rows of global batch ``step``."""
        idx = batch_indices(self.cfg.seed, step, self.cfg.batch_size, len(self.data.train))
        idx = idx[self.dist.rank:: self.dist.world_size]
        return self.data.train[idx].to(self.device)

    def loss(self, tokens: Tensor, model: Any = None) -> Tensor:
        """Mean next-token loss of ``tokens`` with the variant's edit active."""
        model = self.forward_model if model is None else model
        with self.model.hooks(fwd_hooks=self.hooks):
            return model(tokens, return_type="loss")

    def train_step(self, step: int) -> float:
        """One AdamW step on global batch ``step`` (edit active); returns the loss (this rank)."""
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.cfg)
        with torch.enable_grad():  # also when called from inside torch.no_grad()
            loss = self.loss(self.batch(step))
            loss.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([p for _, p in self.named_params], self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self, batch_size: int | None = None) -> float:
        """Mean validation loss over the validation windows, edit active (sharded over ranks)."""
        self.model.eval()
        val = self.data.validation[self.dist.rank:: self.dist.world_size]
        bs = batch_size or max(self.cfg.batch_size // self.dist.world_size, 1)
        total = torch.zeros(2, dtype=torch.float64)
        for i in range(0, len(val), bs):
            chunk = val[i:i + bs].to(self.device)
            loss = self.loss(chunk, model=self.model)
            total += torch.tensor([float(loss) * len(chunk), len(chunk)], dtype=torch.float64)
        if self.dist.active:
            torch.distributed.all_reduce(total)
        return float(total[0] / total[1])

    # -- checkpoints ------------------------------------------------------------------------
    def _checkpoint_tensors(self) -> dict[str, Tensor]:
        tensors = {f"model/{k}": v.cpu() for k, v in canonical_state_dict(self.model).items()}
        names = {id(p): n for n, p in self.named_params}
        for p, st in self.optimizer.state.items():
            name = names[id(p)]
            for key, value in st.items():
                if isinstance(value, Tensor):
                    tensors[f"optim/{name}/{key}"] = value.detach().cpu().contiguous()
        return tensors

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoints/ckpt-STEP.{safetensors,json}`` (rank 0), then prune old ones."""
        if self.dist.rank != 0:
            return None
        record = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "tokens_seen": self.step * self.cfg.batch_size * self.cfg.n_ctx,
            "config": self.cfg.to_dict(),
            "lane": lane_of(self.model),
            "tokenizer_sha256": self.data.tokenizer_sha256,
            "data_sha256": self.data_sha256,
            "corpus": self.data.corpus_info,
            "scheduler": {"kind": "linear warmup + cosine", "next_lr": lr_at(self.step, self.cfg),
                          "warmup_steps": self.cfg.warmup_steps, "max_steps": self.cfg.max_steps,
                          "min_lr_ratio": self.cfg.min_lr_ratio},
            "metrics": self.metrics,
            "pending_train_losses": self._train_losses,
        }
        return write_checkpoint(self.run_dir, self.step, self._checkpoint_tensors(), record,
                                keep=self.cfg.keep_checkpoints)

    def load_checkpoint(self, json_path: str | os.PathLike[str]) -> None:
        """Restore model, optimiser, step and metrics from a checkpoint (verified)."""
        json_path = Path(json_path)
        meta, tensors = read_checkpoint(json_path)
        check_resumable(meta, json_path, self.cfg, lane=lane_of(self.model),
                        tokenizer_sha256=self.data.tokenizer_sha256, data_sha256=self.data_sha256,
                        run_dir=self.run_dir)
        model_state = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
        load_canonical_state_dict_(self.model, model_state, source=str(json_path))
        state: dict[int, dict[str, Tensor]] = {}
        names = {id(p): n for n, p in self.named_params}
        ordered = [names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]
        for i, name in enumerate(ordered):  # optimizer.state_dict() numbers params in group order
            entry = {k.rsplit("/", 1)[1]: v for k, v in tensors.items()
                     if k.startswith(f"optim/{name}/") and k.count("/") == name.count("/") + 2}
            if entry:
                state[i] = entry
        if meta["step"] > 0 and len(state) != len(self.named_params):
            raise CheckpointError(f"{json_path}: optimiser state covers {len(state)} of "
                                  f"{len(self.named_params)} parameters; the checkpoint is incomplete.")
        sd = self.optimizer.state_dict()
        self.optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
        self.step = int(meta["step"])
        self.metrics = list(meta.get("metrics", []))
        self._train_losses = list(meta.get("pending_train_losses", []))
        self.resumed_from = self.step

    def resume_if_possible(self, resume: bool = True) -> None:
        found = checkpoint_paths(self.run_dir)
        if not found:
            return
        if not resume:
            raise CheckpointError(
                f"{self.run_dir} already holds checkpoints ({found[-1].name}); resume it (the "
                "default) or choose a new --out directory."
            )
        self.load_checkpoint(found[-1])

    # -- the loop ---------------------------------------------------------------------------
    def _record(self, val_loss: float) -> None:
        train_loss = sum(self._train_losses) / len(self._train_losses) if self._train_losses else None
        self.metrics.append({
            "step": self.step, "tokens": self.step * self.cfg.batch_size * self.cfg.n_ctx,
            "lr": lr_at(max(self.step - 1, 0), self.cfg), "train_loss": train_loss,
            "val_loss": val_loss, "variant": self.cfg.variant, "seed": self.cfg.seed,
        })
        self._train_losses = []
        if self.dist.rank == 0:
            write_metrics_csv(self.run_dir / METRICS_FILE, self.metrics)

    def run(self, *, stop_after: int | None = None, progress: bool = True) -> TrainResult:
        """Train to ``max_steps`` (or stop after step ``stop_after``, leaving a checkpoint)."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        t0 = time.perf_counter()
        start = self.step
        if self.step == 0 and not self.metrics:
            self._record(self.evaluate())
        end = cfg.max_steps if stop_after is None else min(stop_after, cfg.max_steps)
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=not progress or self.dist.rank != 0,
                   desc=f"{cfg.variant} s{cfg.seed}", dynamic_ncols=True)
        while self.step < end:
            loss = self.train_step(self.step)
            self._train_losses.append(loss)
            self.step += 1
            bar.update(1)
            if self.step % cfg.eval_every == 0 or self.step == cfg.max_steps:
                self._record(self.evaluate())
                bar.set_postfix(loss=f"{loss:.3f}", val=f"{self.metrics[-1]['val_loss']:.3f}")
            if self.step % cfg.ckpt_every == 0 or self.step == end:
                self.save_checkpoint()
                self.dist.barrier()
        bar.close()
        wall = time.perf_counter() - t0
        tokens = (self.step - start) * cfg.batch_size * cfg.n_ctx
        final = self.metrics[-1]["val_loss"] if self.metrics and self.step == cfg.max_steps else None
        result = TrainResult(self.run_dir, cfg, self.step, self.metrics, final, self.resumed_from,
                             wall, tokens / wall if wall > 0 else 0.0, self.model)
        fresh = self.step > start or not (self.run_dir / SUMMARY_FILE).is_file()
        if self.dist.rank == 0 and self.step == cfg.max_steps and fresh:
            summary = {"config": cfg.to_dict(), "step": self.step, "final_val_loss": final,
                       "wall_s_this_process": wall, "tokens_per_s": result.tokens_per_s,
                       "world_size": self.dist.world_size, "resumed_from": self.resumed_from,
                       "corpus": self.data.corpus_info}
            atomic_write_bytes(self.run_dir / SUMMARY_FILE, json_bytes(summary))
        return result


def train(cfg: TrainConfig, run_dir: str | os.PathLike[str], *, resume: bool = True,
          stop_after: int | None = None, progress: bool = True, data: Data | None = None,
          device: str | torch.device = "cpu") -> TrainResult:
    """Train (or resume) the run in ``run_dir``; see the module docstring.

    Args:
        cfg: The run's configuration.
        run_dir: Output directory (tokenizer/, init/, checkpoints/, metrics.csv, summary.json).
        resume: Continue from the run's last checkpoint when there is one (the default). With
            ``False`` an existing checkpoint is an error (never silently overwritten).
        stop_after: Stop after this step (a checkpoint is written there), e.g. to split a run.
        progress: Show a tqdm bar.
        data: Pre-tokenised data (the experiment runner shares one across runs).
        device: Torch device.

    Raises:
        FileNotFoundError: the corpus is missing.
        ConfigMismatchError: resuming with a different configuration.
        CheckpointError: a corrupt or truncated checkpoint.
        TokenizerMismatchError: tokenizer and model do not fit.
    """
    dist = init_distributed()
    if dist.active and torch.device(device).type == "cuda":
        # one GPU per process, as torchrun numbers them on each machine
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    try:
        with ExitStack() as held:
            if dist.rank == 0:  # one run per directory: a second writer is refused, not mixed in
                held.enter_context(exclusive_lock(run_dir, "tl-directional train"))
                remove_orphan_temporaries(run_dir)
            return _run_trainer(cfg, run_dir, resume=resume, stop_after=stop_after,
                                progress=progress, data=data, device=device, dist=dist)
    finally:
        if dist.initialized_here:
            # the trainer (its DistributedDataParallel holds the group) is gone by now, so this
            # frees the group and joins its worker threads here, not at interpreter exit
            destroy_process_group()


def _run_trainer(cfg: TrainConfig, run_dir: str | os.PathLike[str], *, resume: bool,
                 stop_after: int | None, progress: bool, data: Data | None,
                 device: str | torch.device, dist: Dist) -> TrainResult:
    # own frame: the Trainer and its DistributedDataParallel wrapper die when it returns
    trainer = Trainer(cfg, run_dir, data=data, device=device, dist=dist)
    trainer.resume_if_possible(resume)
    return trainer.run(stop_after=stop_after, progress=progress)
