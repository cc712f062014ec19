"""A pre-tokenised corpus, read once (a single pass): the token files of
``studies/data/build_pass_corpus.py``.

A pre-tokenised corpus directory holds

* ``tokens.json``: ``{"dtype": "uint16", "eot_id": int, "splits": {"train": {"file", "tokens",
  "sha256"}, "validation": {...}}, ...}``,
* ``train.bin`` / ``validation.bin``: one stream of token ids per split (little endian, documents
  joined by ``<|endoftext|>``),
* ``tokenizer/``: the tokenizer that wrote them (``tokenizer.json`` + config).

Each stream is cut into non-overlapping windows ``[BOS] + (n_ctx - 1)`` tokens (the last partial
window is dropped), the same shape as :func:`tl_directional.training.data.make_windows`. A run on
such a corpus sees every training window at most once: :func:`check_single_pass` refuses a
``max_steps x batch_size`` larger than the number of training windows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import TLDirectionalError

#: The file that marks a directory as a pre-tokenised corpus.
PRETOKENISED_META = "tokens.json"
#: Token file dtypes this reader understands (numpy names, little endian).
TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}


class PretokenisedCorpusError(TLDirectionalError, ValueError):
    """A pre-tokenised corpus directory is incomplete, corrupt, or too small for the run."""


def is_pretokenised(corpus: str | os.PathLike[str]) -> bool:
    """Whether ``corpus`` is a directory with a :data:`PRETOKENISED_META` file."""
    return (Path(corpus).expanduser() / PRETOKENISED_META).is_file()


def read_meta(corpus: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``tokens.json`` of a pre-tokenised corpus (checked for the keys the reader needs)."""
    path = Path(corpus).expanduser() / PRETOKENISED_META
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PretokenisedCorpusError(
            f"cannot read {path} ({e}); rebuild the corpus with `python -m studies.data.build_pass_corpus`") from None
    dtype = meta.get("dtype")
    if dtype not in TOKEN_DTYPES:
        raise PretokenisedCorpusError(
            f"{path}: dtype must be one of {sorted(TOKEN_DTYPES)}, got {dtype!r}; rebuild the corpus")
    for split in ("train", "validation"):
        entry = meta.get("splits", {}).get(split)
        if not isinstance(entry, dict) or "file" not in entry or "tokens" not in entry:
            raise PretokenisedCorpusError(
                f"{path}: splits.{split} must name its 'file' and 'tokens'; got {entry!r}; rebuild the corpus")
    return meta


def read_tokens(corpus: str | os.PathLike[str], split: str) -> Tensor:
    """All token ids of ``split`` (``"train"`` or ``"validation"``) as a 1-D int64 tensor.

    Raises:
        PretokenisedCorpusError: the file is missing, or its length disagrees with ``tokens.json``.
    """
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    root = Path(corpus).expanduser()
    meta = read_meta(root)
    entry = meta["splits"][split]
    path = root / entry["file"]
    if not path.is_file():
        raise PretokenisedCorpusError(f"{path} is missing; rebuild the corpus with `python -m studies.data.build_pass_corpus`")
    arr = np.fromfile(path, dtype=np.dtype(TOKEN_DTYPES[meta["dtype"]]))
    if arr.size != int(entry["tokens"]):
        raise PretokenisedCorpusError(
            f"{path} holds {arr.size} tokens but tokens.json says {entry['tokens']} (truncated or replaced file); "
            "rebuild the corpus with `python -m studies.data.build_pass_corpus`")
    return torch.from_numpy(arr.astype(np.int64))


def stream_windows(ids: Tensor, n_ctx: int, bos_id: int) -> Tensor:
    """``[n, n_ctx]`` windows ``[BOS] + ids[k (n_ctx - 1) : (k + 1)(n_ctx - 1)]`` of a 1-D id tensor
    (non-overlapping; a last partial window is dropped)."""
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if n_ctx < 2:
        raise ValueError(f"n_ctx must be at least 2 (BOS + one token), got {n_ctx}")
    body = n_ctx - 1
    n = ids.numel() // body
    rows = ids[: n * body].reshape(n, body).long()
    return torch.cat([torch.full((n, 1), int(bos_id), dtype=torch.long), rows], dim=1)


def check_single_pass(n_train_windows: int, max_steps: int, batch_size: int, corpus: str = "") -> None:
    """Refuse a run that would see a training window twice (``max_steps x batch_size`` windows
    asked for, ``n_train_windows`` available)."""
    need = max_steps * batch_size
    if need > n_train_windows:
        raise PretokenisedCorpusError(
            f"max_steps={max_steps} x batch_size={batch_size} = {need} windows, but the pre-tokenised corpus "
            f"{corpus} holds {n_train_windows} training windows: a single pass allows at most "
            f"{n_train_windows // batch_size} steps; lower --max-steps or --batch-size (or --n-ctx)")


__all__ = ["PRETOKENISED_META", "TOKEN_DTYPES", "PretokenisedCorpusError", "check_single_pass", "is_pretokenised",
           "read_meta", "read_tokens", "stream_windows"]
