"""The closing table (issue 50): every rule of the protocol that has a verdict function, one row per
rule and model, with the claim in one line, the versions of the paper it addresses, our number and
its 95% interval as the run's page prints it, the verdict, the data and the command (and commit)
that made them. Built by ``python -m studies build`` (``make results``) into
``docs/results/claims_table.md`` from the committed data alone.

Nothing here computes a statistic: the rows of the verdict table of docs/results.md
(:func:`studies.pages.summary_rows`, the studies' own verdict functions) are passed in, and the runs
that table does not list are read through their pages' functions (sec. 15:
:func:`studies.pass_training.seeds6_page.verdict_rows`; sec. 16:
:func:`studies.claims.sites_more.verdict_rows`); sec. 13's rows are the verdict table's
(:func:`studies.ruler.page.verdict_rows`). The
versions come from :data:`studies.paper.ADDRESSES`, the lead table's home of them. A rule whose data
are not committed prints **not run** and the command that writes them, so the row fills in when a
later session commits the data and runs ``make results``; a verdict row no rule here claims stops the
build (:class:`studies.claims.data.DataError`), so a new rule cannot be added without its row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from studies.accuracy.page import CLAIM_PREFIX, FAIR, POOLED, WITHIN_FAMILY, WORSE_FAMILY
from studies.claims import sites_more
from studies.claims.data import DataError
from studies.paper import ADDRESSES
from studies.pass_training import page as pass_training
from studies.pass_training import seeds6_page

PAGE = "claims_table.md"
MODELS = ("smollm2-135m", "gemma-3-270m")
NOT_RUN = "**not run**"


@dataclass(frozen=True)
class Source:
    """Where a rule's verdict is read: the data ``stems`` (``{model}`` filled; the first one committed
    is read), the command that writes the first (``plan``, printed while none is committed, with
    ``note`` after it; ``", then "`` parts one after the other) and the page built from them (``page``; "" where none is built)."""

    stems: tuple[str, ...]
    plan: str
    page: str = ""
    note: str = ""


_CLAIMS = "python -m studies run claims --model {model}"
#: source name -> Source; the summary kinds of :func:`studies.pages.summary_rows` and four more
SOURCES = {
    "claims": Source(("claims_{model}",), _CLAIMS + " --windows 32 --seq-len 128 --batch-size 8", "claims_{model}.md"),
    "depth": Source(("depth_{model}",), "python -m studies run depth --model {model} --windows 32 --batch-size 8",
                    "depth_{model}.md"),
    "compression": Source(("compression_{model}",), "python -m studies run compression --model {model} --windows 32",
                          "claims_compression_{model}.md"),
    "training": Source(("training_kjv_10x",), "tl-directional experiment --corpus KJV --out RUN --threads 1 --seeds "
                       "0,1,2,3,4 --variants baseline,vpara --max-steps 2000 --eval-every 200 --eval-windows 256, then "
                       "python -m studies run training collect --run RUN --launch LAUNCH.json",
                       "claims_training_kjv_10x.md"),
    "pass": Source(("pass8m",), "python -m studies run pass-training run --jobs 1, then python -m studies run "
                   "pass-training collect", "pass8m.md"),
    "seeds6": Source(("pass8m.seeds6",), "python -m studies run pass-training run-seeds6 --jobs 2, then python -m studies "
                     "run pass-training collect-seeds6", "pass8m.md"),
    "amend": Source(("amend_{model}",), _CLAIMS + " --settings amend --windows 32 --batch-size 8 --threads 1",
                    "amend_{model}.md"),
    "accuracy": Source(("accuracy_{model}",), _CLAIMS + " --settings accuracy --windows 32 --batch-size 8 --threads 1",
                       "accuracy_{model}.md"),
    "accuracy-fair": Source(("accuracy_{model}_fair",), _CLAIMS + " --settings accuracy --tag fair",
                            "accuracy_{model}_fair.md"),
    "instruments": Source(("instruments_{model}",), _CLAIMS + " --settings instruments --windows 24 --batch-size 8 "
                          "--threads 1", "instruments_{model}.md"),
    "ruler": Source(("ruler_{model}", "ruler-cpu_{model}"), ".venv-legacy/bin/python -m studies run ruler-probe "
                    "--model {model} --scorer shared-prefix --device cuda", "{stem}.md", note="(sec. 13.10's CPU design: `--design cpu` "
                    "without `--device`, data `ruler-cpu_{model}.*`, read when the full design's are not committed)"),
    "strength": Source(("strength_{model}",), _CLAIMS + " --settings strength --windows 16 --batch-size 8 --threads 1",
                       "strength_{model}.md"),
    "residatlas": Source(("residatlas_{model}",), _CLAIMS + " --settings residatlas --windows 16 --batch-size 8 "
                         "--threads 1 --resume", "residatlas_{model}.md"),
    "residrandom": Source(("residrandom_{model}",), _CLAIMS + " --settings residrandom --windows 16 --batch-size 8 "
                          "--threads 1", "residrandom_{model}.md"),
}
#: the model column of the runs that are not per pretrained model
SHOWN = {"toy": "toy GPT-2 (2 layers, KJV)", "pass8m": "GPT-2 (4 layers, pass8m)"}


@dataclass(frozen=True)
class Rule:
    """One row per model of the closing table: the protocol's ``id`` and ``section``, the ``claim``
    in one line, the ``source`` its verdict is read from, ``match`` (the verdict row's claim equals
    it, or starts with it where it ends in ``": "`` or ``" "``), the key of :data:`studies.paper.ADDRESSES`
    (``""``: the protocol pins it to no version), the ``models``, and ``note`` (a withdrawn verdict)."""

    id: str
    section: str
    claim: str
    source: str
    match: str
    addresses: str = ""
    models: tuple[str, ...] = MODELS
    note: str = ""

    def matches(self, claim: str) -> bool:
        return claim == self.match or (self.match[-1] in ": " and claim.startswith(self.match))


#: the accuracy rows' suite, named in their claim (protocol sec. 9.7: the lead table reads the fair one)
_SUITE_NOTE = {POOLED: "the pooled suite", FAIR: "the fair suite, which the lead table reads where it is committed"}


def _accuracy_rules(section: str, source: str, suite: str) -> list[Rule]:
    """Sec. 9.4's rules, one per setting of its two families (sec. 9.7 keeps them), matched on the
    verdict rows of ``suite``'s runs (:data:`studies.accuracy.page.CLAIM_PREFIX`)."""
    out = []
    for lab in (*WITHIN_FAMILY, *WORSE_FAMILY):
        within = lab in WITHIN_FAMILY
        key = (f"acc<=1.5@{lab.rsplit('=', 1)[1]}" if within else
               "acc>=3 vpara" if lab.startswith("value-full") else "acc>=3 hard")
        rule = "within 1.5 points of baseline" if within else "at least 3 points worse than baseline"
        out.append(Rule(f"acc {lab}", section, f"accuracy under {lab} {rule} ({_SUITE_NOTE[suite]})", source,
                        f"{CLAIM_PREFIX[suite]}{lab} ", key))
    return out


