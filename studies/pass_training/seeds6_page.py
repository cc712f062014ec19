"""The six-seed section of the pass8m page (protocol sec. 15), beside sec. 10's verdicts: a pure
function of sec. 10's committed data (``pass8m.*``) and sec. 15's (``pass8m.seeds6.*``, written by
``python -m studies run pass-training collect-seeds6``, :mod:`studies.pass_training.seeds6`). While
no sec. 15 data exist the section says **not run**."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from studies import common
from studies.pass_training import stats
from studies.pass_training.run import DATA, SEEDS, VARIANTS, DataError
from studies.pass_training.seeds6 import ALL_SEEDS, LR_VARIANT, NEW_SEEDS, SUFFIX
from tl_directional.core.student_t import t975

SEC15 = "protocol.md#15-claim-4-in-a-single-pass-extended-to-six-seeds-added-2026-12-06-before-its-runs"
#: The comparisons sec. 15 decides, as (variant, reference, label).
COMPARISONS = (("vpara", "baseline", "vpara - baseline"), ("attn-para", "baseline", "attn-para - baseline"),
               ("vpara", "attn-para", "V1: vpara - attn-para"))


def load(stem: str, data: Path = DATA) -> tuple[dict, dict[str, list[dict]]] | None:
    """Sec. 15's manifest and tables (``final``, ``curves``, ``lr``: rows of strings), each file
    checked against the manifest's sha256; None when sec. 15 has no data yet."""
    mpath = data / f"{stem}.{SUFFIX}.manifest.json"
    if not mpath.is_file():
        return None
    manifest = common.read_data_manifest(mpath, f"docs/results/data/{mpath.name}", DataError,
                                          wording="unreadable manifest")
    tables = {}
    for name in ("final", "curves", "lr"):
        fname = f"{stem}.{SUFFIX}.{name}.csv"
        raw = common.checked_bytes(data / fname, manifest.get("files", {}).get(fname), f"docs/results/data/{fname}",
                                    mpath.name, DataError)
        tables[name] = list(csv.DictReader(io.StringIO(raw.decode())))
    return manifest, tables


def arms(final10, curves10, got, shared: float):
    """``({variant: {seed: final loss}}, {variant: {seed: {step: val loss}}}, {seed: final loss of
    V-Para at its own rate}, that rate)`` over both sections' runs at the shared rate ``shared``."""
    finals = {v: {} for v in VARIANTS}
    curves = {v: {} for v in VARIANTS}
    for r in final10[final10.path == "own"].itertuples():
        finals[r.variant][int(r.seed)] = float(r.final_val_loss)
    for r in curves10.itertuples():
        curves[r.variant].setdefault(int(r.seed), {})[int(r.step)] = float(r.val_loss)
    own_rate, rate = {}, None
    for r in (got[1]["final"] if got else []):
        if float(r["lr"]) == shared:
            finals[r["variant"]][int(r["seed"])] = float(r["final_val_loss"])
        else:
            own_rate[int(r["seed"])], rate = float(r["final_val_loss"]), float(r["lr"])
    for r in (got[1]["curves"] if got else []):
        if float(r["lr"]) == shared:
            curves[r["variant"]].setdefault(int(r["seed"]), {})[int(r["step"])] = float(r["val_loss"])
    return finals, curves, own_rate, rate


def _cell(s: dict | None) -> str:
    if s is None:
        return "-"
    return f"{s['mean_diff']:+.4f} [{s['ci95_low']:+.4f}, {s['ci95_high']:+.4f}] ({s['n']} seeds)"


