"""The training-time parallel-suppression experiment (METHOD.md sec. 7), end to end.

``python -m tl_directional.training experiment --corpus DIR --out OUT`` (or ``tl-directional experiment``)
trains every variant (``baseline``, ``vpara``, ``attn-para``) for every seed with
:mod:`tl_directional.training` (same seed => same init and data order across variants; same
hyper-parameters), then writes to ``OUT``:

* ``curves.csv``: the validation curves of every run (variant, seed, step, tokens, lr,
  train_loss, val_loss); ``curves.html``: a plotly figure (mean and min-max band over seeds).
* ``final.csv`` and ``table.md``: final validation loss per variant (mean +- std over seeds) and
  the paired comparison with baseline per seed: mean difference, its std, a 95 % t interval,
  an exact sign-flip permutation p-value, and how many seeds the variant beat baseline.
* ``geometry.csv`` and the geometry part of ``table.md``: for every trained model, the
  parallel share of its updates measured *before* the edit, with the model's own training edit
  active (what the edit removes, i.e. what the model "tries" to write): the value-space energy
  ratio ``sqrt(sum ||o_par||^2 / sum ||o_perp||^2)`` of each head's output against its own value
  and the residual attention update's energy ratio against ``resid_pre``. With the edit active
  the *edited* output's ``beta`` is 0 by construction, which proves nothing; the pre-edit numbers
  answer whether training under suppression shifted the updates toward the perpendicular
  direction. ``profiles/RUN/`` holds the core :func:`tl_directional.profile` tables of each
  trained model run without any edit (its plain geometry).
* ``results.json``: everything above plus the configuration and timings.

Runs resume (each run directory keeps checkpoints), so an interrupted experiment continues where
it stopped; finished runs are not retrained. Each run can also be launched on its own (e.g. one
``torchrun`` job per run on a cluster) with ``tl-directional train`` using the same flags, and
``--report-only`` collects whatever finished runs are in ``OUT``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..core.geometry import decompose
from ..core.stats import energy_ratio
from ..core.student_t import t975
from ..edit import edit_hooks
from ..measure import profile
from ..model.handle import capture_hooks
from ..model.load import load_model
from ..model.sites import resolve_sites
from .checkpoint import checkpoint_paths, read_checkpoint
from .config import INIT_DIR, TOKENIZER_DIR, VARIANTS, TrainConfig, variant_edits
from .data import prepare_data
from .model import load_canonical_state_dict_
from .trainer import train

#: Default budget: a model smaller than the shipped one so that 3 variants x 5 seeds finish in
#: about half an hour on 2 CPU cores.
EXPERIMENT_DEFAULTS = TrainConfig(
    vocab_size=2048, n_layers=2, d_model=128, n_heads=4, n_ctx=128, batch_size=16,
    max_steps=200, lr=3e-3, warmup_steps=20, eval_every=25, eval_windows=48, ckpt_every=50,
    keep_checkpoints=1,
)
DEFAULT_SEEDS = (0, 1, 2, 3, 4)



def paired_comparison(variant: Sequence[float], baseline: Sequence[float]) -> dict[str, float]:
    """Paired (per-seed) difference ``variant - baseline``: mean, std, 95 % t interval, exact
    two-sided sign-flip permutation p-value, and the number of seeds where the variant is lower."""
    d = [a - b for a, b in zip(variant, baseline, strict=True)]
    n = len(d)
    mean = statistics.fmean(d)
    sd = statistics.stdev(d) if n > 1 else float("nan")
    half = t975(n - 1) * sd / math.sqrt(n) if n > 1 else float("nan")
    observed = abs(mean)
    flips = list(itertools.product((1, -1), repeat=n)) if n <= 16 else []
    extreme = sum(abs(statistics.fmean([s * x for s, x in zip(sign, d, strict=True)])) >= observed - 1e-15
                  for sign in flips)
    return {"n": n, "mean_diff": mean, "std_diff": sd, "ci95_low": mean - half, "ci95_high": mean + half,
            "perm_p": extreme / len(flips) if flips else float("nan"),
            "wins": sum(x < 0 for x in d)}


# ---------------------------------------------------------------------------------------------
# Geometry of a trained model, before its own edit
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def pre_edit_geometry(model: Any, tokens: torch.Tensor, edits: Sequence[Any] = (), *,
                      exclude_first_token: bool = True) -> list[dict[str, Any]]:
    """Per layer: parallel share of the value-space head outputs (against each token's own value)
    and of the attention / MLP updates (against their residual reference), read *before* any edit
    at that hook while ``edits`` are active (capture hooks are registered first, so they run
    first). Returns rows with energy ratios (``sqrt(sum par^2 / sum perp^2)``), mean ``beta`` /
    ``alpha`` and mean ``par_frac``."""
    sites = resolve_sites(model, warn=False)
    names = []
    for L in range(sites.n_layers):
        names += [sites.value[L].v_hook, sites.value[L].z_hook]
        for comp in ("attn", "mlp"):
            unit = sites.unit(comp, L)
            names += [unit.reference_hook, unit.update_hook]
    got: dict[str, torch.Tensor] = {}
    model.eval()
    with model.hooks(fwd_hooks=capture_hooks(names, got) + edit_hooks(model, *edits)):
        model(tokens, return_type="logits")
    start = 1 if exclude_first_token else 0
    rows = []
    for L in range(sites.n_layers):
        v = got[sites.value[L].v_hook][:, start:]
        v = sites.expand_kv(v)
        dv = decompose(got[sites.value[L].z_hook][:, start:], v)
        ok = ~dv.degenerate
        row = {"layer": L, "value_energy_ratio": _energy(dv, ok), "value_beta_mean": float(dv.alpha[ok].mean()),
               "value_par_frac_mean": float(dv.par_frac[ok].mean())}
        for comp in ("attn", "mlp"):
            unit = sites.unit(comp, L)
            d = decompose(got[unit.update_hook][:, start:], got[unit.reference_hook][:, start:])
            ok = ~d.degenerate
            row.update({f"{comp}_energy_ratio": _energy(d, ok), f"{comp}_alpha_mean": float(d.alpha[ok].mean()),
                        f"{comp}_par_frac_mean": float(d.par_frac[ok].mean())})
        rows.append(row)
    return rows


def _energy(d: Any, ok: torch.Tensor) -> float:
    # the energy ratio of :mod:`tl_directional.core.stats` (NaN when there is no energy at all)
    par, perp = float(d.par_sq[ok].sum()), float(d.perp_sq[ok].sum())
    return float(energy_ratio(torch.tensor(par, dtype=torch.float64), torch.tensor(perp, dtype=torch.float64)))


# ---------------------------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------------------------


def run_name(variant: str, seed: int) -> str:
    return f"{variant}-s{seed}"


def check_seeds(seeds: Sequence[int], argument: str = "seeds") -> list[int]:
    """``seeds`` as a list of distinct ints; a ValueError naming ``argument`` for an empty list,
    a non-int or a repeated seed (which would be one run counted once, not n)."""
    seeds = list(seeds)
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int)]
    if not seeds or bad:
        raise ValueError(f"{argument} must be a non-empty list of distinct int seeds, got {seeds!r}; e.g. 0,1,2")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"{argument} repeats seed(s) {', '.join(map(str, repeated))} ({seeds!r}): a repeated seed is "
                         "the same run, counted once, so the comparison would have fewer seeds than asked; pass "
                         "distinct seeds, e.g. " + ",".join(map(str, range(len(seeds)))))
    return seeds


def run_experiment(base: TrainConfig, out: str | os.PathLike[str], *, seeds: Sequence[int] = DEFAULT_SEEDS,
                   variants: Sequence[str] = VARIANTS, progress: bool = True, report_only: bool = False,
                   profile_windows: int = 16) -> dict[str, Any]:
    """Train (or resume) every (variant, seed) run into ``out/runs`` and write the report.

    ``seeds`` must be distinct ints: a repeated seed would train the same run twice and be
    counted as one, so the report's n would not be the number of seeds asked for."""
    out = Path(out)
    check_seeds(seeds)
    out.mkdir(parents=True, exist_ok=True)
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"variant {v!r} is not one of {VARIANTS}")
    if "baseline" not in variants:
        raise ValueError("variants must include 'baseline' (every comparison is paired against it)")
    tok_dir = Path(base.tokenizer) if base.tokenizer else out / TOKENIZER_DIR
    data = None
    if not report_only:
        # One tokenizer (trained on the train split) and one tokenised corpus for every run.
        data = prepare_data(TrainConfig(**{**base.to_dict(), "tokenizer": None}), out) \
            if base.tokenizer is None else prepare_data(base)
    timings: dict[str, float] = {}
    for seed in seeds:  # seed-major: partial results always hold complete pairs
        for variant in variants:
            cfg = TrainConfig(**{**base.to_dict(), "variant": variant, "seed": seed,
                                   "tokenizer": str(tok_dir)})
            run_dir = out / "runs" / run_name(variant, seed)
            if report_only:
                continue
            t0 = time.perf_counter()
            train(cfg, run_dir, progress=progress, data=data)
            timings[run_name(variant, seed)] = time.perf_counter() - t0
    return write_report(base, out, seeds=seeds, variants=variants, timings=timings,
                        profile_windows=profile_windows, progress=progress)


