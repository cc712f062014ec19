"""Fixtures of the integration tests alone (the tiny models themselves are session fixtures of
tests/conftest.py, shared with every folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# -- the tiny training run (test_train, test_faults; its config is _training.py) --------


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 512-token BPE tokenizer, trained on the bundled held-out text, for every training
    test (training it is the slow part of their setup)."""
    from tl_directional.io.corpus import heldout_text
    from tl_directional.model.load import train_tokenizer

    out = tmp_path_factory.mktemp("tok")
    train_tokenizer(heldout_text(), 512, model_max_length=32).save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def data(tok_dir: Path) -> Any:
    """The tiny training run's data (``training.Data``) with the shared tokenizer."""
    from tests.integration._training import cfg
    from tl_directional import training as T

    return T.prepare_data(cfg(tok_dir))
