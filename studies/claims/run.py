"""The claims study's measuring step (``python -m studies run claims``): the settings (every
all-layer edit of protocol sec. 3), one run's manifest header, and the per-window records and
profiles written to ``docs/results/data/claims_<model>.*`` through the shared pipeline
(:func:`studies.runner.run_windows`). The data layout, its writer and reader are
:mod:`studies.claims.data`'s.
"""

from __future__ import annotations

import os
import sys
import time

from studies import common
from studies.claims.data import DATA, csv_bytes, load_data
from studies.claims.residual import resid_atlas_settings, resid_random_settings
from studies.claims.stats import EXCL_GRID
from studies.runner import WindowStudy, record_windows, run_windows

TEXTS = {
    "kjv": ("bundled held-out KJV slice (test-split books)", "tl_directional/data/kjv_heldout.txt"),
    "prose": (
        "modern English prose, Debian Reference slice (GPL-2+)",
        "tl_directional/data/prose_heldout.txt",
    ),
    "code": (
        "Python source, CPython 3.11 difflib / fractions / textwrap (PSF-2.0)",
        "tl_directional/data/code_heldout.txt",
    ),
}
#: the source file, its quantisation and the catalogue's sha256 of it, per catalogue model
SOURCES = {
    "smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    "gemma-3-270m": ("gemma-3-270m Q4_K_M GGUF (four -partN wheels)", "Q4_K_M"),
}
#: the headline subset (512-token windows): the four removals the revision's table compares
HEADLINE = (
    "value-exclusive s_par=0",
    "value-full s_par=0",
    "resid-attn s_par=0",
    "resid-mlp s_par=0",
)


# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------


def _concat_hooks(model, sites, mode: str, s_par: float, layers=None):
    """METHOD sec. 4's value-space edit with the projection on the *concatenated* heads: ``y``
    is all heads' ``z_t`` (or the cross aggregates ``c_t``) flattened to ``n_heads * d_head``,
    the reference the concatenated own values (GQA: each query head's KV value expanded to the
    query-head layout first). This is the revision's inference edit (appendix, "Forward-hook
    implementation"); the library's ``ValueScale`` is the per-head form. ``layers``: the edited
    layers (``None``: all)."""
    import torch

    from tl_directional.model.sites import expand_kv_heads

    hooks, store = [], {}
    for vs in sites.value:
        if layers is not None and vs.layer not in layers:
            continue

        def grab_v(t, hook, L=vs.layer):  # noqa: ARG001
            store[("v", L)] = t

        def grab_a(t, hook, L=vs.layer):  # noqa: ARG001
            # each query's own key: with a KV cache the keys run ahead of the queries by the cache
            store[("a", L)] = torch.diagonal(t, offset=t.shape[-1] - t.shape[-2], dim1=-2, dim2=-1)  # [b, h, q]

        def edit_z(z, hook, L=vs.layer):  # noqa: ARG001
            v = expand_kv_heads(store.pop(("v", L)), sites.n_heads)  # [b, p, h, d]
            a = store.pop(("a", L)).transpose(1, 2).unsqueeze(-1)  # [b, p, h, 1]
            y = z - a * v if mode == "exclusive" else z
            r, yf = v.flatten(-2).float(), y.flatten(-2).float()
            rr = (r * r).sum(-1, keepdim=True)
            coef = torch.where(
                rr > 1e-12, (yf * r).sum(-1, keepdim=True) / rr.clamp_min(1e-12), 0.0
            )
            return z + ((s_par - 1.0) * coef * r).to(z.dtype).view_as(z)

        hooks += [(vs.v_hook, grab_v), (vs.pattern_hook, grab_a), (vs.z_hook, edit_z)]
    return hooks