def _final_record(run_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    found = checkpoint_paths(run_dir)
    if not found:
        return None
    meta, tensors = read_checkpoint(found[-1])
    if meta["step"] != meta["config"]["max_steps"]:
        return None
    return meta, tensors


def write_report(base: TrainConfig, out: Path, *, seeds: Sequence[int], variants: Sequence[str],
                 timings: dict[str, float] | None = None, profile_windows: int = 16,
                 progress: bool = False) -> dict[str, Any]:
    import pandas as pd

    curves, finals, geometry = [], [], []
    val_tokens = None
    for seed in seeds:
        for variant in variants:
            run_dir = out / "runs" / run_name(variant, seed)
            rec = _final_record(run_dir)
            if rec is None:
                continue
            meta, tensors = rec
            curves += meta["metrics"]
            finals.append({"variant": variant, "seed": seed, "final_val_loss": meta["metrics"][-1]["val_loss"],
                           "steps": meta["step"], "tokens": meta["tokens_seen"]})
            if profile_windows:
                cfg = TrainConfig.from_dict(meta["config"])
                if val_tokens is None:
                    val_tokens = prepare_data(cfg, run_dir).validation[:profile_windows]
                model = load_model(run_dir / INIT_DIR)
                load_canonical_state_dict_(
                    model, {k[6:]: v for k, v in tensors.items() if k.startswith("model/")},
                    source=str(run_dir))
                for row in pre_edit_geometry(model, val_tokens, variant_edits(variant)):
                    geometry.append({"variant": variant, "seed": seed, **row})
                prof = profile(model, val_tokens, batch_size=8, progress=False, exclude_first_token=True)
                prof.save(out / "profiles" / run_name(variant, seed), format="csv")
    if not finals:
        raise FileNotFoundError(f"no finished runs under {out / 'runs'}; run the experiment first")
    curves_df = pd.DataFrame(curves)
    curves_df.to_csv(out / "curves.csv", index=False)
    final_df = pd.DataFrame(finals)
    final_df.to_csv(out / "final.csv", index=False)
    geo_df = pd.DataFrame(geometry)
    if len(geo_df):
        geo_df.to_csv(out / "geometry.csv", index=False)
    _figure(curves_df, out / "curves.html")

    summary: dict[str, Any] = {"variants": {}, "paired": {}, "geometry": {}}
    base_by_seed = {r["seed"]: r["final_val_loss"] for r in finals if r["variant"] == "baseline"}
    for v in variants:
        vals = {r["seed"]: r["final_val_loss"] for r in finals if r["variant"] == v}
        xs = list(vals.values())
        summary["variants"][v] = {"n": len(xs), "mean": statistics.fmean(xs) if xs else None,
                                  "std": statistics.stdev(xs) if len(xs) > 1 else None,
                                  "per_seed": vals}
        common = [s for s in vals if s in base_by_seed]
        if v != "baseline" and len(common) >= 2:
            summary["paired"][v] = paired_comparison([vals[s] for s in common],
                                                     [base_by_seed[s] for s in common])
    if len(geo_df):
        per_model = geo_df.groupby(["variant", "seed"]).mean(numeric_only=True).reset_index()
        for v in variants:
            sub = per_model[per_model.variant == v]
            if len(sub):
                summary["geometry"][v] = {
                    col: {"mean": float(sub[col].mean()),
                          "std": float(sub[col].std()) if len(sub) > 1 else None}
                    for col in ("value_energy_ratio", "value_beta_mean", "attn_energy_ratio",
                                "attn_alpha_mean", "mlp_energy_ratio")}
    table = _table_md(base, summary, seeds, variants)
    (out / "table.md").write_text(table)
    results = {"config": base.to_dict(), "seeds": list(seeds), "variants": list(variants),
               "finals": finals, "summary": summary, "timings_s": timings or {},
               "geometry_note": "pre-edit quantities, each model with its own training edit active; "
                                "layer means, then mean over layers"}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table)
    return results


