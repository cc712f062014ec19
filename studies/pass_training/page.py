"""The pass8m page (``docs/results/pass8m.md``) and its figures, protocol sec. 10: a pure function
of the committed ``docs/results/data/pass8m.*`` (written by ``python -m studies run pass-training
collect``, :mod:`studies.pass_training.run`)."""

from __future__ import annotations

import math
from pathlib import Path

from studies import common
from studies.paper import EXPERIMENTS, cite
from studies.pass_training import seeds6_page
from studies.pass_training.run import (
    DATA,
    GEOMETRY_WINDOWS,
    HF_SEEDS,
    SEEDS,
    VARIANTS,
    DataError,
    tasks,
)


def load(stem: str, data: Path = DATA):
    import pandas as pd

    mpath = data / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, f"docs/results/data/{mpath.name}", DataError,
                                          wording="unreadable manifest")
    tables = {}
    for name in ("curves", "final", "shares", "hf"):
        fname = f"{stem}.{name}.csv"
        raw = common.checked_bytes(data / fname, manifest.get("files", {}).get(fname), f"docs/results/data/{fname}",
                                    mpath.name, DataError)
        tables[name] = pd.read_csv(io_bytes(raw))
    return manifest, tables


def io_bytes(raw: bytes):
    import io

    return io.BytesIO(raw)


HF_TOLERANCE = 1e-5  # nats; the final-loss tolerance of tests/integration/test_hf_toy_experiment.py
TOL_TEXT = "1e-5"


def cpu_caveat(manifest: dict, n_runs: int) -> str:
    """The CPU total's caveat: runs whose time counts only some of their processes (resumed
    before :class:`CpuLedger` kept their total), so the figure is a lower bound."""
    partial = manifest.get("cpu_partial_runs")
    if partial is None:
        return " (a lower bound: resumed runs may count only their last process)"
    if not partial:
        return ""
    return (f" (a lower bound: {len(partial)} of {n_runs} runs were resumed or recorded before the CPU ledger and "
            "count only their last process)")


def hf_reading(final, hf) -> list[str]:
    """The user's-path paragraph (protocol sec. 10): the HF-callback runs against the own trainer
    at the same seed. Equal if every final validation loss is within :data:`HF_TOLERANCE`;
    otherwise the gap is set beside the seed-to-seed spread and the path agrees if each variant's
    HF difference to the HF baseline has the sign of the own trainer's at that seed."""
    if not len(hf):
        return []
    gap_train = (hf.hf_train_loss - hf.own_train_loss).abs().max()

    def pick(path, variant, seed):
        x = final[(final.variant == variant) & (final.path == path) & (final.seed == seed)].final_val_loss
        return float(x.iloc[0]) if len(x) else None

    both = {(v, s_): (pick("own", v, s_), pick("hf", v, s_)) for v in VARIANTS for s_ in HF_SEEDS}
    gaps = {f"{v} seed {s_}" if len(HF_SEEDS) > 1 else v: abs(h - o)
            for (v, s_), (o, h) in both.items() if o is not None and h is not None}
    worst = max(gaps.values()) if gaps else math.nan
    each = ", ".join(f"{k} {g:.2g}" for k, g in gaps.items())
    own = final[final.path == "own"]
    spread = own[own.variant == "baseline"].final_val_loss.std(ddof=1) if (own.variant == "baseline").sum() > 1 else math.nan
    signs, agree = [], []
    for v in ("vpara", "attn-para"):
        for seed in HF_SEEDS:
            vals = [pick(p_, w, seed) for p_ in ("own", "hf") for w in (v, "baseline")]
            if None in vals:
                continue
            d_own, d_hf = vals[0] - vals[1], vals[2] - vals[3]
            same = (d_own > 0) == (d_hf > 0) and d_own != 0 and d_hf != 0
            agree.append(same)
            signs.append(f"{v} seed {seed}: own {d_own:+.4f}, HF {d_hf:+.4f} ({'same sign' if same else '**opposite sign**'})")
    lines = [f"HF `Trainer` + `DirectionalEditCallback` against the own trainer, same seed: largest gap of the "
             f"interval-mean training loss {gap_train:.2g}, of the final validation loss {worst:.2g} nats ({each})"]
    if math.isfinite(worst) and worst <= HF_TOLERANCE:
        lines[0] += f"; within the existing tolerance of {TOL_TEXT} nats, so the user's path is **equal**."
    else:
        ratio = f" 1/{spread / worst:,.0f} of" if math.isfinite(spread) and worst > 0 else " beside"
        lines[0] += (f", above the existing tolerance of {TOL_TEXT} nats, so not equal; it is{ratio} the "
                     f"seed-to-seed standard deviation of the baseline's final loss ({spread:.3f} nats), and "
                     "the sign rule of sec. 10 decides.")
        n_needed = 2 * len(HF_SEEDS)
        if len(agree) < n_needed:
            verdict = "waits for the variants' HF runs"
        elif all(agree):
            verdict = "**agrees**: each variant's HF difference to the baseline has the own trainer's sign"
        else:
            verdict = "**does not agree**: a variant's HF difference to the baseline has the other sign"
        lines[0] += f" Under it the user's path {verdict}."
    lines[0] += f" Differences to the baseline on both paths: {'; '.join(signs) or '-'}."
    return ["", *lines]


