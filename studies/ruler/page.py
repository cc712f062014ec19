"""Protocol sec. 13's result pages, pure functions of the committed probe data
(``docs/results/data/ruler[-cpu|-pilot]_<model>.*``, written by ``python -m studies run ruler-probe``):

* ``ruler_<model>.md`` (sec. 13.1's full design) and ``ruler-cpu_<model>.md`` (sec. 13.10's CPU
  design): the manifest, the unedited model's accuracy per task and length with chance and
  headroom, sec. 13.2's entry test of a task left on its easiest rung, the rules L1-L4 with their
  verdicts, the length trend of L4 and every setting's drop per task and length;
* ``ruler-pilot_<model>.md``: the pilot's accuracy per rung and the rung sec. 13.2's rule chose
  (secs. 13.7 / 13.9 record the decision).

Every statistic is :mod:`studies.ruler.stats`'s (the haystack bootstrap, the rules); this module
only reads and prints. A run without all of its design's lengths (``complete: false``) decides no
rule: L1-L3 pool the four lengths and L4's slope needs all four (secs. 13.4, 13.10), so each rule
reads "not decided" and names the lengths that are not in; its numbers on the lengths that are in
are printed beside, without a verdict.
"""

from __future__ import annotations

import io
from pathlib import Path

from studies import common
from studies.claims import amend
from studies.claims.data import DataError
from studies.ruler import stats
from studies.ruler.items import LADDERS, TASKS
from studies.ruler.run import pilot_accuracy
from studies.ruler.score import PILOT_FLOOR, VERDICT_FLOOR, pick_rungs
from tl_directional.core.rank import spearman

#: sec. 13.4's statistics as the rows name them, and their number format
RULER_STATS = {"L1": ("drop(exclude-self 0.5) / headroom, mean over lengths", "+.3f"),
               "L2": ("drop(V-Para 0.5) - drop(exclude-self 0.5), mean over lengths", "+.2f"),
               "L3": ("min over exclude-self 0 and V-Para 0 of drop(hard diagonal) - drop(that)", "+.2f"),
               "L4": ("slope of drop(exclude-self 0.5) / headroom over log2(length)", "+.3f")}
#: sec. 13.4's claims, as the verdict rows name them (the closing table matches ``"L1 (sec. 13.4): "``)
CLAIMS = {"L1": "exclude-self half retention tracks the baseline (drop below 0.10 of the headroom)",
          "L2": "at half retention exclude-self damages less than full aggregate",
          "L3": "hard diagonal removal is the most damaging removal",
          "L4": "exclude-self half retention loses more as the context grows"}
#: the protocol section that records each model's pilot decision
PILOT_SECTIONS = {"smollm2-135m": "13.7", "gemma-3-270m": "13.9"}
#: the difficulty's name per task (sec. 13.1)
KNOB = {"needle-multi": "k", "variable-tracking": "h", "common-words": "f"}
DESIGNS = {"ruler": "the full design (sec. 13.1)", "ruler-cpu": "the CPU design (sec. 13.10)"}


def stems(data: Path) -> list[str]:
    """The main runs' stems with a committed manifest (``ruler_*`` and ``ruler-cpu_*``, not the pilots)."""
    return sorted(p.name[: -len(".manifest.json")] for pat in ("ruler_*", "ruler-cpu_*")
                  for p in data.glob(f"{pat}.manifest.json"))


def pilot_stems(data: Path) -> list[str]:
    """The pilots' stems with a committed manifest (``ruler-pilot_*``)."""
    return sorted(p.name[: -len(".manifest.json")] for p in data.glob("ruler-pilot_*.manifest.json"))


