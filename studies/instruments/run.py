"""The revision's other instruments on a real model (protocol sec. 11): MLP carrier edits against
the residual MLP edit, component-weighted Wanda against Wanda, random per-layer value-space scales
against fixed half retention. Measured per window, written as ``docs/results/data/instruments_<model>.*``.

    python -m studies run claims --model smollm2-135m --settings instruments --windows 24 --batch-size 8
    python -m studies run claims --model gemma-3-270m --settings instruments --windows 24 --batch-size 8
    # resumable by text (--resume); the page: python -m studies build (make results)

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
import json
import sys
import time

from studies import common
from studies.claims.data import csv_bytes
from studies.claims.run import SOURCES, TEXTS, run_header, settings_manifest
from studies.runner import WindowStudy, record_windows, run_windows

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


def _header(args, sites, commit, dirty):
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


class InstrumentsRun(WindowStudy):
    """Protocol sec. 11 on one model: Wanda masks calibrated once on every text's windows 64-67,
    then per text the MLP carrier profile and the per-window records of every instrument."""

    prefix = "instruments"
    texts = TEXTS

    def __init__(self, args):
        super().__init__(args)
        self.records: list[dict] = []
        self.profiles: list = []
        self.labels = setting_labels()

    def check(self) -> int | None:
        if self.args.windows > CALIB_START:
            print(f"error: --windows must be <= {CALIB_START} (calibration windows start there)", file=sys.stderr)
            return 2
        if self.args.windows != PROTOCOL_WINDOWS:
            print(f"note: protocol sec. 11 fixes {PROTOCOL_WINDOWS} windows per text; this run has --windows "
                  f"{self.args.windows} (the manifest and the page say so)", file=sys.stderr)
        return None

    def complete_texts(self) -> list[str]:
        return list(TEXTS)

    def header(self) -> dict:
        from tl_directional.core.carrier import n_carrier_blocks
        from tl_directional.model.mlp_carrier import carrier_site

        args, r = self.args, self.run
        d_mlp, d_model = carrier_site(r.model, 0).d_mlp, r.sites.d_model
        return _header(args, r.sites, r.commit, r.dirty) | {
            "windows": args.windows,
            "seq_len": args.seq_len,
            "calibration": {"first_window": CALIB_START, "windows_per_text": CALIB_PER_TEXT, "texts": list(TEXTS),
                            "sparsity": SPARSITY, "n_null": N_NULL, "seed": SEED},
            "carrier": {"d_mlp": d_mlp, "d_model": d_model, "remainder": "pad",
                        "blocks": n_carrier_blocks(d_mlp, d_model, "pad"), "partial_width": d_mlp % d_model},
            "texts": {},
            "complete": False,
            "files": {},
        }

    def prepare(self) -> int | None:
        # calibration (every text's windows 64-67, disjoint from the evaluation windows): one pass
        import torch

        from tl_directional.model.inputs import TokenBatch, load_text_sequences

        model, seq_len, t1 = self.run.model, self.args.seq_len, time.time()
        calibs = []
        for text in TEXTS:
            b = load_text_sequences(model, str(common.ROOT / TEXTS[text][1]),
                                    max_sequences=CALIB_START + CALIB_PER_TEXT, seq_len=seq_len)
            if len(b) < CALIB_START + CALIB_PER_TEXT:
                print(f"error: text {text} gives only {len(b)} windows of {seq_len}; calibration needs "
                      f"{CALIB_START + CALIB_PER_TEXT}", file=sys.stderr)
                return 2
            calibs.append(b.slice(CALIB_START, CALIB_START + CALIB_PER_TEXT))
        calib = TokenBatch(torch.cat([b.tokens for b in calibs]), torch.cat([b.attention_mask for b in calibs]))
        masks, wstats, self.ranking, calib_tokens = wanda_masks(model, calib, self.args.batch_size)
        m = self.manifest
        m["calibration"]["tokens"] = int(calib_tokens)
        m["wanda"] = {WEIGHTING_LABELS[w]: s for w, s in wstats.items()}
        m["calibration_seconds"] = round(time.time() - t1, 1)
        print(f"calibration and pruning masks: {m['calibration_seconds']:.0f} s", flush=True)
        self.sets = instrument_settings(model, self.run.sites, masks)
        m["settings"] = [x | ({"extra": s[5]} if s[5] else {})
                         for x, s in zip(settings_manifest(self.sets), self.sets, strict=True)]
        return None

    def resume(self, stem: str) -> str | None:
        import pandas as pd

        old = json.loads((self.data / f"{stem}.manifest.json").read_text())
        if (why := _check_resume(old, self.manifest, self.labels)) is not None:
            return why
        self.manifest["texts"] = old["texts"]
        self.records = pd.read_csv(self.data / f"{stem}.records.csv").to_dict("records")
        self.profiles = [pd.read_csv(self.data / f"{stem}.profile.csv")]
        return None

    def measure_text(self, text: str, batch) -> dict | int:
        import tl_directional as tld

        args, t1 = self.args, time.time()
        prof = tld.profile(self.run.model, batch.tokens, attention_mask=batch.attention_mask,
                           batch_size=args.batch_size, exclude_first_token=True, components=["mlp"], carrier=True,
                           progress=False)
        pr = prof.residual[PROFILE_COLUMNS].copy()
        pr.insert(0, "text", text)
        self.profiles.append(pr)
        spent = {"profile": time.time() - t1, "baseline": 0.0} | dict.fromkeys(self.labels, 0.0)
        print(f"{text}: {len(batch)} windows x {args.seq_len}, {len(self.sets)} settings", flush=True)
        self.records += record_windows(self.run.model, batch, self.sets, text, args.batch_size, t1, spent)
        return {"seconds": round(time.time() - t1, 1), "setting_seconds": {k: round(v, 1) for k, v in spent.items()}}

    def files(self) -> dict[str, bytes]:
        import pandas as pd

        stem = self.stem()
        return {f"{stem}.records.csv": csv_bytes(pd.DataFrame(self.records)),
                f"{stem}.profile.csv": csv_bytes(pd.concat(self.profiles, ignore_index=True)),
                f"{stem}.ranking.csv": csv_bytes(self.ranking)}

    def count(self) -> int:
        return len(self.records)


#: the MLP carrier profile's columns kept per layer and text
PROFILE_COLUMNS = ["layer", "count", "energy_ratio", "par_frac_mean", "carrier_blocks", "carrier_input_par_share",
                   "carrier_input_energy_ratio", "carrier_block_par_share", "carrier_block_energy_ratio"]


def run_instruments(args) -> int:
    """Measure protocol sec. 11's instruments (``--settings instruments`` of the claims command line)."""
    return run_windows(InstrumentsRun(args))