def settings(model, sites, prof_value, prof_resid):
    """``[(label, family, space, s_par, s_perp_desc, context factory)]`` for one text; the
    matched-norm scales come from that text's own profile (BOS excluded)."""
    import torch

    import tl_directional as tld

    L, H = sites.n_layers, sites.n_heads

    def ed(*edits):
        return lambda: tld.apply_edits(model, *edits)

    def per_head(col):
        t = torch.ones(L, H, dtype=torch.float64)
        for r in prof_value.itertuples():
            t[int(r.layer), int(r.head)] = float(getattr(r, col))
        return t

    def per_layer(comp):
        t = torch.ones(L, dtype=torch.float64)
        for r in prof_resid[prof_resid.component == comp].itertuples():
            t[int(r.layer)] = float(r.energy_ratio)
        return t

    out = []
    for s in EXCL_GRID:
        out.append(
            (
                f"value-exclusive s_par={s:g}",
                "exclusive",
                "value-exclusive",
                s,
                "1",
                ed(tld.ValueScale(s_par=s, mode="exclusive")),
            )
        )
    out.append(
        (
            "value-full s_par=0",
            "removal",
            "value-full",
            0.0,
            "1",
            ed(tld.ValueScale(s_par=0.0, mode="full")),
        )
    )
    out.append(
        (
            "value-full s_par=2",
            "scale",
            "value-full",
            2.0,
            "1",
            ed(tld.ValueScale(s_par=2.0, mode="full")),
        )
    )
    out.append(
        (
            "resid-attn s_par=0",
            "removal",
            "resid-attn",
            0.0,
            "1",
            ed(tld.ResidualScale("attn", s_par=0.0)),
        )
    )
    out.append(
        (
            "resid-mlp s_par=0",
            "removal",
            "resid-mlp",
            0.0,
            "1",
            ed(tld.ResidualScale("mlp", s_par=0.0)),
        )
    )
    out.append(("hard-diag", "removal", "hard-diag", float("nan"), "-", ed(tld.DiagonalRemoval())))
    out.append(
        (
            "value-full-concat s_par=0",
            "concat",
            "value-full-concat",
            0.0,
            "1",
            lambda: model.hooks(fwd_hooks=_concat_hooks(model, sites, "full", 0.0)),
        )
    )
    out.append(
        (
            "value-exclusive-concat s_par=0",
            "concat",
            "value-exclusive-concat",
            0.0,
            "1",
            lambda: model.hooks(fwd_hooks=_concat_hooks(model, sites, "exclusive", 0.0)),
        )
    )
    # perpendicular at the same scale (s_perp = 0; value-full and value-exclusive share it)
    out.append(
        (
            "value s_perp=0",
            "perp-scale",
            "value-exclusive",
            1.0,
            "0",
            ed(tld.ValueScale(s_perp=0.0, mode="exclusive")),
        )
    )
    out.append(
        (
            "resid-attn s_perp=0",
            "perp-scale",
            "resid-attn",
            1.0,
            "0",
            ed(tld.ResidualScale("attn", s_perp=0.0)),
        )
    )
    out.append(
        (
            "resid-mlp s_perp=0",
            "perp-scale",
            "resid-mlp",
            1.0,
            "0",
            ed(tld.ResidualScale("mlp", s_perp=0.0)),
        )
    )
    # perpendicular at the parallel removal's perturbation norm: (1 - s_perp) ||u_perp|| = ||u_par||
    # in energy per layer (residual) or per layer and head (value): s_perp = 1 - energy ratio
    kx, kf = per_head("energy_ratio_exclusive"), per_head("energy_ratio_full")
    ka, km = per_layer("attn"), per_layer("mlp")
    out.append(
        (
            "value-exclusive matched-norm perp",
            "perp-norm",
            "value-exclusive",
            1.0,
            "1-k",
            ed(tld.ValueScale(s_perp=1.0 - kx, mode="exclusive")),
        )
    )
    out.append(
        (
            "value-full matched-norm perp",
            "perp-norm",
            "value-full",
            1.0,
            "1-k",
            ed(tld.ValueScale(s_perp=1.0 - kf, mode="full")),
        )
    )
    out.append(
        (
            "resid-attn matched-norm perp",
            "perp-norm",
            "resid-attn",
            1.0,
            "1-k",
            ed(tld.ResidualScale("attn", s_perp=1.0 - ka)),
        )
    )
    out.append(
        (
            "resid-mlp matched-norm perp",
            "perp-norm",
            "resid-mlp",
            1.0,
            "1-k",
            ed(tld.ResidualScale("mlp", s_perp=1.0 - km)),
        )
    )
    return out


def layer_sets(n_layers: int) -> dict[str, list[int] | None]:
    """The layer conventions of protocol sec. 9: every layer (the revision's PPL sweep), every
    layer but the first (its zero-shot benchmarks, appendix "Edit settings"), and every layer
    but the first two (where the withdrawn pilot put most of the all-layer damage)."""
    return {"all": None, "skip0": list(range(1, n_layers)), "skip01": list(range(2, n_layers))}


