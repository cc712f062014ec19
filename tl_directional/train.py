"""Train a small GPT-2 with a directional edit active in every forward pass (METHOD.md sec. 7).

One entry point, three variants, identical in everything but the edit:

* ``baseline``: no edit.
* ``vpara``: value-space full-aggregate parallel removal, ``ValueScale(s_par=0.0, mode="full")``
  in every layer and head (each head's output ``o_t`` loses its part along the token's own value
  ``v_t``).
* ``attn-para``: residual-space attention parallel removal, ``ResidualScale("attn", s_par=0.0)``
  in every layer (the attention update loses its part along ``resid_pre``).

The model is trained *through* TransformerLens, so the very edit objects of :mod:`.edit` are in
the forward pass during training and evaluation, and gradients flow through them into the
parameters. On the bridge lane (TransformerLens >= 4) the model is
``TransformerBridge.boot_transformers`` of a freshly initialised Hugging Face GPT-2 directory and
the gradients land in the wrapped Hugging Face parameters; :func:`export_model` writes them back
out as a plain Hugging Face directory. On the legacy lane (TransformerLens 2.x) it is a
``HookedTransformer`` of the same directory; training works there too, but its unembedding is
untied from the embedding (``HookedTransformer`` keeps separate ``W_E`` / ``W_U``), so the result
is not the same model and exporting to Hugging Face format is bridge-lane only.

Reproducibility: the data order is a pure function of ``(seed, step)`` (a seeded permutation of
fixed-length windows per epoch, see :func:`batch_indices`), dropout is 0 and the learning rate is
a pure function of the step (:func:`lr_at`), so a run resumed from a checkpoint continues
bit-exactly (same thread count, same machine). Checkpoints are safetensors (model and AdamW
tensors; never pickle) plus a JSON record (config, step, scheduler, metrics, the safetensors
file's sha256), each written to a temp file and renamed; a checkpoint counts only once its JSON
exists, so a crash mid-write never replaces a good checkpoint.

Distributed: launched with ``torchrun --nproc_per_node N -m tl_directional.train ...`` the run uses
PyTorch ``DistributedDataParallel`` (gloo on CPU, nccl on CUDA); ``batch_size`` stays the *global*
batch, rank ``r`` takes rows ``r::N`` of it, so the run matches a single-process run up to float
reduction order.

Command line: ``python -m tl_directional.train --variant vpara --corpus DIR --out RUN`` or
``tl-directional train ...``; ``--help`` lists every setting.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .edit import Edit, ResidualScale, ValueScale, edit_hooks
from .fileio import (
    ArtefactError,
    atomic_write_bytes,
    check_model_dir,
    exclusive_lock,
    fault_point,
    replace_dir,
    seal,
    sealed_json_loads,
    write_manifest,
)

#: The training variants (METHOD.md sec. 7).
VARIANTS: tuple[str, ...] = ("baseline", "vpara", "attn-para")

#: ``corpus`` value that selects the tiny built-in corpus (the shipped held-out slice, cut in
#: two by lines). Good for tests and smoke runs only: it is test-split text.
BUILTIN_CORPUS = "builtin-heldout"

CHECKPOINT_FORMAT = "tl_directional.train/1"
CHECKPOINT_DIR = "checkpoints"
INIT_DIR = "init"
TOKENIZER_DIR = "tokenizer"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"

# Config keys that may change between an interrupted run and its resumption: they change how
# often files are written, not the trajectory of the weights.
_OPERATIONAL_KEYS = frozenset({"ckpt_every", "keep_checkpoints"})


class CheckpointError(ArtefactError):
    """A checkpoint is missing, corrupt, truncated or does not belong to this run."""


class ConfigMismatchError(CheckpointError):
    """Resuming a run with a configuration that differs from the checkpoint's."""


