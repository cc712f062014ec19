"""The claims study's measuring step (``python scripts/claims.py run``): the settings (every
all-layer edit of protocol sec. 3), one run's manifest header, and the per-window records and
profiles written to ``docs/results/data/claims_<model>.*``.

Imported by :mod:`claims` (the entry point, which re-exports these names); the data layout
(``DATA``), its writer and the reader used by ``--resume`` stay there.
"""

from __future__ import annotations

import os
import sys
import time

from studies import common

from studies.claims.data import DATA, load_data, write_data
from studies.claims.stats import EXCL_GRID

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
            store[("a", L)] = torch.diagonal(t, dim1=-2, dim2=-1)  # [b, h, q]

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


#: ``--settings`` sets written under their own data stem (pages: protocol sec. 9)
AMENDED_SETS = {"amend": amend_settings, "atlas": atlas_settings}


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


def run(args) -> int:
    import pandas as pd
    import torch
    from studies.realrun import protocol_windows, run_stem, window_records

    import tl_directional as tld
    from tl_directional.model.load import load_model
    from tl_directional.model.load.catalog import REAL_MODELS
    from tl_directional.model.sites import resolve_sites

    commit, dirty = common.git_state()
    if (refused := common.refuse_dirty(dirty, args.allow_dirty)) is not None:
        return refused
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(args.model)
    sites = resolve_sites(model, warn=False)
    entry = REAL_MODELS[args.model]
    prefix = args.settings if args.settings in AMENDED_SETS else "claims"
    stem = run_stem(prefix, args)
    manifest = run_header("claims", args, sites, commit, dirty)
    manifest |= {
        "windows": args.windows,
        "seq_len": args.seq_len,
        "texts": {},
        "complete": False,
        "files": {},
    }
    records, profiles = [], []
    if args.resume and (DATA / f"{stem}.manifest.json").is_file():
        # Keep the texts an earlier run of the same stem finished; each text names its own commit and
        # command, so a page stitched from several runs says which run made which text.
        old, old_rec, old_prof = load_data(stem)
        for key in ("windows", "seq_len"):
            if old[key] != manifest[key]:
                print(
                    f"error: --resume: {stem} was run with {key}={old[key]}, this run has {manifest[key]}; "
                    "use the same options or another --tag",
                    file=sys.stderr,
                )
                return 2
        if old["model"]["source_sha256"] != entry.source_sha256:
            print(f"error: --resume: {stem} holds another model's data", file=sys.stderr)
            return 2
        for t, info in old["texts"].items():
            info.setdefault("commit", old["commit"])
            info.setdefault("command", old["command"])
            manifest["texts"][t] = info
        manifest["settings"] = old["settings"]
        records = old_rec.to_dict("records")
        profiles = [old_prof]
        print(f"resuming {stem}: keeping {', '.join(old['texts'])}", flush=True)
    for text in args.texts:
        if text in manifest["texts"]:
            continue
        desc, rel = TEXTS[text]
        path = common.ROOT / rel
        if (batch := protocol_windows(model, text, rel, args)) is None:
            return 2
        prof = tld.profile(
            model,
            batch.tokens,
            attention_mask=batch.attention_mask,
            batch_size=args.batch_size,
            exclude_first_token=True,
            components=["attn", "mlp", "value"],
            progress=False,
        )
        pv = prof.value[
            [
                "layer",
                "head",
                "count",
                "A_tt_mean",
                "beta_mean",
                "gamma_mean",
                "par_frac_full_mean",
                "par_frac_exclusive_mean",
                "energy_ratio_full",
                "energy_ratio_exclusive",
            ]
        ].copy()
        pr = prof.residual[
            ["layer", "component", "count", "energy_ratio", "par_frac_mean", "par_frac_median"]
        ].copy()
        for df, kind in ((pv, "value"), (pr, "residual")):
            df.insert(0, "table", kind)
            df.insert(0, "text", text)
            profiles.append(df)
        if args.settings in AMENDED_SETS:
            sets = AMENDED_SETS[args.settings](model, sites)
        else:
            sets = settings(model, sites, pv, pr)
        if args.settings == "headline":
            sets = [x for x in sets if x[0] in HEADLINE]
        if manifest.get("settings") and [s["label"] for s in manifest["settings"]] != [s[0] for s in sets]:
            print(
                f"error: --resume: {stem} holds other settings; use the same --settings or another --tag",
                file=sys.stderr,
            )
            return 2
        t1 = time.time()
        print(f"{text}: {len(batch)} windows x {args.seq_len}, {len(sets)} settings", flush=True)
        for i in range(0, len(batch), args.batch_size):
            part = batch.slice(i, i + args.batch_size)
            records += window_records(model, part, sets, text, i)
            print(
                f"  windows {i}-{i + part.tokens.shape[0] - 1} done ({time.time() - t1:.0f} s)",
                flush=True,
            )
        manifest["texts"][text] = {
            "description": desc,
            "file": rel,
            "sha256": common.sha256_bytes(path.read_bytes()),
            "windows": len(batch),
            "seconds": round(time.time() - t1, 1),
            "commit": manifest["commit"],
            "command": manifest["command"],
        }
        manifest["settings"] = settings_manifest(sets)
        manifest["seconds"] = round(time.time() - t0, 1)
        manifest["complete"] = set(args.texts) <= set(manifest["texts"])
        commits = list(dict.fromkeys(v.get("commit", manifest["commit"]) for v in manifest["texts"].values()))
        if len(commits) > 1:
            manifest["commits"] = commits
        write_data(stem, pd.DataFrame(records), pd.concat(profiles, ignore_index=True), manifest)
    return 0