def paired(final, variant: str):
    """Per seed ``variant - baseline`` of the own trainer's final validation losses: the paired
    comparison (mean, 95% Student-t interval, sign-flip p) or None under 2 seeds."""
    from tl_directional.training import paired_comparison

    own = final[final.path == "own"]
    per = {v: {int(r.seed): float(r.final_val_loss) for r in own[own.variant == v].itertuples()} for v in VARIANTS}
    seeds = [s for s in SEEDS if s in per["baseline"] and s in per[variant]]
    if len(seeds) < 2:
        return seeds, None
    return seeds, paired_comparison([per[variant][s] for s in seeds], [per["baseline"][s] for s in seeds])


def verdict(stats, n_seeds: int) -> str:
    """Protocol sec. 10: held if the interval lies below 0, failed if above 0, otherwise (or with
    fewer than 3 seeds) not decided."""
    if stats is None or n_seeds < len(SEEDS):
        return "not decided (runs incomplete)"
    return common.interval_verdict(stats)


NAMES = {"vpara": "full-aggregate value-space V-Para (per head)",
         "attn-para": "residual-space parallel suppression of the attention update"}


def verdict_rows(stem: str, data: Path = DATA):
    _, t = load(stem, data)
    rows = []
    for v in ("vpara", "attn-para"):
        seeds, s = paired(t["final"], v)
        stat = "-" if s is None else (f"{v} - baseline = {s['mean_diff']:+.4f} [{s['ci95_low']:+.4f}, "
                                      f"{s['ci95_high']:+.4f}] nats/token, {len(seeds)} seeds")
        rows.append((f"4: training with {NAMES[v]} lowers validation loss (single pass, {stem})", stat,
                     verdict(s, len(seeds))))
    return rows


#: The paper's sentence on the trajectory (``sections/experiments.tex`` at 28ae91f, "Training-Time Allocation").
PAPER_TRAJECTORY = ("Suppressing parallel attention updates shifts the learning trajectory downward from early "
                    "training stages, and this advantage persists consistently through the final checkpoint "
                    "rather than emerging only as an endpoint artifact.")


