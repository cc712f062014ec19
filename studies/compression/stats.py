"""Claim 3's statistics (protocol sec. 6): the diagnostic families, row-wise Spearman, the
seeded two-level bootstrap over windows and settings (:class:`Study`) and the verdict rule.

Imported by :mod:`compression_claims` (which re-exports these names).
"""

from __future__ import annotations

from studies.claims.data import DataError
from studies.claims.stats import interval as _ci
from tl_directional.core.rank import spearman

MIN_SETTINGS = 20  # protocol sec. 6: fewer finished settings -> not decided
B = 2000
SEED = 0


#: (key, unit, form, label): the diagnostic families; form "mean" is the paper's per-token mean
FORMS = (("attn", "mean"), ("attn", "energy"), ("mlp", "mean"), ("mlp", "energy"), ("block", "mean"),
         ("block", "energy"))
DIAG = ("perp", "par", "1-cos", "MSE")
COMPARATORS = ("par", "1-cos", "MSE")


def diag_parts(unit: str, form: str):
    """``{diagnostic: (numerator column, denominator column, transform)}``: the diagnostic of a
    setting is ``transform(sum num / sum den)`` over its (resampled) windows."""
    u = unit + "_"
    if form == "mean":
        return {"perp": (u + "t_err_perp", u + "n", None), "par": (u + "t_err_par", u + "n", None),
                "1-cos": (u + "t_cos", u + "n", "one_minus"), "MSE": (u + "t_rel_mse", u + "n", None),
                "raw MSE": (u + "e_sq", u + "n", None)}
    return {"perp": (u + "e_perp_sq", u + "u_sq", "sqrt"), "par": (u + "e_par_sq", u + "u_sq", "sqrt"),
            "1-cos": (u + "t_cos", u + "n", "one_minus"), "MSE": (u + "e_sq", u + "u_sq", None)}


class Study:
    """Arrays of one run: per setting x window, and the bootstrap draws (seeded)."""

    def __init__(self, manifest, rec, lay):
        import numpy as np

        self.manifest = manifest
        order = [s["label"] for s in manifest["settings"]]
        label_spec = {s["label"]: s["spec"] for s in manifest["settings"]}
        # settings in the grid's order (the protocol's), windows by text then window
        grid_pos = {s: i for i, s in enumerate(manifest["grid"])}
        self.labels = sorted(order, key=lambda lab: grid_pos[label_spec[lab]])
        self.specs = [label_spec[x] for x in self.labels]
        self.methods = {s["label"]: s["method"] for s in manifest["settings"]}
        self.texts = [t for t in manifest["texts"] if t in set(rec.text)]
        rec = rec.copy()
        rec["_t"] = rec.text.map({t: i for i, t in enumerate(self.texts)})
        rec["_s"] = rec.setting.map({s: i for i, s in enumerate(self.labels)})
        rec = rec.sort_values(["_s", "_t", "window"], kind="stable")
        S = len(self.labels)
        self.S = S
        keys = rec[rec._s == 0][["_t", "window"]].to_numpy()
        self.W = len(keys)
        if len(rec) != S * self.W:
            raise DataError(f"records: {len(rec)} rows, expected {S} settings x {self.W} windows")
        self.wtext = keys[:, 0]
        self.cols = {c: rec[c].to_numpy(dtype=float).reshape(S, self.W) for c in rec.columns
                     if c not in ("setting", "text", "window", "_t", "_s")}
        self.lay = lay
        rng = np.random.default_rng(SEED)
        w = np.ones((B + 1, self.W))
        for b in range(1, B + 1):
            for t in range(len(self.texts)):
                pos = np.flatnonzero(self.wtext == t)
                w[b, pos] = np.bincount(rng.integers(0, len(pos), len(pos)), minlength=len(pos))
        self.w = w
        idx = np.tile(np.arange(S), (B + 1, 1))
        for b in range(1, B + 1):
            idx[b] = rng.integers(0, S, S)
        self.idx = idx
        self.idx_fixed = np.tile(np.arange(S), (B + 1, 1))

    def pooled(self, num, den, transform=None, w=None):
        """``[B+1, S]``: ``transform(sum_w num / sum_w den)`` per setting and window resample."""
        import numpy as np

        w = self.w if w is None else w
        v = (w @ self.cols[num].T) / (w @ self.cols[den].T)
        if transform == "sqrt":
            v = np.sqrt(v)
        elif transform == "one_minus":
            v = 1.0 - v
        return v

    def loss_increase(self, w=None):
        w = self.w if w is None else w
        return (w @ (self.cols["nll"] - self.cols["base_nll"]).T) / (w @ self.cols["tokens"].T)

    def rhos(self, unit, form, fixed_settings=False, w=None):
        """``{diagnostic: [B+1] rho}`` with the settings (and windows) resampled."""
        import numpy as np

        idx = self.idx_fixed if fixed_settings else self.idx
        y = np.take_along_axis(self.loss_increase(w), idx, 1)
        out = {}
        for d, (num, den, tr) in diag_parts(unit, form).items():
            x = np.take_along_axis(self.pooled(num, den, tr, w), idx, 1)
            out[d] = spearman(x, y, if_constant=0.0)
        return out

    def text_weights(self, t):
        """Full-sample weights of one text's windows only (a [1, W] row)."""
        return (self.wtext == t).astype(float)[None, :]


def verdict(stat, n_settings):
    v, lo, hi = _ci(stat)
    if n_settings < MIN_SETTINGS:
        return f"**not decided** (only {n_settings} settings finished; the protocol needs {MIN_SETTINGS})"
    return "**held**" if lo > 0 else "**failed**" if hi < 0 else "**not decided**"


def label_form(unit, form):
    return f"{unit}, {'per-token mean' if form == 'mean' else 'energy form'}"