def amend_settings(model, sites):
    """Protocol sec. 9.2's grid: the paper's edit form (joint over concatenated heads) beside the
    per-head form, on its layer conventions, at full removal and at half retention."""
    import tl_directional as tld

    sets = layer_sets(sites.n_layers)

    def joint(mode, s, layers):
        return lambda: model.hooks(fwd_hooks=_concat_hooks(model, sites, mode, s, layers))

    def per_head(mode, s, layers):
        return lambda: tld.apply_edits(model, tld.ValueScale(s_par=s, mode=mode, layers=layers))

    def resid(s, layers):
        return lambda: tld.apply_edits(model, tld.ResidualScale("attn", s_par=s, layers=layers))

    out = []
    for s in (0.0, 0.5):
        for name, layers in sets.items():
            out.append((f"value-exclusive-joint {name} s_par={s:g}", "amend",
                        "value-exclusive-joint", s, "1", joint("exclusive", s, layers)))
            out.append((f"value-exclusive {name} s_par={s:g}", "amend",
                        "value-exclusive", s, "1", per_head("exclusive", s, layers)))
        for name in ("all", "skip0"):
            layers = sets[name]
            out.append((f"value-full-joint {name} s_par={s:g}", "amend",
                        "value-full-joint", s, "1", joint("full", s, layers)))
            out.append((f"value-full {name} s_par={s:g}", "amend",
                        "value-full", s, "1", per_head("full", s, layers)))
            out.append((f"resid-attn {name} s_par={s:g}", "amend", "resid-attn", s, "1",
                        resid(s, layers)))
    skip0 = sets["skip0"]
    out.append(("hard-diag skip0", "amend", "hard-diag", float("nan"), "-",
                lambda: tld.apply_edits(model, tld.DiagonalRemoval(layers=skip0))))
    return out


def atlas_settings(model, sites):
    """Protocol sec. 9.3's single-layer atlas: per-head exclude-self removal in one layer at a
    time (the headline edit of sec. 3, located)."""
    import tl_directional as tld

    def one(layer):
        return lambda: tld.apply_edits(
            model, tld.ValueScale(s_par=0.0, mode="exclusive", layers=[layer])
        )

    return [
        (f"value-exclusive L{L} s_par=0", "atlas", "value-exclusive", 0.0, "1", one(L))
        for L in range(sites.n_layers)
    ]


def sites_settings(model, sites):
    """Protocol sec. 14.2: residual parallel removal of the MLP and of attention under four
    conventions: every layer and position, the first position spared, layer 0 skipped, both."""
    import tl_directional as tld

    skip0 = layer_sets(sites.n_layers)["skip0"]
    conventions = {"all": (None, None), "spare0": (None, slice(1, None)),
                   "skip0": (skip0, None), "skip0 spare0": (skip0, slice(1, None))}

    def edit(component, layers, positions):
        return lambda: tld.apply_edits(
            model, tld.ResidualScale(component, s_par=0.0, layers=layers, positions=positions))

    return [(f"resid-{c} {name} s_par=0", "sites", f"resid-{c}", 0.0, "1", edit(c, *conv))
            for c in ("mlp", "attn") for name, conv in conventions.items()]


#: ``--settings`` sets written under their own data stem (pages: protocol secs. 9, 14 and 16)
AMENDED_SETS = {"amend": amend_settings, "atlas": atlas_settings, "sites": sites_settings,
                "residatlas": resid_atlas_settings, "residrandom": resid_random_settings}


# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------


def settings_manifest(sets) -> list[dict]:
    """The manifest's record of each setting (``s_par`` NaN, a scale-free edit, as null)."""
    return [{"label": s[0], "family": s[1], "space": s[2], "s_par": None if s[3] != s[3] else s[3],
             "s_perp": s[4]} for s in sets]


def run_header(study: str, args, sites, commit: str, dirty: bool) -> dict:
    """The opening fields of a run's manifest: command, commit, machine, and the model's source
    file, quantisation and sha256s (every page says "dequantised" from them)."""
    import torch

    from tl_directional.model.load.catalog import REAL_MODELS

    entry = REAL_MODELS[args.model]
    man = common.model_manifest(args.model)
    src, quant = SOURCES[args.model]
    return {
        "study": study,
        "command": common.invocation(f"python -m studies run {study}"),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"CPU, {os.cpu_count()} cores shared, {args.threads} torch thread(s), torch {torch.__version__}",
        "model": {
            "name": args.model,
            "architecture": entry.architecture,
            "source_file": src,
            "quantisation": quant,
            "dequantised": True,
            "source_sha256": entry.source_sha256,
            "safetensors_sha256": man.get("files", {}).get("model.safetensors", {}).get("sha256"),
            "n_layers": sites.n_layers,
            "n_heads": sites.n_heads,
            "n_kv_heads": sites.n_kv_heads,
            "d_model": sites.d_model,
            "sandwich_norm": not sites.factorization_applicable,
            "lane": sites.lane,
        },
    }