def trajectory(curves, variant: str) -> dict:
    """Where ``variant`` runs ahead of the baseline over training: the mean over seeds of the
    paired validation-loss gap ``variant - baseline`` at every evaluated step after step 0.

    Returns ``{"ahead": [steps with gap < 0], "behind": [steps with gap > 0], "since": step,
    "last_behind": bool, "seeds": [paired seeds], "clear_ahead": [steps], "clear_behind": [steps]}``:
    ``since`` is the first step from which the gap keeps the side it has at the last step,
    ``last_behind`` that side (gap > 0), both None without paired steps; ``clear_ahead`` /
    ``clear_behind`` the steps whose paired 95% Student-t interval over seeds lies wholly below /
    above zero (none with fewer than 2 seeds; per step, not corrected for the number of steps)."""
    base = curves[curves.variant == "baseline"].set_index(["seed", "step"]).val_loss
    var = curves[curves.variant == variant].set_index(["seed", "step"]).val_loss
    both = base.index.intersection(var.index)
    diff = var[both] - base[both]
    gap = diff.groupby(level="step").mean()
    gap = gap[gap.index > 0].sort_index()
    bands = {int(k): _band(list(diff.xs(k, level="step").values)) for k in gap.index}
    out = {"ahead": [int(k) for k, g in gap.items() if g < 0], "behind": [int(k) for k, g in gap.items() if g > 0],
           "since": None, "last_behind": None, "seeds": sorted({int(s) for s, _ in both}),
           "clear_ahead": [k for k, (m, hw) in bands.items() if math.isfinite(hw) and m + hw < 0],
           "clear_behind": [k for k, (m, hw) in bands.items() if math.isfinite(hw) and m - hw > 0]}
    if len(gap):
        last = gap.iloc[-1] > 0
        since = int(gap.index[-1])
        for k, g in reversed(list(gap.items())):
            if (g > 0) != last:
                break
            since = int(k)
        out["since"], out["last_behind"] = since, bool(last)
    return out


def trajectory_sentence(curves, variant: str, per_step: int) -> str:
    """One computed line on the page: is ``variant`` ahead early and does it stay ahead?"""
    tr = trajectory(curves, variant)
    if tr["since"] is None:
        return f"- {variant}: no paired steps yet."
    first = int(curves[curves.step > 0].step.min())
    end = "behind" if tr["last_behind"] else "ahead of"
    early = "ahead" if first in tr["ahead"] else "behind"
    seeds = f"mean over seed{'s' if len(tr['seeds']) > 1 else ''} {', '.join(map(str, tr['seeds']))}"
    line = (f"- {variant} ({seeds}): {early} at the first evaluation (step {first}); {end} the baseline from "
            f"step {tr['since']} ({tr['since'] * per_step:,} tokens) to the end; ahead at {len(tr['ahead'])}, behind "
            f"at {len(tr['behind'])} of {len(tr['ahead']) + len(tr['behind'])} evaluated steps")
    if len(tr["seeds"]) < 2:
        return line + "."
    clear = [f"{side} at step{'s' if len(ks) > 1 else ''} {', '.join(map(str, ks))}"
             for side, ks in (("ahead", tr["clear_ahead"]), ("behind", tr["clear_behind"])) if ks]
    return line + ("; the paired 95% interval excludes zero " + " and ".join(clear) if clear else
                   "; the paired 95% interval includes zero at every step") + " (per step, uncorrected)."


def _band(x):
    """(mean, half-width of the 95% Student-t interval) of a sample (half-width NaN under 2 values)."""
    from tl_directional.core.student_t import t975

    n = len(x)
    m = sum(x) / n
    if n < 2:
        return m, math.nan
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1))
    return m, t975(n - 1) * sd / math.sqrt(n)


def _curve_bands(t):
    """Per variant: [(step, mean, half-width)] of the validation loss over seeds, and per edited
    variant the same of the paired difference to the baseline."""
    c = t["curves"]
    loss, gap = {v: [] for v in VARIANTS}, {v: [] for v in ("vpara", "attn-para")}
    for step in sorted(c.step.unique()):
        cs = c[c.step == step]
        per = {v: cs[cs.variant == v].set_index("seed").val_loss for v in VARIANTS}
        for v in VARIANTS:
            if len(per[v]):
                loss[v].append((int(step), *_band(list(per[v].values))))
        for v in gap:
            both = sorted(set(per["baseline"].index) & set(per[v].index))
            if both:
                gap[v].append((int(step), *_band([per[v][k] - per["baseline"][k] for k in both])))
    return loss, gap


