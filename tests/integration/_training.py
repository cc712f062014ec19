"""The tiny training run shared by the training tests (test_train, test_faults); the tokenizer
and data fixtures built from it (``tok_dir``, ``data``) are in conftest.py."""

from __future__ import annotations

from pathlib import Path

from tl_directional import training as T

#: 6 optimiser steps of a 2-layer, 32-wide GPT-2 on 32-token windows (seconds on one core).
TINY = dict(vocab_size=512, n_layers=2, d_model=32, n_heads=4, n_ctx=32, batch_size=4,
            max_steps=6, warmup_steps=2, eval_every=3, ckpt_every=2, eval_windows=4, lr=5e-3)


def cfg(tok_dir: Path, **kw) -> T.TrainConfig:
    """The tiny run's config with the shared tokenizer, ``kw`` overriding any key."""
    return T.TrainConfig(tokenizer=str(tok_dir), **{**TINY, **kw})