def _seeds_line(finals) -> str:
    counted = stats.counted_seeds(finals, VARIANTS, ALL_SEEDS)
    part = [f"seed {s}: {', '.join(v for v in VARIANTS if s in finals[v])} only" for s in ALL_SEEDS
            if s not in counted and any(s in finals[v] for v in VARIANTS)]
    missing = [s for s in ALL_SEEDS if not any(s in finals[v] for v in VARIANTS)]
    return (f"- Seeds counted (all three arms finished): {', '.join(map(str, counted)) or 'none'}"
            + (f"; not counted (an arm unfinished): {'; '.join(part)}" if part else "")
            + (f"; not run: {', '.join(map(str, missing))}" if missing else "") + ".")


def _verdict_table(finals, got) -> list[str]:
    counted = stats.counted_seeds(finals, VARIANTS, ALL_SEEDS)
    missing = [s for s in ALL_SEEDS if s not in counted]
    L = ["| comparison | difference [95% CI] nats/token | sign-flip p | seeds below 0 | verdict |",
         "|---|---|---|---|---|"]
    for variant, ref, label in COMPARISONS:
        s = stats.paired(finals, variant, ref, counted)
        if got is None:
            L.append(f"| {label} | not run | - | - | not run |")
        elif s is None:
            L.append(f"| {label} | - | - | - | {stats.verdict(s, missing)} |")
        else:
            L.append(f"| {label} | {_cell(s)} | {s['perm_p']:.3f} | {s['wins']}/{s['n']} | {stats.verdict(s, missing)} |")
    return L


def verdict_rows(stem: str, data: Path, final10, curves10, base_manifest: dict) -> list[tuple[str, str, str]] | None:
    """``[(comparison, statistic, verdict)]`` of sec. 15's three comparisons as the section's table
    states them (the closing table, :mod:`studies.claims_table`), from sec. 10's tables ``final10`` /
    ``curves10`` and sec. 15's data; None while sec. 15 has no data (not run)."""
    got = load(stem, data)
    if got is None:
        return None
    finals = arms(final10, curves10, got, base_manifest["config"]["lr"])[0]
    counted = stats.counted_seeds(finals, VARIANTS, ALL_SEEDS)
    missing = [s for s in ALL_SEEDS if s not in counted]
    rows = []
    for variant, ref, label in COMPARISONS:
        s = stats.paired(finals, variant, ref, counted)
        rows.append((label, "-" if s is None else f"{variant} - {ref} = {_cell(s)} nats/token", stats.verdict(s, missing)))
    return rows


def _lr_lines(got, finals, own_rate, base_manifest) -> list[str]:
    shared = base_manifest["config"]["lr"]
    cands = {float(r["lr"]): float(r["final_val_loss"]) for r in got[1]["lr"] if r["variant"] == LR_VARIANT}
    base = base_manifest.get("lr_choice", {}).get("candidates", {})
    line = (f"V-Para's learning-rate check (a check, not a verdict; seed 100, {got[1]['lr'][0]['max_steps']} steps, as "
            "the baseline was tuned): final validation loss "
            if got[1]["lr"] else "V-Para's learning-rate check: no candidate finished yet.")
    if cands:
        line += ", ".join(f"{lr:g}: {x:.4f}" for lr, x in sorted(cands.items()))
        line += f" (the baseline's: {', '.join(f'{k}: {float(x):.4f}' for k, x in base.items()) or '-'}). "
    if len(cands) < 3:
        return ["", line + (f"Not finished ({len(cands)} of 3 candidates)." if cands else "")]
    best = stats.best_lr(cands)
    if best == shared:
        return ["", line + f"Its best candidate is the baseline's {shared:g}: the shared rate stands for V-Para too."]
    L = ["", line + f"Its best candidate is **{best:g}, not the baseline's {shared:g}**; the verdicts above keep the "
         f"shared rate (sec. 10 tunes only the baseline), and V-Para at {best:g} is reported beside them (a secondary):"]
    both = {"vpara": own_rate, "baseline": finals["baseline"]}
    seeds = [s for s in SEEDS if s in own_rate and s in finals["baseline"]]
    s = stats.paired(both, "vpara", "baseline", seeds)
    per = ", ".join(f"seed {k}: {own_rate[k]:.4f}" for k in sorted(own_rate)) or "no seed finished yet"
    L += ["", f"- vpara at {best:g} ({per}) minus baseline at {shared:g}: {_cell(s)}"
          + ("" if len(seeds) == len(SEEDS) else f" (seeds 0-2 not all finished: {len(seeds)} paired)") + "."]
    return L