def build_figures(stem: str, data: Path = DATA) -> dict[str, str]:
    """The page's three SVG figures (file name -> text): validation loss per variant with its 95%
    band, the paired gap to the baseline over training, the parallel share per layer."""
    from tl_directional.figures.svg import svg_chart

    _, t = load(stem, data)
    loss, gap = _curve_bands(t)
    tokens = t["curves"].groupby("step").tokens.first().to_dict()

    def banded(rows_by_name):
        series = {}
        for name, rows in rows_by_name.items():
            series[name] = [(tokens[s] / 1e6, m) for s, m, _ in rows]
            if any(math.isfinite(h) for _, _, h in rows):
                series[f"{name} 95% low"] = [(tokens[s] / 1e6, m - h) for s, m, h in rows if math.isfinite(h)]
                series[f"{name} 95% high"] = [(tokens[s] / 1e6, m + h) for s, m, h in rows if math.isfinite(h)]
        return series

    figs = {
        f"{stem}_loss.svg": svg_chart(banded({v: rows[1:] for v, rows in loss.items()}),
                                      title="validation loss (mean over seeds, 95% t band)",
                                      xlabel="training tokens (M)", ylabel="nats/token", width=760, height=420),
        f"{stem}_gap.svg": svg_chart(banded({f"{v} - baseline": rows for v, rows in gap.items()}),
                                     title="paired gap to the baseline over training (95% t band)",
                                     xlabel="training tokens (M)", ylabel="nats/token", hline=(0.0, "baseline"),
                                     width=760, height=420),
    }
    sh = t["shares"]
    series = {}
    for v in VARIANTS:
        for comp in ("value", "attn"):
            for when in ("before", "after"):
                g = sh[(sh.variant == v) & (sh.when == when)].groupby("layer")[f"{comp}_share"].mean()
                series[f"{v} {comp} {when}"] = [(int(k), float(x)) for k, x in g.items()]
    figs[f"{stem}_shares.svg"] = svg_chart(series, title="parallel energy share per layer, before and after training",
                                           xlabel="layer", ylabel="par^2 / (par^2 + perp^2)", width=760, height=420)
    return figs


#: The smallest of the paper's replicated runs (``sections/experiments.tex``, "Training-Time Allocation").
PAPER_SMALLEST = {"params": 296e6, "tokens": 2.1e9}


def scale(config: dict) -> dict:
    """The run's size from its config: tokens per run, parameters outside the embeddings and in all
    (GPT-2 counting, 12 d_model^2 per layer, tied unembedding), and the factor by which the paper's
    smallest replicated run (``PAPER_SMALLEST``) is larger in each."""
    tokens = config["max_steps"] * config["batch_size"] * config["n_ctx"]
    n_nonemb = 12 * config["n_layers"] * config["d_model"] ** 2
    n_total = n_nonemb + config["vocab_size"] * config["d_model"] + config["n_ctx"] * config["d_model"]
    return {"tokens": tokens, "params_nonemb": n_nonemb, "params": n_total,
            "paper_params_x": PAPER_SMALLEST["params"] / n_total, "paper_tokens_x": PAPER_SMALLEST["tokens"] / tokens}


def missing(final) -> list[str]:
    """The grid's task names (``own-VARIANT-sSEED``, ``hf-VARIANT-sSEED``) with no row in ``final``."""
    have = {f"{r.path}-{r.variant}-s{int(r.seed)}" for r in final.itertuples()}
    return [t for t in tasks("study") if not t.startswith("lr-") and t not in have]


def lead_cells(stem: str, data: Path = DATA) -> tuple[str, str, str]:
    """The single-pass study's cells of the lead table's training row: (ours, verdicts, reading),
    each variant's paired difference and verdict as the page states them."""
    manifest, _ = load(stem, data)
    cfg, sc = manifest["config"], scale(manifest["config"])
    rows = verdict_rows(stem, data)
    ours = "; ".join(stat if stat != "-" else f"{v}: no paired seeds yet" for v, (_, stat, _) in
                     zip(("vpara", "attn-para"), rows, strict=True))
    verdicts = "; ".join(f"{v} {verdict_}" for v, (_, _, verdict_) in zip(("vpara", "attn-para"), rows, strict=True))
    reading = (f"{cfg['n_layers']}-layer GPT-2, {sc['tokens'] / 1e6:.1f}M tokens in one pass of Debian documentation: "
               f"about {sc['paper_params_x']:,.0f}x fewer parameters and {sc['paper_tokens_x']:,.0f}x fewer tokens "
               "than the smallest replicated run; it says whether the effect appears at this scale, not at the "
               "paper's.")
    return ours, verdicts, reading


