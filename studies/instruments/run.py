"""The revision's other instruments on a real model (protocol sec. 11): MLP carrier edits against
the residual MLP edit, component-weighted Wanda against Wanda, random per-layer value-space scales
against fixed half retention. Measured per window, written as ``docs/results/data/instruments_<model>.*``.

    python scripts/claims.py run --model smollm2-135m --settings instruments --windows 24 --batch-size 8
    python scripts/claims.py run --model gemma-3-270m --settings instruments --windows 24 --batch-size 8
    # resumable by text (--resume); the page: python scripts/claims.py build (make results)

Files: ``records.csv`` (text, window, setting, tokens, nll, base_nll, kl, agree: sums over the
window's predicted tokens, the claims study's layout), ``profile.csv`` (the MLP carrier blocks'
parallel share per layer and text, BOS excluded), ``ranking.csv`` (the total-vs-perpendicular
ranking overlap per linear beside its isotropic null) and ``manifest.json`` (command, commit, model
sha256, texts, settings with each random draw, the carrier's block count, Wanda's calibration and
flip fractions, seconds per setting).

The pruned models are never kept whole: each weighting's pruning mask is stored, and a setting
zeroes the masked weights of the one loaded model in place for its forward and restores them.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path

from studies import common

#: protocol sec. 11: Wanda at 50% unstructured, calibration windows 64-67 of each text (sec. 6)
SPARSITY, CALIB_START, CALIB_PER_TEXT, N_NULL, SEED = 0.5, 64, 4, 8, 0
PROTOCOL_WINDOWS = 24  # protocol sec. 11.1: the first 24 windows of 128 tokens per text
#: the random draws of sec. 11.4: (distribution, seed)
DRAWS = tuple((dist, seed) for dist in ("uniform", "gaussian") for seed in (0, 1, 2))
WEIGHTING_LABELS = {"none": "wanda", "perp": "wanda-perp", "par": "wanda-par"}


def setting_labels() -> list[str]:
    """The grid's labels in run order (protocol secs. 11.2-11.4)."""
    return [
        "resid-mlp s_par=0",
        "carrier-input s_par=0",
        "carrier-block s_par=0",
        "carrier-input s_perp=0",
        "carrier-block s_perp=0",
        *WEIGHTING_LABELS.values(),
        "fixed s_par=0.5",
        *(f"{dist} seed={seed}" for dist, seed in DRAWS),
    ]


@contextlib.contextmanager
def masked_weights(lws, dense: dict, mask: dict):
    """Zero the ``mask``ed weights of the linears ``lws`` in place, restore ``dense`` on exit."""
    try:
        for lw in lws:
            lw.set(dense[lw.name].masked_fill(mask[lw.name], 0.0))
        yield
    finally:
        for lw in lws:
            lw.set(dense[lw.name])