class TokenizerMismatchError(ValueError):
    """A tokenizer does not fit the model it is paired with."""


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """Everything that determines a training run (and so must match on resume).

    ``batch_size`` is the global batch (windows of ``n_ctx`` tokens per optimiser step, summed
    over ranks). ``corpus`` is a directory written by ``scripts/fetch_corpus.py`` (train split for
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
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}.")
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
        return {k: v for k, v in self.to_dict().items() if k not in _OPERATIONAL_KEYS}


def variant_edits(variant: str) -> list[Edit]:
    """The edits active during training and evaluation of ``variant``."""
    if variant == "baseline":
        return []
    if variant == "vpara":
        return [ValueScale(s_par=0.0, mode="full")]
    if variant == "attn-para":
        return [ResidualScale("attn", s_par=0.0)]
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}.")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimiser step ``step`` (0-based): linear warmup, then cosine decay
    from ``lr`` to ``min_lr_ratio * lr`` at ``max_steps``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.max_steps - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    floor = cfg.min_lr_ratio * cfg.lr
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def _epoch_permutation(seed: int, epoch: int, n: int) -> Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7919 + 17) % 2**63)
    return torch.randperm(n, generator=gen)


def batch_indices(seed: int, step: int, batch_size: int, n_windows: int) -> Tensor:
    """Training-window indices of global batch ``step``: a pure function of its arguments.

    Sample ``k = step * batch_size + j`` is window ``perm_e[k % n_windows]`` of epoch
    ``e = k // n_windows``, where ``perm_e`` is a seeded permutation, so every epoch visits every
    window once and a resumed run sees exactly the batches an uninterrupted one would.
    """
    if n_windows < 1:
        raise ValueError("no training windows: the training text is shorter than one window.")
    ks = torch.arange(step * batch_size, (step + 1) * batch_size)
    epochs = ks // n_windows
    out = torch.empty(batch_size, dtype=torch.long)
    for e in epochs.unique().tolist():
        sel = epochs == e
        out[sel] = _epoch_permutation(seed, e, n_windows)[ks[sel] % n_windows]
    return out


# ---------------------------------------------------------------------------------------------
# Data and tokenizer
# ---------------------------------------------------------------------------------------------


@dataclass
class Data:
    """Tokenised corpus: fixed-length windows, each ``[BOS] + (n_ctx - 1)`` text tokens."""

    tokenizer: Any
    train: Tensor  # [n_train_windows, n_ctx]
    validation: Tensor  # [n_val_windows, n_ctx]
    tokenizer_sha256: str
    corpus_info: dict[str, Any] = field(default_factory=dict)


def _corpus_texts(corpus: str) -> tuple[str, str, dict[str, Any]]:
    """(train text, validation text, provenance) of a corpus setting."""
    if corpus == BUILTIN_CORPUS:
        from .corpus import heldout_info, heldout_text

        lines = heldout_text().splitlines()
        cut = int(len(lines) * 0.9)
        info = {"corpus": BUILTIN_CORPUS, "note": "shipped held-out slice (test-split text), "
                "first 90% of lines for training, rest for validation; for tests only",
                "sha256": heldout_info().get("sha256")}
        return "\n".join(lines[:cut]) + "\n", "\n".join(lines[cut:]) + "\n", info
    from .corpus import load_split, split_manifest

    path = Path(corpus).expanduser()
    if not (path / "SPLIT.json").is_file():
        raise FileNotFoundError(
            f"corpus directory {path} has no SPLIT.json (missing corpus). Create it with "
            f"`python scripts/fetch_corpus.py --out {path}` (needs `apt-get install bible-kjv`), "
            f"or pass --corpus {BUILTIN_CORPUS} for a tiny smoke run."
        )
    manifest = split_manifest(path)
    info = {"corpus": str(path), "splits": {k: {"sha256": v.get("sha256"), "bytes": v.get("bytes")}
                                            for k, v in manifest["splits"].items()}}
    return load_split(path, "train"), load_split(path, "validation"), info


def tokenizer_sha256(tokenizer_dir: str | os.PathLike[str]) -> str:
    """sha256 of a tokenizer directory's ``tokenizer.json`` (its identity for checkpoints)."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise TokenizerMismatchError(
            f"tokenizer directory {Path(tokenizer_dir)} has no tokenizer.json; pass a directory "
            "written by tokenizer.save_pretrained() (e.g. RUN/tokenizer of an earlier run)."
        ) from None


def load_tokenizer(tokenizer_dir: str | os.PathLike[str]) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer_sha256(tokenizer_dir)  # clear error when tokenizer.json is missing
    return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))


