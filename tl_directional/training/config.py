"""Training configuration: :class:`TrainConfig`, the variants' edits, the learning-rate schedule,
and the names of a run directory's files (METHOD.md sec. 7)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..edit import Edit, edits_for_space

#: The training variants (METHOD.md sec. 7).
VARIANTS: tuple[str, ...] = ("baseline", "vpara", "attn-para")

#: ``corpus`` value that selects the tiny built-in corpus (the shipped held-out slice, cut in
#: two by lines). Good for tests and smoke runs only: it is test-split text.
BUILTIN_CORPUS = "builtin-heldout"

#: Files and folders of a run directory.
CHECKPOINT_DIR = "checkpoints"
INIT_DIR = "init"
TOKENIZER_DIR = "tokenizer"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"

#: Config keys that may change between an interrupted run and its resumption: they change how
#: often files are written, not the trajectory of the weights.
OPERATIONAL_KEYS = frozenset({"ckpt_every", "keep_checkpoints"})

#: Each variant's edit, as a space of :data:`tl_directional.edit.EDIT_SPACES` with ``s_par = 0``
#: in every layer (``None``: no edit). Its keys are the variants a run may train; the carrier
#: variants (MLP carrier edits, METHOD.md sec. 4) are trainable but not in :data:`VARIANTS`, the
#: experiment's default set.
VARIANT_SPACES: dict[str, str | None] = {"baseline": None, "vpara": "value", "attn-para": "resid-attn",
                                         "carrier-input-para": "mlp-carrier-input",
                                         "carrier-block-para": "mlp-carrier-block"}


@dataclass
class TrainConfig:
    """Everything that determines a training run (and so must match on resume).

    ``batch_size`` is the global batch (windows of ``n_ctx`` tokens per optimiser step, summed
    over ranks). ``corpus`` is a directory written by ``studies/data/fetch_corpus.py`` (train split for
    training, validation split for evaluation) or :data:`BUILTIN_CORPUS`. ``tokenizer`` reuses a
    tokenizer directory (``tokenizer.json`` + config); ``None`` trains a byte-level BPE tokenizer
    of ``vocab_size`` tokens on the training split. ``eval_windows`` caps the validation windows
    (0 = all of them); ``eval_every`` / ``ckpt_every`` are in steps (a final evaluation and
    checkpoint always happen at ``max_steps``).
    """

    variant: str = "baseline"
    seed: int = 0
    corpus: str = BUILTIN_CORPUS
    tokenizer: str | None = None
    vocab_size: int = 4096
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int | None = None
    n_ctx: int = 256
    batch_size: int = 16
    max_steps: int = 200
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_windows: int = 64
    ckpt_every: int = 50
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        if self.variant not in VARIANT_SPACES:
            raise ValueError(f"variant must be one of {tuple(VARIANT_SPACES)}, got {self.variant!r}.")
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "n_ctx", "batch_size",
                     "max_steps", "eval_every", "ckpt_every", "keep_checkpoints"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        for name in ("seed", "warmup_steps", "eval_windows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}.")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}).")
        if self.n_ctx < 2:
            raise ValueError(f"n_ctx must be at least 2 (BOS + one token), got {self.n_ctx}.")
        if not (self.lr > 0 and 0 <= self.min_lr_ratio <= 1 and self.grad_clip >= 0):
            raise ValueError("need lr > 0, 0 <= min_lr_ratio <= 1 and grad_clip >= 0 (0 = no clipping).")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig keys {unknown}; known: {sorted(known)}.")
        return cls(**data)

    def identity(self) -> dict[str, Any]:
        """The keys that must match for a resume (everything except file-writing cadence)."""
        return {k: v for k, v in self.to_dict().items() if k not in OPERATIONAL_KEYS}


def variant_edits(variant: str) -> list[Edit]:
    """The edits active during training and evaluation of ``variant``: none for ``baseline``,
    the parallel part removed (``s_par = 0``) in every layer of the variant's edit space otherwise."""
    if variant not in VARIANT_SPACES:
        raise ValueError(f"variant must be one of {tuple(VARIANT_SPACES)}, got {variant!r}.")
    space = VARIANT_SPACES[variant]
    return [] if space is None else edits_for_space(space, s_par=0.0)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimiser step ``step`` (0-based): linear warmup, then cosine decay
    from ``lr`` to ``min_lr_ratio * lr`` at ``max_steps``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.max_steps - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    floor = cfg.min_lr_ratio * cfg.lr
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))