def wanda_masks(model, calib, batch_size: int):
    """``(masks, stats, ranking, calibration tokens)``: each weighting's pruned set per linear
    (``{weighting: {name: bool [out, in]}}``), its record's stats, and ``ranking_overlap``'s table;
    one calibration pass shared by all of them."""
    import tl_directional as tld
    from tl_directional.compression import collect_error_energy
    from tl_directional.compression.compressors import linear_weights

    energy = collect_error_energy(model, calib, batch_size=batch_size, n_null=N_NULL, seed=SEED)
    ranking = tld.ranking_overlap(model, sparsity=SPARSITY, n_null=N_NULL, seed=SEED, energy=energy)
    energy.null_par.clear()  # n_null x out x in float64 per linear: freed before the pruned copies
    masks, stats = {}, {}
    for weighting in WEIGHTING_LABELS:
        res = tld.prune_wanda_weighted(model, sparsity=SPARSITY, weighting=weighting, energy=energy)
        masks[weighting] = {lw.name: lw.get() == 0 for lw in linear_weights(res.model)}
        stats[weighting] = {
            k: float(v)
            for k, v in res.record.stats.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        del res
    return masks, stats, ranking, energy.n_tokens


def instrument_settings(model, sites, masks):
    """Sec. 11's grid as ``[(label, family, space, s_par, s_perp, extra, context factory)]``."""
    import torch

    import tl_directional as tld
    from tl_directional.compression.compressors import linear_weights

    def ed(*edits):
        return lambda: tld.apply_edits(model, *edits)

    skip0 = list(range(1, sites.n_layers))
    out = [
        (
            "resid-mlp s_par=0",
            "carrier",
            "resid-mlp",
            0.0,
            "1",
            {},
            ed(tld.ResidualScale("mlp", s_par=0.0)),
        ),
    ]
    for site in ("input", "block"):
        out.append(
            (
                f"carrier-{site} s_par=0",
                "carrier",
                f"carrier-{site}",
                0.0,
                "1",
                {},
                ed(tld.MLPCarrierScale(s_par=0.0, site=site)),
            )
        )
    for site in ("input", "block"):
        out.append(
            (
                f"carrier-{site} s_perp=0",
                "carrier",
                f"carrier-{site}",
                1.0,
                "0",
                {},
                ed(tld.MLPCarrierScale(s_perp=0.0, site=site)),
            )
        )
    lws = linear_weights(model)
    dense = {lw.name: lw.get() for lw in lws}
    for weighting, label in WEIGHTING_LABELS.items():
        out.append(
            (
                label,
                "wanda",
                "weights",
                float("nan"),
                "-",
                {"weighting": weighting, "sparsity": SPARSITY},
                lambda m=masks[weighting]: masked_weights(lws, dense, m),
            )
        )
    out.append(
        (
            "fixed s_par=0.5",
            "random",
            "value-exclusive-joint",
            0.5,
            "1",
            {"layers": "skip0"},
            ed(tld.ValueScale(s_par=0.5, mode="exclusive", joint=True, layers=skip0)),
        )
    )
    for dist, seed in DRAWS:
        draw = tld.random_scales(sites.n_layers, dist, seed=seed)
        edited = [float(draw[L]) for L in skip0]
        out.append(
            (
                f"{dist} seed={seed}",
                "random",
                "value-exclusive-joint",
                sum(edited) / len(edited),
                "1",
                {
                    "dist": dist,
                    "seed": seed,
                    "layers": "skip0",
                    "draw": [round(float(v), 12) for v in draw],
                },
                ed(
                    tld.ValueScale(
                        s_par=draw.to(torch.float32), mode="exclusive", joint=True, layers=skip0
                    )
                ),
            )
        )
    assert [s[0] for s in out] == setting_labels()
    return out


def _csv(df) -> bytes:
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.10g", lineterminator="\n")
    return buf.getvalue().encode()


def _header(args, sites, commit, dirty):
    from studies.claims.run import SOURCES, run_header

    if args.model in SOURCES:
        return run_header("instruments", args, sites, commit, dirty)
    return {  # the bundled default model: smoke runs only (no catalogue source to name)
        "study": "instruments",
        "command": common.invocation("python -m studies run claims --settings instruments"),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"CPU, {args.threads} torch thread(s)",
        "model": {
            "name": args.model,
            "architecture": "bundled",
            "source_file": "-",
            "quantisation": "none",
            "dequantised": False,
            "source_sha256": None,
            "safetensors_sha256": None,
            "n_layers": sites.n_layers,
            "n_heads": sites.n_heads,
            "n_kv_heads": sites.n_kv_heads,
            "d_model": sites.d_model,
            "sandwich_norm": not sites.factorization_applicable,
            "lane": sites.lane,
        },
    }


def _check_resume(old, manifest, labels) -> str | None:
    for key in ("windows", "seq_len", "calibration"):
        if old.get(key) != manifest.get(key):
            return (
                f"was run with {key}={old.get(key)}, this run has {manifest.get(key)}; "
                "use the same options or another --tag"
            )
    if [s["label"] for s in old["settings"]] != labels:
        return "holds other settings; use another --tag"
    if old["model"]["source_sha256"] != manifest["model"]["source_sha256"]:
        return "holds another model's data"
    return None


def run_instruments(args) -> int:
    import pandas as pd
    import torch
    from studies.realrun import protocol_windows, run_stem, window_records
    from studies.claims.run import TEXTS, settings_manifest

    import tl_directional as tld
    from tl_directional.core.carrier import n_carrier_blocks
    from tl_directional.model.inputs import TokenBatch, load_text_sequences
    from tl_directional.model.load import load_model
    from tl_directional.model.mlp_carrier import carrier_site
    from tl_directional.model.sites import resolve_sites

    commit, dirty = common.git_state()
    if (refused := common.refuse_dirty(dirty, args.allow_dirty)) is not None:
        return refused
    if args.windows > CALIB_START:
        print(
            f"error: --windows must be <= {CALIB_START} (calibration windows start there)",
            file=sys.stderr,
        )
        return 2
    if args.windows != PROTOCOL_WINDOWS:
        print(
            f"note: protocol sec. 11 fixes {PROTOCOL_WINDOWS} windows per text; this run has --windows "
            f"{args.windows} (the manifest and the page say so)",
            file=sys.stderr,
        )
    data = Path(args.data_dir) if args.data_dir else common.ROOT / "docs" / "results" / "data"
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(args.model)
    sites = resolve_sites(model, warn=False)
    stem = run_stem("instruments", args)
    d_mlp = carrier_site(model, 0).d_mlp
    manifest = _header(args, sites, commit, dirty) | {
        "windows": args.windows,
        "seq_len": args.seq_len,
        "calibration": {
            "first_window": CALIB_START,
            "windows_per_text": CALIB_PER_TEXT,
            "texts": list(TEXTS),
            "sparsity": SPARSITY,
            "n_null": N_NULL,
            "seed": SEED,
        },
        "carrier": {
            "d_mlp": d_mlp,
            "d_model": sites.d_model,
            "remainder": "pad",
            "blocks": n_carrier_blocks(d_mlp, sites.d_model, "pad"),
            "partial_width": d_mlp % sites.d_model,
        },
        "texts": {},
        "complete": False,
        "files": {},
    }
    labels = setting_labels()
    records, profiles = [], []
    mpath = data / f"{stem}.manifest.json"
    old = json.loads(mpath.read_text()) if args.resume and mpath.is_file() else None
    # calibration (every text's windows 64-67, disjoint from the evaluation windows): one pass
    t1 = time.time()
    calibs = []
    for text in TEXTS:
        b = load_text_sequences(
            model,
            str(common.ROOT / TEXTS[text][1]),
            max_sequences=CALIB_START + CALIB_PER_TEXT,
            seq_len=args.seq_len,
        )
        if len(b) < CALIB_START + CALIB_PER_TEXT:
            print(
                f"error: text {text} gives only {len(b)} windows of {args.seq_len}; calibration needs "
                f"{CALIB_START + CALIB_PER_TEXT}",
                file=sys.stderr,
            )
            return 2
        calibs.append(b.slice(CALIB_START, CALIB_START + CALIB_PER_TEXT))
    calib = TokenBatch(
        torch.cat([b.tokens for b in calibs]), torch.cat([b.attention_mask for b in calibs])
    )
    masks, wstats, ranking, calib_tokens = wanda_masks(model, calib, args.batch_size)
    manifest["calibration"]["tokens"] = int(calib_tokens)
    manifest["wanda"] = {WEIGHTING_LABELS[w]: s for w, s in wstats.items()}
    manifest["calibration_seconds"] = round(time.time() - t1, 1)
    print(f"calibration and pruning masks: {manifest['calibration_seconds']:.0f} s", flush=True)
    sets = instrument_settings(model, sites, masks)
    manifest["settings"] = [
        m | ({"extra": s[5]} if s[5] else {})
        for m, s in zip(settings_manifest(sets), sets, strict=True)
    ]
    if old is not None:
        if (why := _check_resume(old, manifest, labels)) is not None:
            print(f"error: --resume: {stem} {why}", file=sys.stderr)
            return 2
        manifest["texts"] = old["texts"]
        records = pd.read_csv(data / f"{stem}.records.csv").to_dict("records")
        profiles = [pd.read_csv(data / f"{stem}.profile.csv")]
        print(f"resuming {stem}: keeping {', '.join(old['texts'])}", flush=True)
    for text in args.texts:
        if text in manifest["texts"]:
            continue
        desc, rel = TEXTS[text]
        path = common.ROOT / rel
        if (batch := protocol_windows(model, text, rel, args)) is None:
            return 2
        t1 = time.time()
        prof = tld.profile(
            model,
            batch.tokens,
            attention_mask=batch.attention_mask,
            batch_size=args.batch_size,
            exclude_first_token=True,
            components=["mlp"],
            carrier=True,
            progress=False,
        )
        pr = prof.residual[
            [
                "layer",
                "count",
                "energy_ratio",
                "par_frac_mean",
                "carrier_blocks",
                "carrier_input_par_share",
                "carrier_input_energy_ratio",
                "carrier_block_par_share",
                "carrier_block_energy_ratio",
            ]
        ].copy()
        pr.insert(0, "text", text)
        profiles.append(pr)
        spent = {"profile": time.time() - t1, "baseline": 0.0} | dict.fromkeys(labels, 0.0)
        print(f"{text}: {len(batch)} windows x {args.seq_len}, {len(sets)} settings", flush=True)
        for i in range(0, len(batch), args.batch_size):
            part = batch.slice(i, i + args.batch_size)
            records += window_records(model, part, sets, text, i, spent)
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
            "setting_seconds": {k: round(v, 1) for k, v in spent.items()},
            "commit": manifest["commit"],
            "command": manifest["command"],
        }
        manifest["seconds"] = round(time.time() - t0, 1)
        manifest["complete"] = set(TEXTS) <= set(manifest["texts"])
        commits = list(dict.fromkeys(v["commit"] for v in manifest["texts"].values()))
        if len(commits) > 1:
            manifest["commits"] = commits
        files = {
            f"{stem}.records.csv": _csv(pd.DataFrame(records)),
            f"{stem}.profile.csv": _csv(pd.concat(profiles, ignore_index=True)),
            f"{stem}.ranking.csv": _csv(ranking),
        }
        common.write_data(data, files, manifest, f"{stem}.manifest.json")
        print(f"wrote {data / stem}.* ({len(records)} records)", flush=True)
    return 0