def _encode(tokenizer: Any, text: str) -> list[int]:
    """All token ids of ``text``, never truncated or padded.

    Uses the backend tokenizer (no "sequence longer than the model" warning for a whole corpus).
    ``transformers`` leaves truncation / padding switched on in the backend after a call with
    ``truncation=True``; they are switched off for this call and restored afterwards.
    """
    backend = tokenizer.backend_tokenizer
    trunc, pad = backend.truncation, backend.padding
    try:
        backend.no_truncation()
        backend.no_padding()
        return backend.encode(text).ids
    finally:
        if trunc is not None:
            backend.enable_truncation(**trunc)
        if pad is not None:
            backend.enable_padding(**{k: v for k, v in pad.items() if k != "length" or v is not None})


def make_windows(ids: Sequence[int], n_ctx: int, bos_id: int) -> Tensor:
    """Cut a token stream into non-overlapping windows ``[BOS] + (n_ctx - 1)`` tokens (the
    tail that does not fill a window is dropped)."""
    body = n_ctx - 1
    n = len(ids) // body
    t = torch.as_tensor(list(ids[: n * body]), dtype=torch.long).reshape(n, body)
    return torch.cat([torch.full((n, 1), bos_id, dtype=torch.long), t], dim=1)


def prepare_data(cfg: TrainConfig, run_dir: str | os.PathLike[str] | None = None, *,
                 train_tokenizer_if_missing: bool = True) -> Data:
    """Load the corpus, get the tokenizer (``cfg.tokenizer``, ``RUN/tokenizer``, or train one
    and save it there) and cut both splits into windows."""
    from .models import ENDOFTEXT, train_tokenizer

    train_text, val_text, info = _corpus_texts(cfg.corpus)
    tok_dir: Path | None = None
    if cfg.tokenizer is not None:
        tok_dir = Path(cfg.tokenizer).expanduser()
        tokenizer = load_tokenizer(tok_dir)
    elif run_dir is not None and (Path(run_dir) / TOKENIZER_DIR / "tokenizer.json").is_file():
        tok_dir = Path(run_dir) / TOKENIZER_DIR
        tokenizer = load_tokenizer(tok_dir)
    else:
        if not train_tokenizer_if_missing:
            raise TokenizerMismatchError(f"no tokenizer in {run_dir}/{TOKENIZER_DIR}")
        tokenizer = train_tokenizer(train_text, cfg.vocab_size, model_max_length=cfg.n_ctx)
        if run_dir is not None:
            tok_dir = Path(run_dir) / TOKENIZER_DIR
            _save_tokenizer_atomic(tokenizer, tok_dir)
    if len(tokenizer) > cfg.vocab_size:
        raise TokenizerMismatchError(
            f"tokenizer {tok_dir} has {len(tokenizer)} tokens but the model's vocab_size is "
            f"{cfg.vocab_size}; pass --vocab-size {len(tokenizer)} (or larger) or a matching tokenizer."
        )
    if tok_dir is not None:
        sha = tokenizer_sha256(tok_dir)
    else:
        sha = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    bos = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    if bos is None or bos == tokenizer.unk_token_id and tokenizer.unk_token != ENDOFTEXT:
        bos = tokenizer.bos_token_id
    train = make_windows(_encode(tokenizer, train_text), cfg.n_ctx, bos)
    val = make_windows(_encode(tokenizer, val_text), cfg.n_ctx, bos)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"corpus {cfg.corpus} is too short for one window of n_ctx={cfg.n_ctx} tokens.")
    if cfg.eval_windows:
        val = val[: cfg.eval_windows]
    info = dict(info, train_tokens=int(train.numel()), train_windows=len(train),
                validation_windows=len(val))
    return Data(tokenizer, train, val, sha, info)


