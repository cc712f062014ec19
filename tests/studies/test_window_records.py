"""The real-model runners' per-window records (``studies/realrun.py::window_records``, used by
the claims, amendment, atlas and instruments runs) against a hand-written cross-entropy, KL and
top-1 agreement on the bundled model: the baseline's own record is exact (nll = base nll, KL 0,
agreement = tokens), and an edited setting's sums equal the ones written here."""

from __future__ import annotations

from pathlib import Path

import torch

import tl_directional as tld
from tl_directional.model.inputs import load_text_sequences
from tl_directional.model.load import load_model

ROOT = Path(__file__).resolve().parents[2]


def _realrun():
    from studies import realrun

    return realrun


def test_window_records_equal_a_hand_written_cross_entropy():
    R = _realrun()
    torch.manual_seed(0)
    model = load_model("default").eval()
    part = load_text_sequences(model, max_sequences=3, seq_len=24)
    sets = [("v0", "x", lambda: tld.apply_edits(model, tld.ValueScale(s_par=0.0)))]
    spent = {}
    with torch.no_grad():
        recs = R.window_records(model, part, sets, "kjv", 5, spent)
        base = torch.log_softmax(model(part.tokens)[:, :-1].double(), -1)
        with tld.apply_edits(model, tld.ValueScale(s_par=0.0)):
            edit = torch.log_softmax(model(part.tokens)[:, :-1].double(), -1)
    assert set(spent) == {"baseline", "v0"}
    assert [r["window"] for r in recs] == [5, 6, 7, 5, 6, 7]
    assert [r["setting"] for r in recs] == ["baseline"] * 3 + ["v0"] * 3
    target = part.tokens[:, 1:]
    for r in recs[:3]:
        assert r["nll"] == r["base_nll"] and r["kl"] == 0 and r["agree"] == r["tokens"] == 23
    for j, r in enumerate(recs[3:]):
        nll = -edit[j].gather(-1, target[j].unsqueeze(-1)).sum()
        base_nll = -base[j].gather(-1, target[j].unsqueeze(-1)).sum()
        kl = (base[j].exp() * (base[j] - edit[j])).sum()
        agree = (base[j].argmax(-1) == edit[j].argmax(-1)).sum()
        assert abs(r["nll"] - float(nll)) < 1e-3 and abs(r["base_nll"] - float(base_nll)) < 1e-3
        assert abs(r["kl"] - float(kl)) < 1e-3 and r["agree"] == int(agree)
        assert r["nll"] != r["base_nll"]  # the edit changed something
