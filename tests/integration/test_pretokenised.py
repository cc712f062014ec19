"""The pre-tokenised corpus reader (tl_directional.training.pretokenised): a tiny synthetic token
file read into windows equal to an independent construction, a single pass enforced, damaged
files refused, and a resumed run on it equal to an uninterrupted one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tl_directional import training as T
from tl_directional.io.corpus import heldout_text
from tl_directional.model.load import train_tokenizer
from tl_directional.training.pretokenised import (
    PretokenisedCorpusError,
    check_single_pass,
    is_pretokenised,
    read_tokens,
    stream_windows,
)

from ._training import TINY


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A pre-tokenised corpus of the shipped held-out text: lines 0-599 train, 600-699 validation."""
    root = tmp_path_factory.mktemp("pass")
    lines = heldout_text().splitlines()
    train_text, val_text = "\n".join(lines[:600]), "\n".join(lines[600:700])
    tok = train_tokenizer(train_text, 300)
    tok.save_pretrained(str(root / "tokenizer"))
    meta = {"name": "tiny", "dtype": "uint16", "eot_id": 0, "splits": {}}
    for split, text in (("train", train_text), ("validation", val_text)):
        ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids + [0]
        np.asarray(ids, dtype="<u2").tofile(root / f"{split}.bin")
        meta["splits"][split] = {"file": f"{split}.bin", "tokens": len(ids)}
    (root / "tokens.json").write_text(json.dumps(meta))
    return root, tok, train_text


def tiny(corpus_dir, **kw) -> T.TrainConfig:
    return T.TrainConfig(corpus=str(corpus_dir), **{**TINY, "vocab_size": 300, **kw})


def test_windows_equal_an_independent_cut_of_the_encoded_text(corpus):
    root, tok, train_text = corpus
    assert is_pretokenised(root) and not is_pretokenised(root / "tokenizer")
    ids = tok.backend_tokenizer.encode(train_text, add_special_tokens=False).ids + [0]
    assert read_tokens(root, "train").tolist() == ids
    n_ctx = 32
    data = T.prepare_data(tiny(root, n_ctx=n_ctx, max_steps=2, batch_size=4, eval_windows=0))
    n = len(ids) // (n_ctx - 1)
    assert data.train.shape == (n, n_ctx)
    for k in (0, 1, n - 1):  # independent: [BOS] + the k-th run of n_ctx - 1 ids
        assert data.train[k].tolist() == [0] + ids[k * (n_ctx - 1):(k + 1) * (n_ctx - 1)]
    assert data.train.dtype == torch.long and data.corpus_info["single_pass"] is True
    assert stream_windows(torch.arange(10), 4, 99).tolist() == [[99, 0, 1, 2], [99, 3, 4, 5], [99, 6, 7, 8]]


def test_single_pass_is_enforced(corpus):
    root, _, _ = corpus
    n = len(T.prepare_data(tiny(root, max_steps=1)).train)
    T.prepare_data(tiny(root, max_steps=n // 4, batch_size=4))  # exactly within one pass
    with pytest.raises(PretokenisedCorpusError, match=r"single pass allows at most \d+ steps"):
        T.prepare_data(tiny(root, max_steps=n // 4 + 1, batch_size=4))
    with pytest.raises(PretokenisedCorpusError, match="max_steps=3 x batch_size=2 = 6 windows"):
        check_single_pass(5, 3, 2, "X")
    # and the batches of one pass never repeat a window
    idx = torch.cat([T.batch_indices(0, s, 4, n) for s in range(n // 4)])
    assert len(set(idx.tolist())) == len(idx)


def test_damaged_corpus_is_a_clear_error(corpus, tmp_path):
    root, _, _ = corpus
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("tokens.json", "validation.bin"):
        (bad / f).write_bytes((root / f).read_bytes())
    (bad / "train.bin").write_bytes((root / "train.bin").read_bytes()[:-20])
    with pytest.raises(PretokenisedCorpusError, match="holds .* tokens but tokens.json says"):
        read_tokens(bad, "train")
    (bad / "train.bin").unlink()
    with pytest.raises(PretokenisedCorpusError, match="train.bin is missing"):
        read_tokens(bad, "train")
    meta = json.loads((root / "tokens.json").read_text())
    (bad / "tokens.json").write_text(json.dumps({**meta, "dtype": "float32"}))
    with pytest.raises(PretokenisedCorpusError, match="dtype must be one of"):
        read_tokens(bad, "train")


def test_resumed_run_on_token_file_equals_uninterrupted(corpus, tmp_path):
    root, _, _ = corpus
    cfg = tiny(root, variant="vpara", max_steps=4, ckpt_every=2, eval_every=2)
    whole = T.train(cfg, tmp_path / "whole", progress=False)
    T.train(cfg, tmp_path / "split", progress=False, stop_after=2)
    resumed = T.train(cfg, tmp_path / "split", progress=False)
    assert resumed.resumed_from == 2
    assert [m["val_loss"] for m in resumed.metrics] == [m["val_loss"] for m in whole.metrics]
    assert (tmp_path / "whole" / "tokenizer" / "tokenizer.json").read_bytes() == \
        (root / "tokenizer" / "tokenizer.json").read_bytes()
