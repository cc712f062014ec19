"""Training data: the corpus, its tokenizer, fixed-length token windows and the batch order.

The data order is a pure function of ``(seed, step)`` (:func:`batch_indices`), so a resumed run
sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..core.errors import TLDirectionalError
from ..io.corpus import heldout_info, heldout_text, load_split, split_manifest
from ..io.records import sha256_file
from ..model.load import ENDOFTEXT, train_tokenizer
from .config import BUILTIN_CORPUS, TOKENIZER_DIR, TrainConfig
from .pretokenised import check_single_pass, is_pretokenised, read_meta, read_tokens, stream_windows


class TokenizerMismatchError(TLDirectionalError, ValueError):
    """A tokenizer does not fit the model it is paired with."""


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
        lines = heldout_text().splitlines()
        cut = int(len(lines) * 0.9)
        info = {"corpus": BUILTIN_CORPUS, "note": "shipped held-out slice (test-split text), "
                "first 90% of lines for training, rest for validation; for tests only",
                "sha256": heldout_info().get("sha256")}
        return "\n".join(lines[:cut]) + "\n", "\n".join(lines[cut:]) + "\n", info
    path = Path(corpus).expanduser()
    if not (path / "SPLIT.json").is_file():
        raise FileNotFoundError(
            f"corpus directory {path} has no SPLIT.json (missing corpus). Create it with "
            f"`python -m studies.data.fetch_corpus --out {path}` (needs `apt-get install bible-kjv`), "
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
        return sha256_file(path)
    except FileNotFoundError:
        raise TokenizerMismatchError(
            f"tokenizer directory {Path(tokenizer_dir)} has no tokenizer.json; pass a directory "
            "written by tokenizer.save_pretrained() (e.g. RUN/tokenizer of an earlier run)."
        ) from None


def load_tokenizer(tokenizer_dir: str | os.PathLike[str]) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer_sha256(tokenizer_dir)  # clear error when tokenizer.json is missing
    return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))


def encode_text(tokenizer: Any, text: str) -> list[int]:
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
    and save it there) and cut both splits into windows. A pre-tokenised corpus
    (:mod:`.pretokenised`) brings its own tokenizer and is read in a single pass."""
    if cfg.corpus != BUILTIN_CORPUS and is_pretokenised(cfg.corpus):
        return _prepare_pretokenised(cfg, run_dir)
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
            save_tokenizer_atomic(tokenizer, tok_dir)
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
    train = make_windows(encode_text(tokenizer, train_text), cfg.n_ctx, bos)
    val = make_windows(encode_text(tokenizer, val_text), cfg.n_ctx, bos)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"corpus {cfg.corpus} is too short for one window of n_ctx={cfg.n_ctx} tokens.")
    if cfg.eval_windows:
        val = val[: cfg.eval_windows]
    info = dict(info, train_tokens=int(train.numel()), train_windows=len(train),
                validation_windows=len(val))
    return Data(tokenizer, train, val, sha, info)


def _prepare_pretokenised(cfg: TrainConfig, run_dir: str | os.PathLike[str] | None) -> Data:
    """:class:`Data` of a pre-tokenised corpus: its own tokenizer (copied to ``RUN/tokenizer``),
    its token streams cut into windows, at most one pass over the training windows."""
    root = Path(cfg.corpus).expanduser()
    meta = read_meta(root)
    tok_dir = root / TOKENIZER_DIR
    sha = tokenizer_sha256(tok_dir)
    if cfg.tokenizer is not None and tokenizer_sha256(cfg.tokenizer) != sha:
        raise TokenizerMismatchError(
            f"tokenizer {cfg.tokenizer} is not the one that tokenised {root} ({tok_dir}); "
            "leave --tokenizer unset for a pre-tokenised corpus")
    tokenizer = load_tokenizer(tok_dir)
    if len(tokenizer) > cfg.vocab_size:
        raise TokenizerMismatchError(
            f"corpus {root} was tokenised with {len(tokenizer)} tokens but the model's vocab_size is "
            f"{cfg.vocab_size}; pass --vocab-size {len(tokenizer)} (or larger).")
    if run_dir is not None and not (Path(run_dir) / TOKENIZER_DIR / "tokenizer.json").is_file():
        save_tokenizer_atomic(tokenizer, Path(run_dir) / TOKENIZER_DIR)
    bos = int(meta.get("eot_id", tokenizer.bos_token_id))
    train = stream_windows(read_tokens(root, "train"), cfg.n_ctx, bos)
    val = stream_windows(read_tokens(root, "validation"), cfg.n_ctx, bos)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"corpus {root} is too short for one window of n_ctx={cfg.n_ctx} tokens.")
    check_single_pass(len(train), cfg.max_steps, cfg.batch_size, str(root))
    if cfg.eval_windows:
        val = val[: cfg.eval_windows]
    info = {"corpus": str(root), "pretokenised": True, "name": meta.get("name"),
            "sha256": meta.get("sha256", {}), "single_pass": True,
            "train_tokens": int(train.numel()), "train_windows": len(train), "validation_windows": len(val),
            "train_windows_used": cfg.max_steps * cfg.batch_size}
    return Data(tokenizer, train, val, sha, info)


def save_tokenizer_atomic(tokenizer: Any, out: Path) -> None:
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


def data_sha256(data: Data) -> str:
    """sha256 of the token windows a run trains and validates on (its corpus identity)."""
    h = hashlib.sha256()
    for t in (data.train, data.validation):
        t = t.detach().cpu().long().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()