def _curve_lines(c, stem: str, per_step: int) -> list[str]:
    """The validation-loss table over training: each variant's mean over seeds with its 95% band,
    and the paired gap of each edit to the baseline."""
    L: list[str] = []
    L += ["", "## Validation loss over training (mean over seeds, 95% interval) and the paired gap", "",
          f"![validation loss per variant]({stem}_loss.svg)", "", f"![paired gap to the baseline]({stem}_gap.svg)",
          "",
          "| step | tokens | " + " | ".join(VARIANTS) + " | vpara - baseline | attn-para - baseline |",
          "|---|---|" + "---|" * (len(VARIANTS) + 2)]
    for step in sorted(c.step.unique()):
        cs = c[c.step == step]
        per = {v: cs[cs.variant == v].set_index("seed").val_loss for v in VARIANTS}
        cells = []
        for v in VARIANTS:
            x = list(per[v].values)
            m, hw = _band(x) if x else (math.nan, math.nan)
            cells.append("-" if not x else f"{m:.4f} +- {hw:.4f}" if math.isfinite(hw) else f"{m:.4f}")
        for v in ("vpara", "attn-para"):
            both = sorted(set(per["baseline"].index) & set(per[v].index))
            d = [per[v][k] - per["baseline"][k] for k in both]
            m, hw = _band(d) if d else (math.nan, math.nan)
            cells.append("-" if not d else f"{m:+.4f} +- {hw:.4f}" if math.isfinite(hw) else f"{m:+.4f}")
        L.append(f"| {int(step)} | {int(step) * per_step:,} | " + " | ".join(cells) + " |")
    return L