RULES: tuple[Rule, ...] = (
    Rule("A1", "3", "exclude-self value edits (per head, all layers) change loss by at most 0.05 nats/token over "
         "s_par in [0, 1]", "claims", "A1", "A1"),
    Rule("A2", "3", "... and by at most 0.065 up to s_par = 3", "claims", "A2", "A2",
         note="withdrawn as a verdict by sec. 9.1"),
    Rule("A3", "3", "exclude-self removal damages less than V-Para, resid-attn and resid-MLP removal and its "
         "matched-norm perpendicular edit", "claims", "A3"),
    Rule("B", "3", "full-aggregate V-Para removal (per head, all layers) hurts: delta above 0.05", "claims", "B", "B"),
    Rule("C1", "3", "perpendicular removal hurts more than parallel removal in every space, at matched norm",
         "claims", "C1", "C1"),
    Rule("C2", "3", "the same at matched scale (s_perp = 0 against s_par = 0)", "claims", "C2", "C2"),
    Rule("E", "3", "a head's value-space parallel share tracks its mean A_tt (Spearman above 0.5)", "claims", "E"),
    Rule("E (9.5)", "9.5", "a head's non-self value-space share tracks its mean A_tt (amended reading)", "claims",
         "E (amended reading, sec. 9.5)"),
    Rule("D1", "7", "attention updates align with their own token's stream beyond anisotropy, above the random level",
         "depth", "D1: ", "D"),
    Rule("D2", "7", "the same for MLP updates", "depth", "D2: ", "D"),
    Rule("D1a", "9.5", "attention updates carry any own-token alignment beyond anisotropy", "depth", "D1a ", "D"),
    Rule("D1l", "9.5", "attention E abs cos above the random-direction level (the literal claim)", "depth", "D1l ", "D"),
    Rule("D2a", "9.5", "MLP updates carry any own-token alignment beyond anisotropy", "depth", "D2a ", "D"),
    Rule("D2l", "9.5", "MLP E abs cos above the random-direction level (the literal claim)", "depth", "D2l ", "D"),
    Rule("3", "6", "perpendicular error ranks compression damage better than parallel error, 1-cos and MSE",
         "compression", "3: ", models=("default", "smollm2-135m")),
    Rule("3 (9.5)", "9.5", "perpendicular error ranks compression damage better than parallel error (amended "
         "reading)", "compression", "3 (amended reading, sec. 9.5): ", "3 amended", ("default", "smollm2-135m")),
    Rule("4", "8", "training with full-aggregate V-Para suppression lowers validation loss (toy scale, 5 seeds)",
         "training", "4: ", "4", ("toy",)),
    Rule("4 vpara", "10", "training with V-Para (per head) lowers validation loss (one pass, 3 seeds)", "pass",
         "4: training with full-aggregate ", "4", ("pass8m",)),
    Rule("4 attn-para", "10", "training with residual suppression of the attention update lowers validation loss "
         "(one pass, 3 seeds)", "pass", "4: training with residual-space ", "4", ("pass8m",)),
    Rule("4 vpara (sec. 15)", "15", "the same for V-Para at six seeds", "seeds6", "vpara - baseline", "4",
         ("pass8m",)),
    Rule("4 attn-para (sec. 15)", "15", "the same for the residual variant at six seeds", "seeds6",
         "attn-para - baseline", "4", ("pass8m",)),
    Rule("V1 (sec. 15)", "15", "V-Para lowers validation loss more than the residual variant (six seeds)", "seeds6",
         "V1: vpara - attn-para", "V1 (sec. 15)", ("pass8m",)),
    Rule("A1p", "9.2", "exclude-self (joint, skip0) changes loss by at most 0.05 nats/token at s_par 0 and 0.5",
         "amend", "A1p: ", "A1p"),
    Rule("A1h", "9.2", "... at half retention (s_par = 0.5) alone", "amend", "A1h: ", "A1h"),
    Rule("A3h", "9.2", "at s_par = 0.5 exclude-self (joint, skip0) damages less than full aggregate", "amend",
         "A3h: ", "A3h"),
    Rule("A3r", "9.2", "at s_par = 0.5 exclude-self (joint, skip0) damages less than resid-attn (skip0)", "amend",
         "A3r: ", "A3r"),
    *_accuracy_rules("9.4", "accuracy", POOLED),
    *(Rule(r.id.replace("acc ", "acc (9.7) "), r.section, r.claim, r.source, r.match, r.addresses)
      for r in _accuracy_rules("9.7", "accuracy-fair", FAIR)),
    Rule("M1", "11.2", "parallel removal at the carrier input site costs less than residual MLP parallel removal",
         "instruments", "M1: ", "M1"),
    Rule("M2", "11.2", "... and at the carrier block site", "instruments", "M2: ", "M2"),
    Rule("M3", "11.2", "carrier parallel removal changes loss by at most 0.05 nats/token at both sites",
         "instruments", "M3: ", "M3"),
    Rule("W1", "11.3", "perpendicular weighting preserves Wanda's quality (within 0.05 nats/token)", "instruments",
         "W1: ", "W1"),
    Rule("W2", "11.3", "parallel weighting damages more than perpendicular weighting", "instruments", "W2: ", "W2"),
    Rule("R1u", "11.4", "random uniform per-layer value scales change loss by at most 0.05 nats/token (every draw)",
         "instruments", "R1u: ", "R1u"),
    Rule("R1g", "11.4", "... and bounded-Gaussian ones", "instruments", "R1g: ", "R1g"),
    Rule("R2u", "11.4", "random uniform per-layer scales cost no more than fixed s_par = 0.5 (every draw)",
         "instruments", "R2u: ", "R2u"),
    Rule("R2g", "11.4", "... and bounded-Gaussian ones", "instruments", "R2g: ", "R2g"),
    Rule("L1", "13.4", "exclude-self half retention tracks the baseline on long-context items (drop below 0.10 of "
         "the headroom)", "ruler", "L1 (sec. 13.4): ", "L1"),
    Rule("L2", "13.4", "at half retention exclude-self damages less than full aggregate (items)", "ruler", "L2 (sec. 13.4): ", "L2"),
    Rule("L3", "13.4", "hard diagonal removal is the most damaging removal (items)", "ruler", "L3 (sec. 13.4): ", "L3"),
    Rule("L4", "13.4", "exclude-self half retention loses more as the context grows", "ruler", "L4 (sec. 13.4): ", "L4"),
    Rule("atlas resid-mlp", "16.2", "layers 0-1 carry most of the single-layer residual MLP damage", "residatlas",
         "atlas (sec. 16.2), resid-mlp"),
    Rule("atlas resid-attn", "16.2", "layers 0-1 carry most of the single-layer residual attention damage",
         "residatlas", "atlas (sec. 16.2), resid-attn"),
    Rule("strength", "16.3", "the exclude-self value edit changes the attention output more than the residual edit "
         "(the paper's ordering)", "strength", "strength (sec. 16.3)", "strength (sec. 16.3)"),
    Rule("sign joint", "16.4", "the exclude-self diagonal shift is non-positive (joint form)", "strength",
         "sign (sec. 16.4), joint"),
    Rule("sign per-head", "16.4", "the exclude-self diagonal shift is non-positive (per head)", "strength",
         "sign (sec. 16.4), per-head"),
    Rule("V1 (sec. 16.5)", "16.5", "value-space random per-layer scales are more stable than residual-space ones "
         "with the same draws", "residrandom", "V1 (sec. 16.5)", "V1 (sec. 16.5)"),
)


