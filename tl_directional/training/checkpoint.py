"""Checkpoints and run records: write, read and verify checkpoints, check that a checkpoint may
be resumed by the current run, the metrics CSV, and clean-up of crashed writers' temporaries.

A checkpoint is a safetensors file (model and AdamW tensors; never pickle) plus a sealed JSON
record (config, step, scheduler, metrics, the safetensors file's sha256), each written to a temp
file and renamed; it counts only once its JSON exists, so a crash mid-write never replaces a good
checkpoint.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

from torch import Tensor

from ..io.atomic import ArtefactError, atomic_write_bytes, fault_point
from ..io.records import seal, sealed_json_loads
from .config import CHECKPOINT_DIR, INIT_DIR, OPERATIONAL_KEYS, TOKENIZER_DIR, TrainConfig
from .data import TokenizerMismatchError

#: ``format`` of a checkpoint record (kept as it was when the trainer was one module: files on
#: disk stay readable).
CHECKPOINT_FORMAT = "tl_directional.train/1"


class CheckpointError(ArtefactError):
    """A checkpoint is missing, corrupt, truncated or does not belong to this run."""


class ConfigMismatchError(CheckpointError):
    """Resuming a run with a configuration that differs from the checkpoint's."""


def json_bytes(obj: Any) -> bytes:
    """``obj`` as the indented, key-sorted UTF-8 JSON of the run's records."""
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


def diff_config(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, current)}`` for the keys that differ, the operational ones left out."""
    keys = (set(saved) | set(current)) - OPERATIONAL_KEYS
    return {k: (saved.get(k), current.get(k)) for k in sorted(keys) if saved.get(k) != current.get(k)}


def check_resumable(meta: dict[str, Any], json_path: Path, cfg: TrainConfig, *, lane: str,
                    tokenizer_sha256: str, data_sha256: str, run_dir: Path) -> None:
    """Raise unless the checkpoint record ``meta`` (read from ``json_path``) belongs to this run:
    same configuration (up to :data:`~.config.OPERATIONAL_KEYS`), same TransformerLens lane, same
    tokenizer, same token windows.

    Raises:
        ConfigMismatchError: the configuration differs.
        CheckpointError: another lane or other data.
        TokenizerMismatchError: another tokenizer.
    """
    diff = diff_config(meta.get("config", {}), cfg.to_dict())
    if diff:
        lines = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise ConfigMismatchError(
            f"cannot resume from {json_path}: the configuration differs ({lines}). Pass the "
            "same settings to resume, or use a new --out directory for a different run."
        )
    if meta.get("lane") != lane:
        raise CheckpointError(f"{json_path} was written on the {meta.get('lane')} lane; this is "
                              f"the {lane} lane. Resume it with the TransformerLens it was made with.")
    if meta.get("tokenizer_sha256") != tokenizer_sha256:
        raise TokenizerMismatchError(
            f"{json_path} was trained with tokenizer sha256 {meta.get('tokenizer_sha256')}, "
            f"but the tokenizer now in use has {tokenizer_sha256}. Resume with the "
            f"run's own tokenizer ({run_dir / TOKENIZER_DIR})."
        )
    if meta.get("data_sha256") not in (None, data_sha256):
        raise CheckpointError(
            f"{json_path} was trained on other data (token windows sha256 {meta['data_sha256'][:12]}..., "
            f"now {data_sha256[:12]}...): the corpus or its split changed. Resume with the "
            "corpus the run started with, or use a new --out directory."
        )


def write_checkpoint(run_dir: Path, step: int, tensors: dict[str, Tensor], record: dict[str, Any], *,
                     keep: int) -> Path:
    """Write ``checkpoints/ckpt-STEP.{safetensors,json}`` (tensors first, the sealed record last,
    with the tensors' file name, size and sha256 added to ``record``), then delete all but the
    newest ``keep`` checkpoints. Returns the record's path."""
    import torch
    from safetensors.torch import save as st_save

    ckdir = Path(run_dir) / CHECKPOINT_DIR
    stem = f"ckpt-{step:07d}"
    blob = st_save(tensors)
    atomic_write_bytes(ckdir / f"{stem}.safetensors", blob)
    fault_point("train.between_tensors_and_record")
    meta = {**record, "tensors": f"{stem}.safetensors", "bytes": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(), "torch": torch.__version__}
    # The record goes last: a checkpoint exists only once its JSON does.
    path = ckdir / f"{stem}.json"
    atomic_write_bytes(path, json_bytes(seal(meta)))
    for old in checkpoint_paths(run_dir)[:-keep]:
        old.with_suffix(".safetensors").unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    return path


def write_metrics_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the run's metrics rows as ``metrics.csv`` (atomically)."""
    buf = io.StringIO()
    cols = ["variant", "seed", "step", "tokens", "lr", "train_loss", "val_loss"]
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    atomic_write_bytes(path, buf.getvalue().encode())


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