def load(stem: str, data: Path):
    """``(manifest, records)`` of a committed run; raises :class:`studies.claims.data.DataError` for a
    missing or edited file or data made from a dirty tree."""
    import pandas as pd

    mpath = data / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, mpath.name, DataError)
    commits = [manifest["commit"], *(t.get("commit", "") for t in manifest.get("texts", {}).values())]
    if any("+dirty" in c for c in commits):
        raise DataError(f"{mpath.name}: made from a dirty tree ({manifest['commit']}); rerun from a clean one")
    name = f"{stem}.records.csv"
    rec = pd.read_csv(io.BytesIO(common.checked_bytes(data / name, manifest["files"].get(name, ""), name,
                                                      mpath.name, DataError)))
    # a length stopped between settings (the runner's checkpoint, in ``partial``) is not read
    stopped = [int(k[3:]) for k in manifest.get("partial", {})]
    return manifest, rec[~rec["length"].isin(stopped)].reset_index(drop=True)


def _n(length: int) -> str:
    return f"{length:,}"


def scored_note(length: str, manifest: dict) -> str:
    """How far ``length`` (``len<n>``) is scored, for the provenance list: "" when finished, else
    "(not scored yet)" or, for a length stopped between settings (the runner's checkpoint), the
    settings it holds, none of which the page reads yet."""
    if length in manifest.get("texts", {}):
        return ""
    done = manifest.get("partial", {}).get(length, {}).get("setting_seconds", {})
    if not done:
        return " (not scored yet)"
    return (f" (in part, not read: {len(done)} of {1 + len(manifest.get('settings', []))} settings, "
            f"{', '.join(done)})")


def missing_lengths(manifest: dict, rec) -> list[int]:
    """The design's lengths with no records (a partial run, sec. 13.6's runner writes length by length)."""
    have = set(rec["length"].unique().tolist())
    return [n for n in manifest["design"]["lengths"] if n not in have]


def entry(rec, manifest: dict) -> tuple[list[str], dict[str, str]]:
    """Sec. 13.2's tasks with a verdict and, per task left on its easiest rung, the page's line on it:
    ``(tasks, {task: reading})``. Without 512-token records the entry test cannot be read: such a task
    is left out of the pooled items ("not decided")."""
    rungs = manifest["rungs"]
    easiest = [t for t in rec["task"].drop_duplicates() if not rungs.get(t, {}).get("reached_floor", True)]
    if 512 not in set(rec["length"].unique().tolist()):
        keep = [t for t in rec["task"].drop_duplicates() if t not in easiest]
        return keep, {t: "not decided: its test reads 512 tokens, not in this run yet" for t in easiest}
    keep = stats.verdict_tasks(rec, rungs, VERDICT_FLOOR)
    notes = {}
    for t in easiest:
        b = stats.baseline_at(rec, t, 512)
        notes[t] = (f"baseline at 512 tokens {b.point:.1f} [{b.lo:.1f}, {b.hi:.1f}]: lower bound "
                    + (f"{b.lo:.1f} >= {100 * VERDICT_FLOOR:.0f}, gets a verdict" if t in keep else
                       f"{b.lo:.1f} < {100 * VERDICT_FLOOR:.0f}, **reported without a verdict**"))
    return keep, notes


def rule_rows(rec, manifest: dict) -> tuple[list[str], list[tuple[str, stats.Stat | None, str]]]:
    """``(tasks, [(id, Stat or None, verdict)])`` of L1-L4 on the tasks with a verdict; a partial run's
    verdicts are "not decided (...)" naming the lengths not in, its Stat computed on the lengths in
    (None where fewer than two are in: no slope)."""
    tasks, _ = entry(rec, manifest)
    missing = missing_lengths(manifest, rec)
    have = sorted(set(rec["length"].unique().tolist()))
    got = stats.rules(rec, tasks) if len(have) >= 2 else {}
    why = ("" if not missing and manifest.get("complete") else
           f"not decided (run incomplete: {', '.join(_n(n) for n in missing)} tokens not in)" if missing else
           "not decided (run incomplete)")
    return tasks, [(rid, got.get(rid), why or f"**{got[rid].verdict}**") for rid in RULER_STATS]


