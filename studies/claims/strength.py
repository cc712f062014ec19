"""Protocol sec. 16.3 and 16.4: the applied strength of the lead table's edits
(:func:`tl_directional.edit_strength`: ``||y~ - y|| / ||y||`` per edited update, at the summed
attention output after ``W_O`` or the residual update) and the sign distribution of the
exclude-self diagonal shift ``Delta A_tt = -gamma_t``, per window and edited layer.

    python -m studies run claims --model smollm2-135m --settings strength --windows 16 --batch-size 8 --threads 1

Data: ``docs/results/data/strength_<model>.{strength,signs}.csv`` and its ``manifest.json``.
``strength``: one row per (text, window, edit, layer): ``count`` updates with a ratio and the
sums of ``norm``, ``energy``, ``retained`` over them, ``diff_sq`` / ``base_sq`` over all, and the
same four sums at position 0 alone (``*0``), so the first position can be taken out.
``signs``: one row per (text, window, form, layer) over positions ``t >= 1``: ``n`` shifts, how
many are negative / exactly zero / positive / larger than 1 in size, their sum, min and max, and
``degenerate`` (``||v_t||^2 <= 1e-12``, no shift).
"""

from __future__ import annotations

import time

from studies.claims.data import csv_bytes
from studies.claims.run import TEXTS, run_header
from studies.runner import WindowStudy, run_windows, window_batches

#: ``(label, component, edit factory)``: the lead table's edits (sec. 16.3), on ``skip0`` unless named
EDITS = (
    ("value-exclusive-joint skip0 s_par=0", "attn", lambda skip0: ("ValueScale", dict(s_par=0.0, mode="exclusive", joint=True, layers=skip0))),
    ("value-exclusive-joint skip0 s_par=0.5", "attn", lambda skip0: ("ValueScale", dict(s_par=0.5, mode="exclusive", joint=True, layers=skip0))),
    ("value-full-joint skip0 s_par=0", "attn", lambda skip0: ("ValueScale", dict(s_par=0.0, mode="full", joint=True, layers=skip0))),
    ("value-full-joint skip0 s_par=0.5", "attn", lambda skip0: ("ValueScale", dict(s_par=0.5, mode="full", joint=True, layers=skip0))),
    ("hard-diag skip0", "attn", lambda skip0: ("DiagonalRemoval", dict(layers=skip0))),
    ("resid-attn skip0 s_par=0", "attn", lambda skip0: ("ResidualScale", dict(component="attn", s_par=0.0, layers=skip0))),
    ("resid-mlp skip0 s_par=0", "mlp", lambda skip0: ("ResidualScale", dict(component="mlp", s_par=0.0, layers=skip0))),
    ("resid-attn all s_par=0", "attn", lambda skip0: ("ResidualScale", dict(component="attn", s_par=0.0))),
    ("resid-mlp all s_par=0", "mlp", lambda skip0: ("ResidualScale", dict(component="mlp", s_par=0.0))),
)
#: sec. 16.4's two forms of exclude-self removal on skip0 whose diagonal shifts are counted
SIGN_FORMS = {"joint": True, "per-head": False}
EPS = 1e-12


def make_edit(name: str, kw: dict):
    import tl_directional as tld

    return getattr(tld, name)(**kw)


def strength_rows(model, tokens, text: str, first: int, skip0: list[int]) -> list[dict]:
    """Sec. 16.3's rows of one batch of windows (numbered from ``first``)."""
    import tl_directional as tld

    rows = []
    for label, component, factory in EDITS:
        s = tld.edit_strength(model, tokens, make_edit(*factory(skip0)), component=component)
        ok = ~s.degenerate
        for j, L in enumerate(s.layers):
            for b in range(tokens.shape[0]):
                m = ok[b, j]
                rec = {"text": text, "window": first + b, "edit": label, "layer": L, "count": int(m.sum())}
                for k in ("norm", "energy", "retained"):
                    x = getattr(s, k)[b, j]
                    rec[k] = float(x[m].sum())
                    rec[k + "0"] = float(x[0]) if bool(m[0]) else 0.0
                rec["count0"] = int(m[0])
                for k in ("diff_sq", "base_sq"):
                    x = getattr(s, k)[b, j]
                    rec[k], rec[k + "0"] = float(x.sum()), float(x[0])
                rows.append(rec)
    return rows


def _gamma(z, v, pattern, joint: bool):
    """``gamma_t = (c_t . v_t) / ||v_t||^2`` with ``c_t = z_t - A_tt v_t`` (float64), per token over
    the concatenated heads (``joint``, ``[b, q]``) or per head (``[b, q, heads]``), and the
    degenerate mask (``||v_t||^2 <= EPS``)."""
    import torch

    n = z.shape[1]
    a_tt = pattern.double()[:, :, torch.arange(n), torch.arange(n)].transpose(1, 2).unsqueeze(-1)  # [b, q, h, 1]
    c = z.double() - a_tt * v
    if joint:
        c, v = c.flatten(2), v.flatten(2)
    vv = (v * v).sum(-1)
    ok = vv > EPS
    return torch.where(ok, (c * v).sum(-1) / torch.where(ok, vv, torch.ones_like(vv)), torch.zeros_like(vv)), ~ok