def _fmt(x: float | None, nd: int = 4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _table_md(base: TrainConfig, s: dict[str, Any], seeds: Sequence[int], variants: Sequence[str]) -> str:
    lines = [f"Final validation loss (nats/token), {len(seeds)} seeds {list(seeds)}, "
             f"{base.n_layers} layers, d_model {base.d_model}, n_ctx {base.n_ctx}, "
             f"{base.max_steps} steps x {base.batch_size} windows "
             f"({base.max_steps * base.batch_size * base.n_ctx:,} tokens per run).", "",
             "| variant | n | mean +- std | paired diff vs baseline (mean +- std) | 95% t interval | "
             "sign-flip p | seeds below baseline |", "|---|---|---|---|---|---|---|"]
    for v in variants:
        st = s["variants"][v]
        p = s["paired"].get(v)
        cell = f"{_fmt(st['mean'])} +- {_fmt(st['std'])}"
        if p:
            lines.append(f"| {v} | {st['n']} | {cell} | {p['mean_diff']:+.4f} +- {_fmt(p['std_diff'])} | "
                         f"[{p['ci95_low']:+.4f}, {p['ci95_high']:+.4f}] | {p['perm_p']:.3f} | "
                         f"{p['wins']}/{p['n']} |")
        else:
            lines.append(f"| {v} | {st['n']} | {cell} | - | - | - | - |")
    if s["geometry"]:
        lines += ["", "Pre-edit geometry of the trained models (each with its own training edit "
                  "active; mean over layers, then mean +- std over seeds):", "",
                  "| variant | value energy ratio (o vs own v) | value beta | attn energy ratio "
                  "vs resid_pre | attn alpha | mlp energy ratio |", "|---|---|---|---|---|---|"]
        for v in variants:
            g = s["geometry"].get(v)
            if g:
                cells = [f"{_fmt(g[c]['mean'], 3)} +- {_fmt(g[c]['std'], 3)}" for c in
                         ("value_energy_ratio", "value_beta_mean", "attn_energy_ratio",
                          "attn_alpha_mean", "mlp_energy_ratio")]
                lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _figure(curves, path: Path) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = {"baseline": "#444444", "vpara": "#1f77b4", "attn-para": "#d62728"}
    for v, sub in curves.groupby("variant", sort=False):
        g = sub.groupby("tokens")["val_loss"]
        x = list(g.mean().index)
        mean, lo, hi = list(g.mean()), list(g.min()), list(g.max())
        c = colors.get(v, None)
        fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", line={"width": 0},
                                 fillcolor=c, opacity=0.15, showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", name=f"{v} (mean over seeds)",
                                 line={"color": c}))
    fig.update_layout(title="Validation loss: baseline vs parallel suppression during training "
                      "(band: min-max over seeds)", xaxis_title="training tokens",
                      yaxis_title="validation loss (nats/token)", template="plotly_white")
    fig.write_html(str(path), include_plotlyjs=True)