def verdict_rows(stem: str, data: Path) -> list[tuple[str, str, str]]:
    """``[(claim, statistic, verdict)]`` of L1-L4 on a committed run, as the verdict table of
    docs/results.md and the closing table (:mod:`studies.claims_table`) print them; drops in points."""
    manifest, rec = load(stem, data)
    tasks, rows = rule_rows(rec, manifest)
    missing = missing_lengths(manifest, rec)
    only = f"; lengths {', '.join(_n(n) for n in sorted(set(rec['length'])))} only" if missing else ""
    out = []
    for rid, st, verdict in rows:
        what, f = RULER_STATS[rid]
        num = "-" if st is None else f"{st.point:{f}} [{st.lo:{f}}, {st.hi:{f}}]"
        out.append((f"{rid} (sec. 13.4): {CLAIMS[rid]}", f"{what} = {num} ({', '.join(tasks)}{only})", verdict))
    return out


def _ci(st: stats.Stat, f: str = ".1f") -> str:
    return f"{st.point:{f}} [{st.lo:{f}}, {st.hi:{f}}]" if st.point == st.point else "-"


def drops(rec, tasks, settings) -> tuple[list[int], dict[str, list[stats.Stat]], list[stats.Stat]]:
    """``(lengths, {setting: [drop per length, then the mean over lengths]}, [baseline per length])``
    in points on the items of ``tasks``, each with its haystack bootstrap interval (the same draws)."""
    lengths, pt, rs = stats.per_length_accuracy(rec, tasks, ["baseline", *settings])
    base = [stats.interval(float(pt["baseline"][k]), rs["baseline"][:, k]) for k in range(len(lengths))]
    out = {}
    for s in settings:
        d, dr = pt["baseline"] - pt[s], rs["baseline"] - rs[s]
        out[s] = [stats.interval(float(d[k]), dr[:, k]) for k in range(len(lengths))]
        out[s].append(stats.interval(float(d.mean()), dr.mean(-1)))
    return lengths, out, base


def _manifest_lines(manifest: dict, stem: str) -> list[str]:
    d = manifest["design"]
    scored = d.get("scored")
    hay = (", ".join(f"{scored[str(n)]} at {_n(n)}" for n in d["lengths"]) if scored
           else f"{d['haystacks']} at each length")
    L = [f"- data: `docs/results/data/{stem}.*` ({'complete' if manifest.get('complete') else '**incomplete**'})",
         f"- command: `{manifest['command']}` at commit `{manifest['commit']}` ({manifest.get('date', '-')})",
         f"- design: seed {d['seed']}, haystacks scored {hay} (of {d['haystacks']} generated per length); "
         f"lengths {', '.join(_n(n) for n in d['lengths'])} tokens",
         f"- scorer: {manifest.get('scorer', 'batched')} (sec. 13.6 batched, sec. 13.8 shared-prefix); "
         f"device: {manifest.get('device', 'cpu')}; machine: {manifest.get('machine', '-')}"]
    if manifest.get("pilot_manifest_sha256"):
        L.append(f"- rungs read from the committed pilot manifest (sha256 `{manifest['pilot_manifest_sha256'][:16]}`): "
                 + ", ".join(f"{t} `{KNOB[t]} = {v['rung']}`" for t, v in manifest.get("rungs", {}).items()))
    L.append("- items' sha256 per length (sec. 13.6: the items are a pure function of the design, the filler "
             "files and the tokenizer):")
    L += [f"    - {_n(int(k[3:]))} tokens: `{v}`" + scored_note(k, manifest) for k, v in manifest.get("items_sha256", {}).items()]
    for k, t in manifest.get("texts", {}).items():
        if t.get("commit") and t["commit"] != manifest["commit"]:
            L.append(f"- {_n(int(k[3:]))} tokens scored at commit `{t['commit']}`: `{t.get('command', '-')}`")
    return L