def _early_lines(curves, finals) -> list[str]:
    counted = stats.counted_seeds(finals, VARIANTS, ALL_SEEDS)
    L = ["", f"Early-step gap (a declared secondary, no verdict): the paired gap to the baseline averaged over the "
         f"evaluations at steps {', '.join(map(str, stats.EARLY_STEPS))}, over the counted seeds:", ""]
    for v in ("vpara", "attn-para"):
        s = stats.early_gap(curves, v, "baseline", counted)
        L.append(f"- {v} - baseline: {_cell(s)}" + (f" (without seeds {s['incomplete']}: steps missing)"
                                                     if s and s["incomplete"] else "") + ".")
    return L


def section(stem: str, data: Path, final10, curves10, base_manifest: dict) -> list[str]:
    """The page's sec. 15 lines: the six-seed verdicts (vpara and attn-para against the baseline,
    V1 vpara against attn-para), which seeds exist, the early-step gap and V-Para's rate check."""
    got = load(stem, data)
    finals, curves, own_rate, _ = arms(final10, curves10, got, base_manifest["config"]["lr"])
    L = ["", "## Verdicts at six seeds (protocol sec. 15)", "",
         f"Seeds {', '.join(map(str, NEW_SEEDS))} of each arm added to seeds {', '.join(map(str, SEEDS))}, the runs "
         f"otherwise as above (protocol [sec. 15]({SEC15})); the 3-seed verdicts above stand as they are. Per "
         f"comparison the paired difference of the final validation loss over seeds 0-{ALL_SEEDS[-1]} with its 95% "
         f"Student-t interval ({len(ALL_SEEDS) - 1} degrees of freedom, t = {t975(len(ALL_SEEDS) - 1):.3f}): **held** "
         "if it lies below 0, **failed** if above 0, **not decided** otherwise and while any of the six seeds of "
         "either arm is missing.", ""]
    if got is None:
        have = stats.counted_seeds(finals, VARIANTS, SEEDS)
        L += [f"**Not run**: no run of seeds {', '.join(map(str, NEW_SEEDS))} has landed (no "
              f"`docs/results/data/{stem}.{SUFFIX}.*`); seeds present: {', '.join(map(str, have)) or 'none'} of "
              "each arm (sec. 10). The early-step gap and V-Para's learning-rate check appear here with them.", "",
              *_verdict_table(finals, got)]
        return L
    m = got[0]
    L += [f"- Run: `{m['command']}` at commit `{m['commit']}`, started {m['started']}, torch {m['torch']}; tasks "
          f"finished at {', '.join(f'`{c}`' for c in m['task_commits'])}; {m['cpu_hours']:.1f} CPU-hours recorded"
          + ("." if m["complete"] else f" so far (**incomplete**; not yet landed: {', '.join(m['missing'])})."),
          _seeds_line(finals), "", *_verdict_table(finals, got), "",
          f"Final validation loss of seeds {', '.join(map(str, NEW_SEEDS))} (seeds {', '.join(map(str, SEEDS))}: "
          "sec. 10's table below):", "", "| seed | " + " | ".join(VARIANTS) + " |", "|---|" + "---|" * len(VARIANTS)]
    for s in NEW_SEEDS:
        L.append(f"| {s} | " + " | ".join(f"{finals[v][s]:.4f}" if s in finals[v] else "-" for v in VARIANTS) + " |")
    L += _early_lines(curves, finals)
    L += _lr_lines(got, finals, own_rate, base_manifest)
    return L