def committed_stem(source: Source, model: str, data: Path) -> str | None:
    """The first of the source's stems for ``model`` with a committed manifest, or None."""
    for stem in source.stems:
        if (data / f"{stem.format(model=model)}.manifest.json").is_file():
            return stem.format(model=model)
    return None


def _own_rows(source: str, stem: str, data: Path) -> list[tuple[str, str, str]]:
    """``[(id, statistic, verdict)]`` of the runs the verdict table of docs/results.md does not list."""
    if source == "seeds6":
        base = stem.split(".", 1)[0]
        manifest, t = pass_training.load(base, data)
        return seeds6_page.verdict_rows(base, data, t["final"], t["curves"], manifest) or []
    return sites_more.verdict_rows(source, stem)


def _provenance(stem: str, data: Path) -> str:
    """The command cell: the manifest's command and its commit (and the other commits of a stitched run)."""
    m = json.loads((data / f"{stem}.manifest.json").read_text())
    also = [c for c in (m.get("commits") or m.get("task_commits") or []) if c != m["commit"]]
    return f"`{m['command']}` at `{m['commit']}`" + (
        f" (the run's other commits: {', '.join(f'`{c}`' for c in also)})" if also else "")


def _versions(rule: Rule) -> str:
    return " / ".join(f"`{c}`" for c in ADDRESSES[rule.addresses]) if rule.addresses else "-"