def _baseline_section(rec, manifest: dict) -> list[str]:
    lengths = sorted(set(rec["length"].unique().tolist()))
    L = ["## The unedited model", "",
         f"Accuracy in points per task and length (four-way choice: chance {stats.CHANCE:.0f}), with the "
         "95% haystack bootstrap interval; headroom `H` = accuracy - 25 (sec. 13.3).", "",
         "| task | rung | " + " | ".join(f"{_n(n)}: accuracy | H" for n in lengths) + " |",
         "|---|---|" + "---|---|" * len(lengths)]
    for t in [t for t in TASKS if t in set(rec["task"])]:
        rung = manifest["rungs"].get(t)
        _, _, base = drops(rec, [t], [])
        cells = " | ".join(f"{_ci(b)} | {b.point - stats.CHANCE:+.1f}" for b in base)
        knob = f"`{KNOB[t]} = {rung['rung']}`" if rung else "-"
        L.append(f"| {t} | {knob} | {cells} |")
    tasks, notes = entry(rec, manifest)
    L += ["", f"**Which tasks get a verdict** (sec. 13.2): every task whose pilot rung reached "
          f"{100 * PILOT_FLOOR:.0f}%; a task left on its easiest rung only if the baseline's lower bound at 512 "
          f"tokens reaches {100 * VERDICT_FLOOR:.0f}% (secs. 13.7, 13.9). L1-L4 pool: {', '.join(tasks)}.", ""]
    L += [f"- {t}: {note}" for t, note in notes.items()]
    return L


def _rules_section(rec, manifest: dict) -> list[str]:
    tasks, rows = rule_rows(rec, manifest)
    missing = missing_lengths(manifest, rec)
    L = ["## Rules (sec. 13.4)", ""]
    if missing:
        L += [f"**Partial run**: lengths {', '.join(_n(n) for n in sorted(set(rec['length'])))} tokens are in, "
              f"{', '.join(_n(n) for n in missing)} are not. L1-L3 pool the four lengths and L4's slope needs all "
              "four (secs. 13.4, 13.10), so no rule is decided; the numbers below are on the lengths that are in.", ""]
    L += [f"Pooled items: {', '.join(tasks)}; drops in points, 95% haystack bootstrap, 2,000 resamples, seed 0.", "",
          "| id | claim | statistic | value [95% CI] | verdict |", "|---|---|---|---|---|"]
    for rid, st, verdict in rows:
        what, f = RULER_STATS[rid]
        L.append(f"| {rid} | {CLAIMS[rid]} | {what} | {'-' if st is None else _ci(st, f)} | {verdict} |")
    return L


def _trend_section(rec, manifest: dict) -> list[str]:
    import torch

    tasks, rows = rule_rows(rec, manifest)
    lengths, pt, rs = stats.per_length_accuracy(rec, tasks, ["baseline", stats.EXCL[0.5]])
    head_pt, head_rs = pt["baseline"] - stats.CHANCE, rs["baseline"] - stats.CHANCE
    d_pt, d_rs = pt["baseline"] - pt[stats.EXCL[0.5]], rs["baseline"] - rs[stats.EXCL[0.5]]
    nan = torch.full_like(d_rs, float("nan"))
    ratio_rs = torch.where(head_rs > 0, d_rs / head_rs, nan)
    L = ["## The length trend (L4)", "",
         f"Exclude-self at `s_par = 0.5` on the pooled items ({', '.join(tasks)}), per length: its drop divided by "
         "the headroom inside each resample (a resample without positive headroom left out).", "",
         "| length | baseline | H | drop | drop / H |", "|---|---|---|---|---|"]
    for k, n in enumerate(lengths):
        ratio = float(d_pt[k] / head_pt[k]) if head_pt[k] > 0 else float("nan")
        L.append(f"| {_n(n)} | {pt['baseline'][k]:.1f} | {head_pt[k]:+.1f} | "
                 f"{_ci(stats.interval(float(d_pt[k]), d_rs[:, k]))} | "
                 f"{_ci(stats.interval(ratio, ratio_rs[:, k]), '+.3f')} |")
    _, st, verdict = rows[-1]
    L += ["", f"Slope over log2(length): {'-' if st is None else _ci(st, '+.3f')}, {verdict}."]
    return L