def _save_tokenizer_atomic(tokenizer: Any, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700
    try:
        tokenizer.save_pretrained(str(tmp))
        try:
            os.rename(tmp, out)
        except OSError:  # another rank / process finished first: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def _gpt2_init_(model: torch.nn.Module, seed: int, n_layers: int) -> None:
    """GPT-2 style init, seeded per parameter name: N(0, 0.02) for matrices (output projections
    scaled by 1/sqrt(2 n_layers)), zero biases, unit LayerNorm gains."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith("c_proj.weight") else 0.02
                p.copy_(std * torch.randn(p.shape, generator=gen))


def build_init_dir(cfg: TrainConfig, tokenizer: Any, path: str | os.PathLike[str]) -> Path:
    """Write the seeded, untrained GPT-2 of ``cfg`` (+ tokenizer) as a Hugging Face directory."""
    import transformers

    from .models import ENDOFTEXT, _hf_config, _quiet_transformers

    out = Path(path)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    special = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = _hf_config("gpt2", n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads,
                        n_kv_heads=cfg.n_heads, d_mlp=cfg.d_mlp or 4 * cfg.d_model,
                        n_ctx=cfg.n_ctx, vocab_size=cfg.vocab_size, special_id=special)
    with torch.random.fork_rng(devices=[]):
        model = transformers.GPT2LMHeadModel(config)
    _gpt2_init_(model, cfg.seed, cfg.n_layers)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700
    try:
        with _quiet_transformers():
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
        write_manifest(tmp, "init")
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _load_init(init: Path, device: torch.device) -> Any:
    """Load the run's seeded initial model, verified first: a damaged file is a
    :class:`CheckpointError` naming it (the directory can always be rebuilt from the seed)."""
    from .models import load_model

    fix = f"the init directory is made from the seed: delete {init} and run again to rebuild it"
    try:
        check_model_dir(init, "init")
        return load_model(init, device=device)
    except CheckpointError:
        raise
    except Exception as err:  # safetensors / transformers raise their own types
        raise CheckpointError(f"{init} cannot be loaded ({err}); {fix}") from None


def data_sha256(data: Data) -> str:
    """sha256 of the token windows a run trains and validates on (its corpus identity)."""
    h = hashlib.sha256()
    for t in (data.train, data.validation):
        t = t.detach().cpu().long().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _is_bridge(model: Any) -> bool:
    return hasattr(model, "original_model")


def canonical_state_dict(model: Any) -> dict[str, Tensor]:
    """The model's weights under their native names, as contiguous detached copies.

    Bridge lane: the wrapped Hugging Face model's own keys (``transformer.h.0.attn.c_attn.weight``
    ...), i.e. exactly what ``save_pretrained`` of an unwrapped model holds. Legacy lane: the
    ``HookedTransformer`` state dict (``blocks.0.attn.W_Q`` ...).
    """
    if _is_bridge(model):
        hf = model.original_model
        wanted = _hf_reference_keys(hf.config)
        sd = {k.replace("._original_component", ""): v for k, v in hf.state_dict().items()}
        missing = [k for k in wanted if k not in sd]
        if missing:
            raise RuntimeError(f"cannot map bridge weights back to Hugging Face names: {missing[:5]}")
        return {k: sd[k].detach().clone().contiguous() for k in wanted}
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
            if torch.is_floating_point(v) and not k.endswith((".IGNORE", ".mask"))}


def _hf_reference_keys(hf_config: Any) -> list[str]:
    import transformers

    with torch.device("meta"):
        ref = transformers.GPT2LMHeadModel(hf_config)
    return list(ref.state_dict().keys())


def load_canonical_state_dict_(model: Any, state: dict[str, Tensor], *, source: str) -> None:
    """Copy ``state`` (from :func:`canonical_state_dict`) into ``model``'s parameters in place."""
    if _is_bridge(model):
        live = {k.replace("._original_component", ""): v
                for k, v in model.original_model.state_dict(keep_vars=True).items()}
    else:
        live = dict(model.state_dict(keep_vars=True))
    missing = [k for k in state if k not in live]
    if missing:
        raise CheckpointError(f"{source}: tensors {missing[:5]} do not exist in this model; the "
                              "checkpoint belongs to a different architecture or lane.")
    with torch.no_grad():
        for k, v in state.items():
            if tuple(live[k].shape) != tuple(v.shape):
                raise CheckpointError(f"{source}: {k} has shape {tuple(v.shape)} but the model "
                                      f"expects {tuple(live[k].shape)}.")
            live[k].copy_(v)


def trainable_parameters(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """Named parameters that get gradients, each storage once.

    On a GPT-2 bridge the fused ``c_attn`` weight is also exposed as three views (q, k, v); the
    forward pass uses the views, so the fused base never receives a gradient. It is frozen
    (``requires_grad=False``) here, which ``DistributedDataParallel`` needs (every trainable
    parameter must receive a gradient); its storage still changes through the views.
    """
    params = list(model.named_parameters())
    by_storage: dict[int, list[tuple[str, torch.nn.Parameter]]] = {}
    for name, p in params:
        by_storage.setdefault(p.untyped_storage().data_ptr(), []).append((name, p))
    for group in by_storage.values():
        if len(group) < 2:
            continue
        for _name, p in group:
            others = sum(q.numel() for _, q in group if q is not p)
            if p.numel() == others:
                p.requires_grad_(False)
    return [(n, p) for n, p in params if p.requires_grad]


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data)