def _shift_rows(gamma, degenerate, key: dict) -> list[dict]:
    """One row per window of the shifts ``-gamma_t`` at ``t >= 1`` (``t = 0`` has no cross
    aggregate, so no shift), ``key`` the row's text / window offset / form / layer."""
    shift, deg = -gamma[:, 1:], degenerate[:, 1:]
    rows = []
    for b in range(shift.shape[0]):
        x = shift[b][~deg[b]]
        rows.append({"text": key["text"], "window": key["first"] + b, "form": key["form"], "layer": key["layer"],
                     "n": int(x.numel()), "neg": int((x < 0).sum()), "zero": int((x == 0).sum()),
                     "pos": int((x > 0).sum()), "big": int((x.abs() > 1).sum()), "sum": float(x.sum()),
                     "min": float(x.min()) if x.numel() else 0.0, "max": float(x.max()) if x.numel() else 0.0,
                     "degenerate": int(deg[b].sum())})
    return rows


def _sign_hooks(sites, layer: int, joint: bool, rows: list, key: dict) -> list:
    store: dict = {}

    def grab_v(t, hook):  # noqa: ARG001
        store["v"] = t.detach()

    def grab_a(t, hook):  # noqa: ARG001
        store["a"] = t.detach()

    def at_z(z, hook):  # noqa: ARG001
        v = sites.expand_kv(store.pop("v")).double()
        rows.extend(_shift_rows(*_gamma(z, v, store.pop("a"), joint), key))

    vs = sites.value[layer]
    return [(vs.v_hook, grab_v), (vs.pattern_hook, grab_a), (vs.z_hook, at_z)]


def sign_rows(model, sites, tokens, text: str, first: int, skip0: list[int]) -> list[dict]:
    """Sec. 16.4's rows of one batch: the shift ``-gamma_t`` each exclude-self removal form makes
    at each edited layer, read inside that edit's own forward pass (before its hook at ``hook_z``)."""
    import tl_directional as tld

    rows: list[dict] = []
    for form, joint in SIGN_FORMS.items():
        caps = []
        for L in skip0:
            caps += _sign_hooks(sites, L, joint, rows, {"text": text, "first": first, "form": form, "layer": L})
        edit = tld.ValueScale(s_par=0.0, mode="exclusive", joint=joint, layers=skip0)
        with model.hooks(fwd_hooks=caps + tld.edit_hooks(model, edit)):
            model(tokens)
    return rows


class StrengthRun(WindowStudy):
    """Protocol sec. 16.3-16.4 on one real model; data ``strength_<model>.{strength,signs}.csv``."""

    texts = TEXTS
    prefix = "strength"
    unit = "strength rows"

    def __init__(self, args):
        super().__init__(args)
        self.strength: list[dict] = []
        self.signs: list[dict] = []

    def header(self) -> dict:
        r = self.run
        return run_header("claims", self.args, r.sites, r.commit, r.dirty) | {
            "windows": self.args.windows, "seq_len": self.args.seq_len, "texts": {}, "complete": False, "files": {},
            "edits": [{"label": lab, "component": c, "edit": f"{n}({kw})"}
                      for lab, c, fac in EDITS for n, kw in [fac("skip0")]],
            "sign_forms": list(SIGN_FORMS), "eps": EPS}

    def measure_text(self, text: str, batch) -> dict | int:
        sites = self.run.sites
        skip0 = list(range(1, sites.n_layers))
        t1 = time.time()
        print(f"{text}: {len(batch)} windows x {self.args.seq_len}, {len(EDITS)} edits, {len(SIGN_FORMS)} sign forms",
              flush=True)
        for i, part in window_batches(batch, self.args.batch_size, t1):
            self.strength += strength_rows(self.run.model, part.tokens, text, i, skip0)
            self.signs += sign_rows(self.run.model, sites, part.tokens, text, i, skip0)
        return {"seconds": round(time.time() - t1, 1)}

    def files(self) -> dict[str, bytes]:
        import pandas as pd

        stem = self.stem()
        return {f"{stem}.strength.csv": csv_bytes(pd.DataFrame(self.strength)),
                f"{stem}.signs.csv": csv_bytes(pd.DataFrame(self.signs))}

    def count(self) -> int:
        return len(self.strength)


def run_strength(args) -> int:
    """Measure sec. 16.3-16.4 on ``args.model`` (the claims command line)."""
    return run_windows(StrengthRun(args))