def table_rows(summary: list[tuple], data: Path) -> list[tuple]:
    """``[(rule, model, statistic, verdict, data cell, command cell)]``, one per rule of :data:`RULES`
    and model, from ``summary`` (:func:`studies.pages.summary_rows`) and the other runs' functions.
    Raises :class:`studies.claims.data.DataError` naming a verdict row of a covered run that no rule
    claims (a rule added to a study without its row here)."""
    by_stem: dict[str, list[tuple[str, str, str]]] = {}
    for _, stem, _, claim, stat, verdict in summary:
        by_stem.setdefault(stem, []).append((claim, stat, verdict))
    out, claimed = [], set()
    for source_name, source in SOURCES.items():
        rules = [r for r in RULES if r.source == source_name]
        for model in dict.fromkeys(m for r in rules for m in r.models):
            stem = committed_stem(source, "" if model in SHOWN else model, data)
            got = (by_stem.get(stem, []) if source_name not in ("seeds6", "strength", "residatlas",
                                                                "residrandom") else _own_rows(source_name, stem, data)
                   ) if stem else []
            for rule in (r for r in rules if model in r.models):
                hit = [g for g in got if rule.matches(g[0])]
                claimed.update((stem, g[0]) for g in hit)
                out.append(_row(rule, model, source, stem, hit, data))
            stray = [g[0] for g in got if (stem, g[0]) not in claimed]
            if stray:
                raise DataError(f"{stem}: verdict row {stray[0]!r} has no row in the closing table; add a Rule for it "
                                "to studies/claims_table.py RULES")
    return out