def nats_deltas(model: str, data: Path) -> dict[str, float] | None:
    """Sec. 9.2's pooled nats/token delta per setting on ``model`` (the committed ``amend_<model>``
    run, :func:`studies.claims.amend.page_inputs`), or None where that run is not committed."""
    if not (data / f"amend_{model}.manifest.json").is_file():
        return None
    st = amend.page_inputs(f"amend_{model}")[2]
    return {s: float(st[s]["pooled"][0]) for s in st}


def _rho(got: dict[str, list[stats.Stat]], nats: dict[str, float], k: int) -> str:
    settings = [s for s in got if s in nats]
    x = [got[s][k].point for s in settings]
    if len(set(x)) < 2:  # every setting drops alike (e.g. a task at ceiling): no ranking to correlate
        return "undefined (every drop equal)"
    return f"{spearman(x, [nats[s] for s in settings]):+.2f}"


def _drops_section(rec, manifest: dict, model: str, nats: dict[str, float] | None) -> list[str]:
    tasks, _ = entry(rec, manifest)
    settings = [s for s in rec["setting"].drop_duplicates() if s != "baseline"]
    L = ["## Every setting's drop", "",
         "Baseline minus edited accuracy in points, per length and the mean over lengths, 95% haystack bootstrap "
         "(the same draws for every setting); residual attention at 0.5 has no rule (sec. 13.4)."]
    L += ["", "Below each table, without a verdict (sec. 13.4): Spearman's rho across the six settings of these drops "
          "with sec. 9.2's pooled nats/token deltas of the same settings (do the items rank the edits differently?)"
          + (f", from [amend_{model}](amend_{model}.md)." if nats else f": not read, `amend_{model}.*` is not committed.")]
    groups = [(f"pooled: {', '.join(tasks)} (the rules' items)", tasks)] + [(t, [t]) for t in TASKS
                                                                           if t in set(rec["task"])]
    for title, ts in groups:
        lengths, got, _ = drops(rec, ts, settings)
        L += ["", f"### {title}", "", "| setting | " + " | ".join(_n(n) for n in lengths) + " | mean |",
              "|---|" + "---|" * (len(lengths) + 1)]
        L += [f"| {s} | " + " | ".join(_ci(st) for st in got[s]) + " |" for s in settings]
        if nats:
            L += ["", "Spearman's rho with the nats deltas: " + ", ".join(
                f"{_n(n)} {_rho(got, nats, k)}" for k, n in enumerate(lengths)) + f", mean {_rho(got, nats, -1)}."]
    return L


def build_page(stem: str, data: Path) -> str:
    """The page of a main run (``ruler_<model>`` or ``ruler-cpu_<model>``) from its committed data."""
    manifest, rec = load(stem, data)
    kind, model = stem.split("_", 1)
    L = [f"# RULER-style probe: {model}, {DESIGNS[kind]}", "",
         "Built by `python -m studies build` (`make results`) from the committed data alone; do not edit by hand. "
         "Protocol sec. 13 ([protocol](protocol.md)): four-way choice items by likelihood at 256-2,048 tokens, "
         "under the unedited model and sec. 13.3's six edits; the pilot that fixed the rungs is "
         f"[ruler-pilot_{model}](ruler-pilot_{model}.md).", "", "## The run", ""]
    L += _manifest_lines(manifest, stem)
    L += [""] + _baseline_section(rec, manifest)
    L += [""] + _rules_section(rec, manifest)
    if len(set(rec["length"])) >= 2:
        L += [""] + _trend_section(rec, manifest)
    L += [""] + _drops_section(rec, manifest, model, nats_deltas(model, data))
    return "\n".join(L)