PROFILE_VALUE = ["layer", "head", "count", "A_tt_mean", "beta_mean", "gamma_mean", "par_frac_full_mean",
                 "par_frac_exclusive_mean", "energy_ratio_full", "energy_ratio_exclusive"]
PROFILE_RESIDUAL = ["layer", "component", "count", "energy_ratio", "par_frac_mean", "par_frac_median"]


class ClaimsRun(WindowStudy):
    """Protocol secs. 3-4 and 9 on one real model: per text, the value-space and residual profile
    (BOS excluded), then the per-window records of every setting; data
    ``<claims|amend|atlas>_<model>.{records,profile}.csv``."""

    texts = TEXTS

    def __init__(self, args):
        super().__init__(args)
        self.data = DATA
        self.prefix = args.settings if args.settings in AMENDED_SETS else "claims"
        self.records: list[dict] = []
        self.profiles: list = []

    def header(self) -> dict:
        r = self.run
        return run_header("claims", self.args, r.sites, r.commit, r.dirty) | {
            "windows": self.args.windows, "seq_len": self.args.seq_len, "texts": {}, "complete": False, "files": {}}

    def resume(self, stem: str) -> str | None:
        # each kept text names its own commit and command, so a page stitched from several runs
        # says which run made which text
        from tl_directional.model.load.catalog import REAL_MODELS

        old, old_rec, old_prof = load_data(stem)
        for key in ("windows", "seq_len"):
            if old[key] != self.manifest[key]:
                return (f"was run with {key}={old[key]}, this run has {self.manifest[key]}; "
                        "use the same options or another --tag")
        if old["model"]["source_sha256"] != REAL_MODELS[self.args.model].source_sha256:
            return "holds another model's data"
        for t, info in old["texts"].items():
            info.setdefault("commit", old["commit"])
            info.setdefault("command", old["command"])
            self.manifest["texts"][t] = info
        self.manifest["settings"] = old["settings"]
        self.records, self.profiles = old_rec.to_dict("records"), [old_prof]
        return None

    def _profile(self, text: str, batch):
        import tl_directional as tld

        prof = tld.profile(self.run.model, batch.tokens, attention_mask=batch.attention_mask,
                           batch_size=self.args.batch_size, exclude_first_token=True,
                           components=["attn", "mlp", "value"], progress=False)
        pv, pr = prof.value[PROFILE_VALUE].copy(), prof.residual[PROFILE_RESIDUAL].copy()
        for df, kind in ((pv, "value"), (pr, "residual")):
            df.insert(0, "table", kind)
            df.insert(0, "text", text)
            self.profiles.append(df)
        return pv, pr

    def measure_text(self, text: str, batch) -> dict | int:
        args, model, sites = self.args, self.run.model, self.run.sites
        pv, pr = self._profile(text, batch)
        sets = AMENDED_SETS[args.settings](model, sites) if args.settings in AMENDED_SETS else settings(model, sites, pv, pr)
        if args.settings == "headline":
            sets = [x for x in sets if x[0] in HEADLINE]
        if self.manifest.get("settings") and [s["label"] for s in self.manifest["settings"]] != [s[0] for s in sets]:
            print(f"error: --resume: {self.stem()} holds other settings; use the same --settings or another --tag",
                  file=sys.stderr)
            return 2
        t1 = time.time()
        print(f"{text}: {len(batch)} windows x {args.seq_len}, {len(sets)} settings", flush=True)
        self.records += record_windows(model, batch, sets, text, args.batch_size, t1)
        self.manifest["settings"] = settings_manifest(sets)
        return {"seconds": round(time.time() - t1, 1)}

    def files(self) -> dict[str, bytes]:
        import pandas as pd

        stem = self.stem()
        return {f"{stem}.records.csv": csv_bytes(pd.DataFrame(self.records)),
                f"{stem}.profile.csv": csv_bytes(pd.concat(self.profiles, ignore_index=True))}

    def count(self) -> int:
        return len(self.records)


def run(args) -> int:
    """Measure the claims settings of ``args`` (the claims command line) on its model."""
    return run_windows(ClaimsRun(args))