def _row(rule: Rule, model: str, source: Source, stem: str | None, hit: list, data: Path) -> tuple:
    """One row's cells: statistic, verdict, data and command (not run: the command that writes the data)."""
    if stem is None:
        plan = source.plan.format(model=model)
        note = " " + source.note.format(model=model) if source.note else ""
        steps = ", then ".join(f"`{c}`" for c in plan.split(", then "))
        return rule, model, "-", NOT_RUN, f"`{source.stems[0].format(model=model)}.*`", steps + note
    cell = f"[{stem}]({source.page.format(model=model, stem=stem)})" if source.page else f"`{stem}.*`"
    if not hit:
        return rule, model, "not measured in this run", "not decided", cell, _provenance(stem, data)
    _, stat, verdict = hit[0]
    if rule.note:
        verdict = f"no rule ({rule.note}; the first verdict: {verdict})"
    return rule, model, stat, verdict, cell, _provenance(stem, data)


def _counts(rows) -> str:
    kinds = {"held": 0, "failed": 0, "not decided": 0, "no rule": 0, "not run": 0}
    for _, _, _, verdict, _, _ in rows:
        word = verdict.strip("*")
        kinds[next((k for k in kinds if word.startswith(k)), "not decided")] += 1
    return ", ".join(f"{k} {n}" for k, n in kinds.items())


def build_page(summary: list[tuple], data: Path) -> str:
    """The closing table's page (``docs/results/claims_table.md``) from ``summary``
    (:func:`studies.pages.summary_rows`) and the committed data in ``data``."""
    rows = table_rows(summary, data)
    covered = {committed_stem(s, m, data) for n, s in SOURCES.items() for m in {m for r in RULES if r.source == n
                                                                           for m in r.models}}
    others = sorted({stem for _, stem, *_ in summary if stem not in covered})
    L = ["# Every claim, from the data", "",
         "Built by `python -m studies build` (`make results`) from the committed data under `docs/results/data/` "
         "alone; do not edit by hand. One row per rule of [the protocol](protocol.md) that has a verdict function, "
         "per model where the rule is per model:", "",
         "- **versions**: the commits of the paper (repository `Shwai-He/Transformer-Geometry`, protocol sec. 12) "
         "whose text the verdict addresses, from `studies/paper.py` (`ADDRESSES`), the same constants the lead "
         "table of [Results](../results.md) reads; `-` where the protocol pins the rule to no version (the seed's "
         "own terms, or a reading of no pinned sentence);",
         "- **ours**: the statistic and its 95% interval as the run's page prints it;",
         "- **verdict**: held / failed / not decided under the protocol's rule; no rule where the protocol reads "
         "without a verdict (the reading in brackets); **not run** where the data are not committed yet, with the "
         "command that writes them: the row fills in when they are committed and `make results` runs;",
         "- **command**: the command recorded in the data's manifest, at the commit it ran from.", "",
         f"Rows: {len(rows)}; {_counts(rows)}.", "",
         "| id | sec. | model | claim | versions | ours [95% CI] | verdict | data | command (commit) |",
         "|---|---|---|---|---|---|---|---|---|"]
    for rule, model, stat, verdict, cell, command in rows:
        L.append(f"| {rule.id} | {rule.section} | {SHOWN.get(model, model)} | {rule.claim} | {_versions(rule)} | "
                 f"{stat} | {verdict} | {cell} | {command} |")
    if others:
        L += ["", "The same rules on other texts or window lengths, each its own run (their verdicts are in the "
              "verdict table of [Results](../results.md#verdicts-under-the-protocol)): "
              + ", ".join(f"[{s}]({s}.md)" for s in others) + "."]
    return "\n".join(L)