def _json_dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def checkpoint_paths(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The run's checkpoint records (``ckpt-STEP.json``), oldest first."""
    d = Path(run_dir) / CHECKPOINT_DIR
    if not d.is_dir():
        return []
    found = []
    for p in d.glob("ckpt-*.json"):
        try:
            found.append((int(p.stem.split("-", 1)[1]), p))
        except ValueError:
            continue
    return [p for _, p in sorted(found)]


def read_checkpoint(json_path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Read and verify one checkpoint: its JSON record and its safetensors tensors.

    Raises:
        CheckpointError: unreadable / truncated JSON, missing or corrupt safetensors (sha256
            mismatch), with the file name and what to do.
    """
    from safetensors.torch import load as st_load

    json_path = Path(json_path)
    earlier = [p for p in checkpoint_paths(json_path.parent.parent) if p != json_path]
    fix = (f"Delete {json_path} and its .safetensors to resume from the previous checkpoint "
           f"{earlier[-1]}" if earlier else "Start a new run in a fresh --out directory")
    try:
        raw = json_path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint record {json_path} is missing. {fix}.") from None
    try:
        meta = sealed_json_loads(raw, f"checkpoint record {json_path}", fix=f"{fix}.")
    except ArtefactError as err:
        raise CheckpointError(str(err)) from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{json_path} is not a {CHECKPOINT_FORMAT} checkpoint record. {fix}.")
    for key, kind in (("step", int), ("bytes", int), ("sha256", str), ("config", dict), ("metrics", list),
                      ("pending_train_losses", list)):
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(f"checkpoint record {json_path}: {key!r} is {value!r}, not a "
                                  f"{kind.__name__}. {fix}.")
    st_path = json_path.with_name(meta.get("tensors", json_path.stem + ".safetensors"))
    try:
        blob = st_path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint tensors {st_path} are missing. {fix}.") from None
    sha = hashlib.sha256(blob).hexdigest()
    if sha != meta.get("sha256") or len(blob) != meta.get("bytes"):
        raise CheckpointError(
            f"checkpoint tensors {st_path} are corrupt or truncated ({len(blob)} bytes, sha256 "
            f"{sha[:12]}..., expected {meta.get('bytes')} bytes, {str(meta.get('sha256'))[:12]}...). {fix}."
        )
    try:
        tensors = st_load(blob)
    except Exception as err:  # safetensors raises its own error types
        raise CheckpointError(f"checkpoint tensors {st_path} cannot be parsed ({err}). {fix}.") from None
    return meta, tensors


def _diff_config(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    keys = (set(saved) | set(current)) - _OPERATIONAL_KEYS
    return {k: (saved.get(k), current.get(k)) for k in sorted(keys) if saved.get(k) != current.get(k)}


# ---------------------------------------------------------------------------------------------
# Distributed helpers
# ---------------------------------------------------------------------------------------------


@dataclass
class Dist:
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


# ---------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------


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
        self.model = _load_init(self.run_dir / INIT_DIR, self.device)
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
        from safetensors.torch import save as st_save

        if self.dist.rank != 0:
            return None
        ckdir = self.run_dir / CHECKPOINT_DIR
        stem = f"ckpt-{self.step:07d}"
        blob = st_save(self._checkpoint_tensors())
        _write_atomic(ckdir / f"{stem}.safetensors", blob)
        fault_point("train.between_tensors_and_record")
        meta = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "tokens_seen": self.step * self.cfg.batch_size * self.cfg.n_ctx,
            "config": self.cfg.to_dict(),
            "lane": "bridge" if _is_bridge(self.model) else "legacy",
            "tokenizer_sha256": self.data.tokenizer_sha256,
            "data_sha256": self.data_sha256,
            "corpus": self.data.corpus_info,
            "scheduler": {"kind": "linear warmup + cosine", "next_lr": lr_at(self.step, self.cfg),
                          "warmup_steps": self.cfg.warmup_steps, "max_steps": self.cfg.max_steps,
                          "min_lr_ratio": self.cfg.min_lr_ratio},
            "metrics": self.metrics,
            "pending_train_losses": self._train_losses,
            "tensors": f"{stem}.safetensors",
            "bytes": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(),
            "torch": torch.__version__,
        }
        # The record goes last: a checkpoint exists only once its JSON does.
        path = ckdir / f"{stem}.json"
        _write_atomic(path, _json_dumps(seal(meta)))
        for old in checkpoint_paths(self.run_dir)[: -self.cfg.keep_checkpoints]:
            old.with_suffix(".safetensors").unlink(missing_ok=True)
            old.unlink(missing_ok=True)
        return path

    def load_checkpoint(self, json_path: str | os.PathLike[str]) -> None:
        """Restore model, optimiser, step and metrics from a checkpoint (verified)."""
        json_path = Path(json_path)
        meta, tensors = read_checkpoint(json_path)
        diff = _diff_config(meta.get("config", {}), self.cfg.to_dict())
        if diff:
            lines = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
            raise ConfigMismatchError(
                f"cannot resume from {json_path}: the configuration differs ({lines}). Pass the "
                "same settings to resume, or use a new --out directory for a different run."
            )
        lane = "bridge" if _is_bridge(self.model) else "legacy"
        if meta.get("lane") != lane:
            raise CheckpointError(f"{json_path} was written on the {meta.get('lane')} lane; this is "
                                  f"the {lane} lane. Resume it with the TransformerLens it was made with.")
        if meta.get("tokenizer_sha256") != self.data.tokenizer_sha256:
            raise TokenizerMismatchError(
                f"{json_path} was trained with tokenizer sha256 {meta.get('tokenizer_sha256')}, "
                f"but the tokenizer now in use has {self.data.tokenizer_sha256}. Resume with the "
                f"run's own tokenizer ({self.run_dir / TOKENIZER_DIR})."
            )
        if meta.get("data_sha256") not in (None, self.data_sha256):
            raise CheckpointError(
                f"{json_path} was trained on other data (token windows sha256 {meta['data_sha256'][:12]}..., "
                f"now {self.data_sha256[:12]}...): the corpus or its split changed. Resume with the "
                "corpus the run started with, or use a new --out directory."
            )
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
            _write_metrics_csv(self.run_dir / METRICS_FILE, self.metrics)

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
            _write_atomic(self.run_dir / SUMMARY_FILE, _json_dumps(summary))
        return result


def _write_metrics_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    cols = ["variant", "seed", "step", "tokens", "lr", "train_loss", "val_loss"]
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    _write_atomic(path, buf.getvalue().encode())


def remove_orphan_temporaries(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files and directories that crashed writers left in ``run_dir``
    (``checkpoints/.ckpt-*.tmp``, ``.metrics.csv.*.tmp``, ``.init.*``...). Call it only while
    holding the run's lock: then no live writer owns them. Returns what was removed."""
    run = Path(run_dir)
    found = [p for p in (run / CHECKPOINT_DIR).glob(".ckpt-*.tmp")] + list(run.glob(".*.tmp"))
    found += [p for name in (INIT_DIR, TOKENIZER_DIR) for p in run.glob(f".{name}.*") if p.is_dir()]
    for p in found:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return found


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
            from .distributed import destroy_process_group

            destroy_process_group()


def _run_trainer(cfg: TrainConfig, run_dir: str | os.PathLike[str], *, resume: bool,
                 stop_after: int | None, progress: bool, data: Data | None,
                 device: str | torch.device, dist: Dist) -> TrainResult:
    # own frame: the Trainer and its DistributedDataParallel wrapper die when it returns
    trainer = Trainer(cfg, run_dir, data=data, device=device, dist=dist)
    trainer.resume_if_possible(resume)
    return trainer.run(stop_after=stop_after, progress=progress)


# ---------------------------------------------------------------------------------------------
# Export and evaluation of saved models
# ---------------------------------------------------------------------------------------------


def export_model(model: Any, tokenizer: Any, path: str | os.PathLike[str], *,
                 dtype: torch.dtype = torch.float16, extra_info: dict[str, Any] | None = None,
                 force: bool = False, force_hint: str = "pass force=True") -> Path:
    """Save a bridge-lane model as a plain Hugging Face directory (safetensors + tokenizer).

    The directory loads with ``TransformerBridge.boot_transformers(path)``,
    ``transformers.GPT2LMHeadModel.from_pretrained(path)`` and, on the legacy lane,
    :func:`tl_directional.models.load_model`. Written to a temporary sibling with a
    ``manifest.json`` and swapped in (:func:`tl_directional.fileio.replace_dir`); a
    non-empty ``path`` that is not a previous export (e.g. the run directory itself) is
    refused unless ``force``, so no user file is ever deleted.
    """
    import transformers

    from .models import BUILD_INFO_FILE, _quiet_transformers

    if not _is_bridge(model):
        raise NotImplementedError(
            "export_model needs a bridge-lane model (TransformerLens >= 4): a legacy "
            "HookedTransformer keeps an untied unembedding and TL-format weights, which do not map "
            "back onto GPT-2's Hugging Face layout. Train on the bridge lane to export."
        )
    cfg_dict = model.original_model.config.to_dict()
    # The bridge switches on output_attentions / eager attention for its hooks; the exported
    # model is a plain GPT-2 again.
    for key in ("output_attentions", "output_hidden_states"):
        cfg_dict[key] = False
    for key in ("_attn_implementation", "attn_implementation", "_attn_implementation_internal"):
        cfg_dict.pop(key, None)
    hf_config = transformers.GPT2Config.from_dict(cfg_dict)
    state = canonical_state_dict(model)
    with torch.random.fork_rng(devices=[]):
        fresh = transformers.GPT2LMHeadModel(hf_config)
    fresh.load_state_dict(state, strict=True)
    fresh = fresh.to(dtype)
    out = Path(path)
    with replace_dir(out, "export", force=force, force_hint=force_hint, command="tl-directional train --export") as tmp:
        with _quiet_transformers():
            fresh.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
        _portable_tokenizer_config(tmp)
        info = {"family": "gpt2", "architecture": "GPT2LMHeadModel", "random_weights": False,
                **(extra_info or {})}
        (tmp / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
    return out


def _portable_tokenizer_config(path: Path) -> None:
    """Name the tokenizer class ``PreTrainedTokenizerFast``, which transformers 4.x and 5.x both
    know (transformers 5 writes ``TokenizersBackend``, which 4.x cannot load)."""
    cfg_path = path / "tokenizer_config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def check_tokenizer_matches(model: Any, tokenizer: Any, where: str) -> None:
    """Raise :class:`TokenizerMismatchError` when ``tokenizer`` has ids the model cannot embed."""
    d_vocab = int(model.cfg.d_vocab)
    if len(tokenizer) > d_vocab:
        raise TokenizerMismatchError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens but the model embeds only "
            f"{d_vocab}; they do not belong together. Save the model with its own tokenizer "
            "(export_model does) or pass the tokenizer it was trained with."
        )


@torch.no_grad()
def evaluate_text(model: Any, text: str, *, n_ctx: int | None = None, batch_size: int = 8,
                  edits: Sequence[Edit] = ()) -> dict[str, float]:
    """Mean next-token loss and perplexity of ``model`` on ``text`` (windows as in training)."""
    tok = model.tokenizer
    check_tokenizer_matches(model, tok, "evaluate_text")
    n_ctx = n_ctx or int(model.cfg.n_ctx)
    windows = make_windows(_encode(tok, text), n_ctx, tok.bos_token_id)
    hooks = edit_hooks(model, *edits)
    total, count = 0.0, 0
    model.eval()
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size].to(model.cfg.device)
        with model.hooks(fwd_hooks=hooks):
            loss = model(chunk, return_type="loss")
        total += float(loss) * len(chunk)
        count += len(chunk)
    mean = total / max(count, 1)
    return {"loss": mean, "perplexity": math.exp(mean), "windows": count,
            "tokens_scored": count * (n_ctx - 1)}


# ---------------------------------------------------------------------------------------------
# Benchmark hook
# ---------------------------------------------------------------------------------------------


def step_time_ratio(*, n_steps: int = 5, warmup: int = 2, variant: str = "vpara",
                    cfg: TrainConfig | None = None, run_dir: str | os.PathLike[str] | None = None
                    ) -> dict[str, float]:
    """Training-step time with ``variant``'s edit active / baseline step time.

    Same model stack, same process, same batch: one :class:`Trainer` is built, and its hooks are
    swapped between the two timings (interleaved, median of ``n_steps`` each).
    """
    import statistics

    cfg = cfg or TrainConfig(max_steps=1000, eval_windows=1, batch_size=8)
    own = run_dir is None
    run_dir = Path(tempfile.mkdtemp(prefix="tld-bench-")) if own else Path(run_dir)
    try:
        trainer = Trainer(cfg, run_dir)
        tokens = trainer.batch(0)
        edited = edit_hooks(trainer.model, *variant_edits(variant))
        times: dict[str, list[float]] = {"baseline": [], variant: []}

        def one(hooks):
            trainer.model.train()
            t = time.perf_counter()
            with trainer.model.hooks(fwd_hooks=hooks):
                loss = trainer.model(tokens, return_type="loss")
            loss.backward()
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - t

        for i in range(warmup + n_steps):
            for name, hooks in (("baseline", []), (variant, edited)):
                dt = one(hooks)
                if i >= warmup:
                    times[name].append(dt)
        base = statistics.median(times["baseline"])
        other = statistics.median(times[variant])
        return {"baseline_s": base, f"{variant}_s": other, "ratio": other / base,
                "tokens_per_step": int(tokens.numel())}
    finally:
        if own:
            shutil.rmtree(run_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def add_config_arguments(p: argparse.ArgumentParser, defaults: TrainConfig | None = None) -> None:
    """Add one ``--flag`` per :class:`TrainConfig` field (shared with the experiment runner)."""
    d = defaults or TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(d, f.name)
        if f.name == "variant":
            p.add_argument(flag, choices=VARIANTS, default=value)
        elif f.name in ("tokenizer", "corpus"):
            p.add_argument(flag, default=value)
        elif f.name == "d_mlp":
            p.add_argument(flag, type=int, default=value, help="default 4 * d_model")
        else:
            p.add_argument(flag, type=type(value), default=value)


def config_from_args(args: argparse.Namespace, **override: Any) -> TrainConfig:
    data = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    data.update(override)
    return TrainConfig(**data)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tl-directional train",
        description="Train a GPT-2 with a directional edit active (baseline | vpara | attn-para). "
        "Resumes from the last checkpoint in --out. Use torchrun for several processes.",
    )
    p.add_argument("--out", required=True, help="run directory (created; resumed if it has checkpoints)")
    add_config_arguments(p)
    p.add_argument("--no-resume", action="store_true", help="refuse to continue existing checkpoints")
    p.add_argument("--stop-after", type=int, default=None, help="stop after this step (checkpointed)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="after training, save the model as a Hugging Face directory (bridge lane)")
    p.add_argument("--export-dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--export-force", action="store_true",
                   help="let --export replace a non-empty DIR that is not a previous export")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        cfg = config_from_args(args)
        if args.export:  # refuse a bad --export before training, not after
            from .fileio import check_replaceable

            check_replaceable(args.export, "export", force=args.export_force, force_hint="pass --export-force")
        result = train(cfg, args.out, resume=not args.no_resume, stop_after=args.stop_after,
                       progress=not args.quiet, device=args.device)
    except (CheckpointError, TokenizerMismatchError, FileNotFoundError, ValueError) as err:
        print(f"tl-directional train: error: {err}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        if result.final_val_loss is not None:
            print(f"{cfg.variant} seed {cfg.seed}: step {result.step}, final validation loss "
                  f"{result.final_val_loss:.4f} ({result.tokens_per_s:.0f} tokens/s)")
        else:
            print(f"{cfg.variant} seed {cfg.seed}: stopped at step {result.step} (checkpointed)")
        if args.export and result.step == cfg.max_steps:
            tokenizer = load_tokenizer(cfg.tokenizer or Path(args.out) / TOKENIZER_DIR)
            try:
                export_model(result.model, tokenizer, args.export, dtype=getattr(torch, args.export_dtype),
                             extra_info={"train_config": cfg.to_dict(), "final_val_loss": result.final_val_loss},
                             force=args.export_force, force_hint="pass --export-force")
            except ArtefactError as err:
                print(f"tl-directional train: error: {err}", file=sys.stderr)
                return 2
            print(f"exported to {args.export}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
