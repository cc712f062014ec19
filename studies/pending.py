"""``python -m studies pending``: the data the closing table (:mod:`studies.claims_table`) reads that
are not committed yet, or committed incomplete, each with the command that writes or continues it.

Why: the machines these runs use are fresh at each session, and a long run (a RULER length, a
pass8m task, an atlas text) keeps only what it committed. The runners resume from the committed
data (``--resume``: by text or length; pass8m: by the task records in
``docs/results/data/pass8m-tasks/``), so this list is a new machine's queue: run its commands,
commit what they write, and run ``python -m studies build``.

Each entry is ``(stem, state, command)``:

* ``not run``: no manifest of any of the source's stems; the command is the closing table's plan
  (with its note, e.g. RULER's CPU design);
* ``incomplete``: a manifest with ``"complete": false``; the state names the parts it holds (texts
  or lengths), the command is the manifest's own, with ``--resume`` added where the runner takes it;
* sec. 15's six-seed extension while its collected manifest is absent: the state counts the task
  records kept under ``pass8m-tasks/`` against the tasks its rule needs (the rate check and seeds
  3-5; V-Para's seeds 0-2 at its own rate once the check has chosen a rate other than the shared one),
  and once collected in part (``"complete": false``) the same count, the kept records not collected
  yet named; the command is the closing table's plan (run the rest, then collect).
"""

from __future__ import annotations

import json
from pathlib import Path

from studies.claims_table import RULES, SHOWN, SOURCES, committed_stem
from studies.pass_training.run import LR_CANDIDATES
from studies.pass_training.seeds6 import LR_VARIANT, lr_tasks, rate_tasks, seed_tasks
from studies.pass_training.stats import best_lr
from studies.runner import DATA

#: where sec. 10 / sec. 15 keep each finished task's record (a fresh machine resumes from these)
TASKS = "pass8m-tasks"
#: the runners whose command line takes ``--resume`` (the window studies and the RULER probe)
RESUMABLE = ("python -m studies run claims", "python -m studies run ruler-probe")


def _kept(data: Path, task: str) -> dict | None:
    path = data / TASKS / f"{task}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _seeds6_state(data: Path, uncollected: list[str] | None = None) -> str:
    """How many of sec. 15's tasks have a kept record (``data / TASKS / <task>.json``): the rate
    check and seeds 3-5, and, once the check's three rates are kept and its best is not sec. 10's
    shared rate (``lr.json``), V-Para's seeds 0-2 at its own rate. ``uncollected``: the ``missing``
    list of a manifest collected in part (None: nothing collected yet); kept records it lacks are
    named, since the page reads only what was collected."""
    wanted = lr_tasks() + seed_tasks()
    losses = {lr: r["final_val_loss"] for lr in LR_CANDIDATES if (r := _kept(data, f"lr-{LR_VARIANT}-{lr:g}"))}
    if len(losses) == len(LR_CANDIDATES) and (shared := _kept(data, "lr")):
        wanted += rate_tasks(best_lr(losses), shared["lr"])
    kept = [t for t in wanted if _kept(data, t) is not None]
    missing = [t for t in wanted if t not in kept]
    state = f"{len(kept)} of {len(wanted)} tasks kept in {TASKS}/" + (f" (missing: {', '.join(missing)})"
                                                                     if missing else "")
    if uncollected is None:
        return "not collected: " + state
    stale = [t for t in kept if t in uncollected]
    return "collected in part: " + state + (f"; kept, not collected yet: {', '.join(stale)}" if stale else "")


def _resume(command: str, done: list[str] = ()) -> str:
    """``command`` with ``--resume`` where its runner takes it and it is not there yet, less a
    ``--lengths`` / ``--texts`` selection that ``done`` (the manifest's finished parts) already
    holds whole: the run that wrote the manifest ran only those, and resumed as written it would
    do nothing."""
    words = command.split()
    for opt, prefix in (("--lengths", "len"), ("--texts", "")):
        if opt in words:
            i = words.index(opt)
            j = next((k for k in range(i + 1, len(words)) if words[k].startswith("--")), len(words))
            if all(f"{prefix}{w}" in done for w in words[i + 1:j]):
                words = words[:i] + words[j:]
    command = " ".join(words)
    if "--resume" in words or not any(r in command for r in RESUMABLE):
        return command
    return command + " --resume"


def pending(data: Path = DATA) -> list[tuple[str, str, str]]:
    """``[(stem, state, command)]`` for every (source, model) of the closing table whose data under
    ``data`` are missing or incomplete, in :data:`studies.claims_table.SOURCES`' order."""
    out = []
    for name, source in SOURCES.items():
        for model in dict.fromkeys(m for r in RULES if r.source == name for m in r.models):
            key = "" if model in SHOWN else model
            stem = committed_stem(source, key, data)
            if stem is None:
                plan = source.plan.format(model=model)
                note = (" " + source.note.format(model=model)) if source.note else ""
                state = _seeds6_state(data) if name == "seeds6" else "not run"
                out.append((source.stems[0].format(model=key), state, plan + note))
                continue
            manifest = json.loads((data / f"{stem}.manifest.json").read_text())
            if manifest.get("complete", True) is not False:
                continue
            if name == "seeds6":
                out.append((stem, _seeds6_state(data, manifest.get("missing", [])),
                            source.plan.format(model=model)))
            else:
                parts = list(manifest.get("texts", {})) or ["nothing"]
                # a part stopped between its own steps (the runner's checkpoint): resumed from there
                partly = "".join(f"; {t} in part" for t in manifest.get("partial", {}))
                out.append((stem, f"incomplete (holds: {', '.join(parts)}{partly})",
                            _resume(manifest["command"], list(manifest.get("texts", {})))))
    return out


def main(data: Path = DATA) -> int:
    """Print :func:`pending`'s entries, one block each; 0 (nothing pending prints one line)."""
    rows = pending(data)
    if not rows:
        print("nothing pending: every source of the closing table has complete data")
        return 0
    for stem, state, command in rows:
        print(f"{stem}: {state}")
        for step in command.split(", then "):
            print(f"    {step}")
    print(f"{len(rows)} pending; commit what a command writes, then `python -m studies build`")
    return 0
