"""The sweep's resumable store: the sealed checkpoint of its sums after each batch, the model and
token fingerprints that keep another sweep from resuming it, and the error that says what a
foreign checkpoint holds. :func:`tl_directional.evaluate.sweeps.runner.sweep` drives it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ...io.atomic import ArtefactError, atomic_write_bytes, fault_point
from ...io.records import SEAL_KEY, sealed_json_dumps, sealed_json_loads
from ...model.inputs import TokenBatch
from .metrics import MetricSums


@dataclass
class SweepProgress:
    """Resumable state of a sweep: sums per setting after ``batches_done`` batches."""

    fingerprint: dict
    batches_done: int = 0
    sums: dict[str, list[float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # label -> why the setting has no numbers

    def save(self, path: Path) -> None:
        # Sums are float64 on disk (JSON floats round-trip exactly) and counts exact ints,
        # so a resumed sweep continues from bit-identical sums; the record is sealed.
        atomic_write_bytes(path, sealed_json_dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> SweepProgress:
        raw = path.read_bytes()
        if not looks_like_progress(raw):  # never suggest deleting a file the library did not write
            raise ArtefactError(f"checkpoint {path} exists and is not a sweep checkpoint written by "
                                "tl-directional; it was left untouched: pass a new checkpoint path")
        fix = "delete it to start the sweep afresh"
        data = sealed_json_loads(raw, path, fix=fix)
        data.pop(SEAL_KEY, None)
        try:
            state = cls(**data)
            sums = {k: MetricSums.from_disk(v) for k, v in state.sums.items()}
            if not isinstance(state.batches_done, int) or isinstance(state.batches_done, bool):
                raise TypeError(f"batches_done is {state.batches_done!r}")
            if not isinstance(state.failed, dict) or not all(isinstance(v, str) for v in state.failed.values()):
                raise TypeError(f"failed is {state.failed!r}")
        except (TypeError, ValueError) as e:
            raise ArtefactError(f"{path} is not a readable sweep checkpoint ({e}); {fix}") from None
        state.sums = sums
        return state


def looks_like_progress(raw: bytes) -> bool:
    """Whether ``raw`` starts like a :class:`SweepProgress` record (sorted keys: ``batches_done``
    first), so that a damaged checkpoint of ours is told apart from someone else's file."""
    head = raw[:200].lstrip()
    return head.startswith(b"{") and b'"batches_done"' in head


class CheckpointMismatch(ArtefactError):
    """A sweep checkpoint that belongs to another sweep; says what it holds."""

    def __init__(self, path, diff: list[str], done: int, total: int, n_settings: int):
        self.path, self.diff, self.done, self.total, self.n_settings = path, diff, done, total, n_settings
        self.finished = done >= total
        held = ("a finished sweep" if self.finished else f"an unfinished sweep ({done} of {total} batches done)")
        plural = "s" if n_settings != 1 else ""
        super().__init__(f"checkpoint {path} holds {held} of {n_settings} setting{plural} that differs from this "
                         f"one in {diff}; pass another checkpoint path (or delete it: tl-directional wrote it)")


def model_fingerprint(model) -> dict:
    """Identity of a model for checkpoints: its class, its config and a sha256 of every
    parameter and buffer (names, shapes, dtypes and bytes), so that another model, or the
    same model with other weights, never resumes this one's sums."""
    h = hashlib.sha256()
    with torch.no_grad():
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        for name, t in sorted(tensors, key=lambda kv: kv[0]):
            t = t.detach().cpu().contiguous()
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    cfg = getattr(model, "cfg", None)
    cfg_items = cfg.to_dict() if hasattr(cfg, "to_dict") else vars(cfg) if cfg is not None else {}
    config = {k: str(v) for k, v in sorted(cfg_items.items()) if k not in ("device", "n_devices", "model_name")}
    return {"class": type(model).__name__, "config_sha256": hashlib.sha256(
        json.dumps(config, sort_keys=True).encode()).hexdigest(), "weights_sha256": h.hexdigest()}


def tokens_sha256(batch: TokenBatch) -> str:
    h = hashlib.sha256()
    for t in (batch.tokens, batch.attention_mask):
        t = t.detach().cpu().long().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def save_progress(state: SweepProgress, sums: dict, base_sums: MetricSums, path: Path) -> None:
    on_disk = SweepProgress(state.fingerprint, state.batches_done,
                        {**{k: v.to_disk() for k, v in sums.items()}, "__baseline__": base_sums.to_disk()},
                        dict(state.failed))
    on_disk.save(path)
    fault_point("sweep.after_checkpoint")


__all__ = ["CheckpointMismatch", "SweepProgress", "looks_like_progress", "model_fingerprint", "save_progress", "tokens_sha256"]