def pilot_decision(manifest: dict, rec) -> tuple[dict, dict]:
    """``(accuracy, rungs)``: the pilot's accuracy per task and rung from its records and sec. 13.2's
    choice on them (with sec. 13.6's fit rule), checked against the manifest's ``pilot_accuracy`` and
    ``rungs``; raises :class:`studies.claims.data.DataError` where they differ."""
    acc = pilot_accuracy(rec.to_dict("records"))
    fits = {t: {int(d): v for d, v in by.items()} for t, by in manifest["fits_shortest"].items()}
    rungs = pick_rungs(acc, LADDERS, fits)
    recorded = {t: {int(d): a for d, a in by.items()} for t, by in manifest["pilot_accuracy"].items()}
    if recorded != acc or manifest["rungs"] != rungs:
        raise DataError(f"{manifest['model']['name']}'s pilot: the manifest's pilot_accuracy / rungs differ from "
                        "its records' (sec. 13.2's rule); restore both files from git")
    return acc, rungs


def build_pilot_page(stem: str, data: Path) -> str:
    """The pilot's page (``ruler-pilot_<model>``): accuracy per rung and sec. 13.2's choice."""
    manifest, rec = load(stem, data)
    model = stem.split("_", 1)[1]
    acc, rungs = pilot_decision(manifest, rec)
    sec = PILOT_SECTIONS.get(model, "13.2")
    n = rec[rec["setting"] == "baseline"].groupby(["task", "difficulty"]).size()
    L = [f"# RULER-style probe, the pilot: {model}", "",
         "Built by `python -m studies build` (`make results`) from the committed data alone; do not edit by hand. "
         f"Protocol sec. 13.2: the unedited model on the pilot's items (seed {manifest['design']['seed']}, "
         f"{manifest['design']['haystacks']} haystacks at {', '.join(_n(x) for x in manifest['design']['lengths'])} "
         "tokens, every rung) fixes each task's rung before any main item is scored: the hardest rung whose accuracy "
         f"reaches {100 * PILOT_FLOOR:.0f}%, among those whose items fit 256 tokens (sec. 13.6), else the easiest. "
         f"Sec. {sec} of the [protocol](protocol.md) records the decision. Never evidence for a rule.", "",
         "## The run", "",
         f"- data: `docs/results/data/{stem}.*`",
         f"- command: `{manifest['command']}` at commit `{manifest['commit']}` ({manifest.get('date', '-')})",
         f"- scorer: {manifest.get('scorer', 'batched (sec. 13.6; the manifest predates sec. 13.8)')}; "
         f"machine: {manifest.get('machine', '-')}; {manifest.get('seconds', '-')} s",
         f"- items' sha256: {', '.join(f'{k[3:]} tokens `{v}`' for k, v in manifest['items_sha256'].items())}", "",
         "## Accuracy per rung and the decision", "",
         "| task | rungs (easiest first) | items per rung | pilot accuracy | fits 256 tokens | chosen |",
         "|---|---|---|---|---|---|"]
    for t in TASKS:
        ladder = LADDERS.get(t, (1,))
        fits = manifest["fits_shortest"].get(t, {})
        fit = " / ".join(("yes" if fits[str(d)] else "**no**") if fits else "yes" for d in ladder)
        count = " / ".join(str(int(n.get((t, d), 0))) for d in ladder)
        pct = " / ".join(f"{100 * acc[t][d]:.0f}%" for d in ladder)
        if t not in rungs:
            L.append(f"| {t} | - | {count} | {pct} | {fit} | - |")
            continue
        r = rungs[t]
        why = (f"the hardest fitting rung at or above {100 * PILOT_FLOOR:.0f}%" if r["reached_floor"] else
               f"the easiest: no rung reached {100 * PILOT_FLOOR:.0f}%; a verdict only if the main baseline's lower "
               f"bound at 512 tokens reaches {100 * VERDICT_FLOOR:.0f}%")
        L.append(f"| {t} ({KNOB[t]}) | {' / '.join(map(str, ladder))} | {count} | {pct} | {fit} | "
                 f"**`{KNOB[t]} = {r['rung']}`** ({why}) |")
    L += ["", "The choice above is sec. 13.2's rule (`studies.ruler.score.pick_rungs`) applied to the accuracies "
          "read from the records; the build checks that it equals the manifest's `rungs`, which the main run reads."]
    return "\n".join(L)