def _share_lines(sh, stem: str) -> list[str]:
    """The parallel share of each layer's update before and after training, per variant."""
    L: list[str] = []
    L += ["", "## Parallel share of each layer's update, before and after training", "",
          f"`par^2 / (par^2 + perp^2)` on {GEOMETRY_WINDOWS} validation windows, read before the edit at its hook "
          "while the variant's edits are active; mean over seeds. Value: each head's output against its own "
          "value; attn / mlp: the update against the residual stream it is added to.", "",
          f"![parallel share per layer]({stem}_shares.svg)", "",
          "| variant | layer | value before | value after | attn before | attn after | mlp before | mlp after |",
          "|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        for layer in sorted(sh[sh.variant == v].layer.unique()):
            g = sh[(sh.variant == v) & (sh.layer == layer)]
            cells = [f"{g[g.when == w][f'{comp}_share'].mean():.3f}" for comp in ("value", "attn", "mlp")
                     for w in ("before", "after")]
            L.append(f"| {v} | {layer} | " + " | ".join(cells) + " |")
    return L


def build_page(stem: str, data: Path = DATA) -> str:
    manifest, t = load(stem, data)
    cfg = manifest["config"]
    per_step = cfg["batch_size"] * cfg["n_ctx"]
    sc = scale(cfg)
    tokens, n_nonemb, n_total = sc["tokens"], sc["params_nonemb"], sc["params"]
    corpus = manifest.get("corpus", {})
    L = [
        f"# Claim 4 in a single pass: baseline, V-Para and residual attention suppression ({stem})",
        "",
        f"Built by `make results` from `docs/results/data/{stem}.*` alone (protocol "
        "[sec. 10](protocol.md#10-claim-4-beyond-the-toy-a-single-pass-value-and-residual-variants-added-2026-12-04-before-its-runs)). "
        "Do not edit by hand.",
        "",
        f"- Run: `{manifest['command']}` at commit `{manifest['commit']}`, started {manifest['started']}, torch "
        f"{manifest['torch']}; tasks finished at {', '.join(f'`{c}`' for c in manifest.get('task_commits', []))}; "
        f"{manifest['cpu_hours']:.1f} CPU-hours recorded{cpu_caveat(manifest, len(t['final']) + len(manifest.get('lr_choice', {}).get('candidates', {})))}"
        + ("." if manifest["complete"] else " so far (**incomplete**: the tables show the finished runs; not yet "
                                            f"landed: {', '.join(missing(t['final'])) or '-'})."),
        f"- Corpus: `pass8m` (`make pass-corpus`: Debian documentation sources, split by document), "
        f"{corpus.get('train_tokens', 0):,} training tokens in windows; each run reads {tokens:,} of them once "
        "(a single pass, no window repeated).",
        f"- Model: GPT-2, {cfg['n_layers']} layer{'s' if cfg['n_layers'] > 1 else ''}, d_model {cfg['d_model']}, {cfg['n_heads']} heads (d_head "
        f"{cfg['d_model'] // cfg['n_heads']}), d_mlp {cfg['d_mlp']}, n_ctx {cfg['n_ctx']}, vocab {cfg['vocab_size']}: "
        f"about {n_nonemb / 1e6:.1f}M parameters outside the embeddings, {n_total / 1e6:.1f}M in all.",
        f"- Schedule: AdamW, lr {cfg['lr']:g} (chosen on the baseline, final validation loss per candidate: "
        + (", ".join(f"{k}: {float(x):.4f}" for k, x in manifest.get("lr_choice", {}).get("candidates", {}).items()) or "-")
        + "), "
        f"warmup {cfg['warmup_steps']}, cosine to {cfg['min_lr_ratio']} lr, {cfg['max_steps']} steps of "
        f"{cfg['batch_size']} windows.",
        "",
        "## Verdicts (final validation loss, paired by seed, 95% Student-t interval)",
        "",
        "| variant | minus baseline [95% CI] nats/token | sign-flip p | seeds below baseline | verdict |",
        "|---|---|---|---|---|",
    ]
    for v in ("vpara", "attn-para"):
        seeds, s = paired(t["final"], v)
        if s is None:
            L.append(f"| {NAMES[v]} | - | - | - | not decided (runs incomplete) |")
        else:
            L.append(f"| {NAMES[v]} | {s['mean_diff']:+.4f} [{s['ci95_low']:+.4f}, {s['ci95_high']:+.4f}] "
                     f"({len(seeds)} seeds) | {s['perm_p']:.3f} | {s['wins']}/{len(seeds)} | {verdict(s, len(seeds))} |")
    L += seeds6_page.section(stem, data, t["final"], t["curves"], manifest)  # protocol sec. 15, beside sec. 10
    f = t["final"]
    L += ["", "## Final validation loss per seed", "", "| seed | path | " + " | ".join(VARIANTS) + " |",
          "|---|---|" + "---|" * len(VARIANTS)]
    for (seed, path), g in f.groupby(["seed", "path"]):
        cells = [(f"{float(g[g.variant == v].final_val_loss.iloc[0]):.4f}" if (g.variant == v).any() else "-")
                 for v in VARIANTS]
        L.append(f"| {seed} | {path} | " + " | ".join(cells) + " |")
    L += hf_reading(f, t["hf"])
    c = t["curves"]
    L += _curve_lines(c, stem, per_step)
    L += ["", "Reading (computed from the table above): the paper says \"" + PAPER_TRAJECTORY + "\" "
          f"({cite(EXPERIMENTS, '28ae91f')}, \"Training-Time Allocation\", about its 296M-528M runs; "
          f"{cite(EXPERIMENTS, '739519c', 'b6d7a16')} say the separation \"remains visible across model sizes\"). "
          "Here:", ""]
    L += [trajectory_sentence(c, v, per_step) for v in ("vpara", "attn-para")]
    L += _share_lines(t["shares"], stem)
    ratio_p, ratio_t = sc["paper_params_x"], sc["paper_tokens_x"]
    L += [
        "",
        "## What this can and cannot say about the paper's scale",
        "",
        f"- The paper's replicated result: 296M / 436M / 528M parameters, 2.1B OpenWebText tokens in one pass, 3 seeds, "
        "V-Para minus baseline -0.068 / -0.055 / -0.060 nats. This run is about "
        f"{ratio_p:,.0f}x smaller in parameters and {ratio_t:,.0f}x in tokens than the smallest of those, on "
        "technical documentation instead of web text.",
        "- A **held** verdict here says the effect already appears at this scale in one pass; a **failed** one says "
        "suppression raises the loss at this scale (not that it does at the paper's); **not decided** says three "
        "seeds cannot tell, not that there is no effect. None of it speaks to the downstream points at 1.4B / 2.7B.",
    ]
    return "\n".join(L)
