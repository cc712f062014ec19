"""Protocol sec. 13's measuring step (``python -m studies run ruler-probe``): the RULER-style items
(:mod:`studies.ruler.items`) scored under the unedited model and each of sec. 13.3's edits, one
length at a time through the one run pipeline (:func:`studies.runner.run_windows`; a length plays
the part of a text: the data and manifest are written after each length and, within a length, after
each setting (a checkpoint: the manifest's ``partial`` names the length's finished settings);
``--resume`` keeps finished lengths and a stopped length's finished settings, and the page reads
finished lengths only).

Two designs (sec. 13.1-13.2 and the amendment of sec. 13.6):

* ``--pilot``: seed 1, 10 haystacks at 512 tokens, every rung of every ladder (one
  ``make_items`` call per rung index; needle-single from the first), the unedited model only;
  data ``ruler-pilot_<model>.*``, whose manifest names the chosen rungs (``rungs``);
* the main run: seed 0, 40 haystacks at 256 / 512 / 1,024 / 2,048 tokens on the pilot's rungs
  (read from the pilot's committed manifest), the unedited model and the six edits; data
  ``ruler_<model>.*``;
* ``--design cpu`` (sec. 13.10): the main run's items, of which the first 30 haystacks at 256 /
  512 / 1,024 tokens and the first 10 at 2,048 are scored; data ``ruler-cpu_<model>.*``.

``--scorer shared-prefix`` (sec. 13.8, TransformerLens 2 only) runs each item's prompt once.

Each item's four candidates are scored by the summed log-likelihood of ``" " + candidate`` after
the prompt (:mod:`studies.ruler.score`), the forwards by
:func:`tl_directional.evaluate.suites.accuracy.loglikelihoods` (only the scored rows unembedded).
The records hold one row per item and setting: the four log-likelihoods, the choice and whether it
is right. The prompts are not stored: the items are a pure function of the design, the filler
files and the tokenizer, and the manifest holds each length's items' sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from studies import common
from studies.claims.data import csv_bytes
from studies.claims.run import SOURCES, TEXTS, amend_settings, run_header, settings_manifest
from studies.ruler.items import LADDERS, LENGTHS, TASKS, make_items
from studies.ruler.score import (
    chosen,
    item_requests,
    pick_rungs,
    shared_prefix_loglikelihoods,
    shared_prefix_supported,
)
from studies.runner import WindowStudy, run_windows

#: sec. 13.1's filler texts (sec. 1's ``kjv`` and ``prose``)
FILLER = ("kjv", "prose")
#: sec. 13.1-13.2's designs: the main items and the pilot's
MAIN = {"seed": 0, "haystacks": 40, "lengths": list(LENGTHS)}
PILOT = {"seed": 1, "haystacks": 10, "lengths": [512]}
#: sec. 13.10's CPU design: the main items (the same draws), of which the first ``scored[length]``
#: haystacks of each length are scored
CPU = MAIN | {"scored": {"256": 30, "512": 30, "1024": 30, "2048": 10}}
#: sec. 13.3's edits, by their labels in ``studies.claims.run.amend_settings`` (joint, skip0)
SETTINGS = (
    "value-exclusive-joint skip0 s_par=0",
    "value-exclusive-joint skip0 s_par=0.5",
    "value-full-joint skip0 s_par=0",
    "value-full-joint skip0 s_par=0.5",
    "hard-diag skip0",
    "resid-attn skip0 s_par=0.5",
)
#: the file whose sha256 each length's manifest entry carries: the items' generator
GENERATOR = "studies/ruler/items.py"


def ruler_settings(model, sites):
    """Sec. 13.3's six edits as ``[(label, family, space, s_par, s_perp, context factory)]``,
    built by the amendment grid of sec. 9.2 (the paper's joint form, every layer but the first)."""
    amend = {s[0]: s for s in amend_settings(model, sites)}
    return [amend[lab] for lab in SETTINGS]


def pilot_items(texts, count, design: dict) -> list:
    """The pilot's items: for each rung index ``r``, ``make_items`` with rung ``r`` of every ladder
    (seed, haystacks and lengths of ``design``); needle-single from ``r = 0`` only."""
    out = []
    for r in range(3):
        rung = {t: ladder[r] for t, ladder in LADDERS.items()}
        got = make_items(texts, count, design["seed"], design["haystacks"], design["lengths"], rung)
        out += [it for it in got if r == 0 or it.task != "needle-single"]
    return out


def rung_fits(texts, count, design: dict, shortest: int) -> dict[str, dict[int, bool]]:
    """Sec. 13.6: ``{task: {rung: whether its items fit shortest tokens}}``: none of the task's
    items of ``make_items`` at that length (the pilot's seed and haystacks, every task at that rung
    index) longer than ``shortest`` tokens by ``count`` (a rung whose statements alone overrun it)."""
    out: dict[str, dict[int, bool]] = {t: {} for t in LADDERS}
    for r in range(3):
        rung = {t: ladder[r] for t, ladder in LADDERS.items()}
        got = make_items(texts, count, design["seed"], design["haystacks"], [shortest], rung, check=False)
        for task in LADDERS:
            out[task][rung[task]] = all(count(i.prompt) <= shortest for i in got if i.task == task)
    return out


def items_sha256(items) -> str:
    """The sha256 of the items as JSON (prompt, choices, answer and labels), in order."""
    return hashlib.sha256(json.dumps([asdict(i) for i in items], separators=(",", ":")).encode()).hexdigest()


def tokenizer_sha256(tok) -> str | None:
    """The sha256 of a fast tokenizer's whole definition (vocabulary, merges, normalizer, pre- and
    post-processing), or None for a tokenizer that cannot serialise itself."""
    backend = getattr(tok, "backend_tokenizer", None)
    return hashlib.sha256(backend.to_str().encode()).hexdigest() if backend is not None else None


def cached_items(folder, key: dict, make) -> tuple[list, bool]:
    """``(make(), False)``, kept as JSON in ``folder`` under the sha256 of ``key`` (everything the
    items are a function of), or ``(the kept items, True)`` when a file for ``key`` holds them and
    their sha256 (:func:`items_sha256`) still matches; a missing, unreadable or altered file is
    rebuilt. Generation re-tokenises each prompt as it grows (minutes at 2,048 tokens), and a
    resumed run needs the same items again."""
    from studies.ruler.items import Item
    from tl_directional.io.atomic import atomic_write_bytes

    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    path = folder / f"{name}.json"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        kept = json.loads(path.read_text())
        items = [Item(**(d | {"choices": tuple(d["choices"])})) for d in kept["items"]]
        if kept["key"] == key and items_sha256(items) == kept["items_sha256"]:
            return items, True
    items = make()
    folder.mkdir(parents=True, exist_ok=True)
    body = {"key": key, "items_sha256": items_sha256(items), "items": [asdict(i) for i in items]}
    atomic_write_bytes(path, json.dumps(body).encode())
    return items, False


def pilot_accuracy(rows: list[dict]) -> dict[str, dict[int, float]]:
    """``{task: {rung: baseline accuracy}}`` of the pilot's records."""
    acc: dict[str, dict[int, list[int]]] = {}
    for r in rows:
        if r["setting"] == "baseline":
            acc.setdefault(r["task"], {}).setdefault(int(r["difficulty"]), []).append(int(r["correct"]))
    return {t: {d: sum(v) / len(v) for d, v in by.items()} for t, by in acc.items()}


class RulerRun(WindowStudy):
    """Protocol sec. 13 on one model; a length is the pipeline's text (see the module doc)."""

    prefix = "ruler"
    unit = "item scores"
    record_commits = False

    def __init__(self, args):
        super().__init__(args)
        self.design = dict(PILOT if args.pilot else CPU if getattr(args, "design", "full") == "cpu" else MAIN)
        if args.haystacks:  # smoke runs only (the manifest records the design)
            self.design["haystacks"] = args.haystacks
            if "scored" in self.design:
                self.design["scored"] = {n: min(h, args.haystacks) for n, h in self.design["scored"].items()}
        if args.smoke_lengths:
            if "scored" in self.design:  # each smoke length takes the count of the design's length in its place
                counts = list(self.design["scored"].values())
                self.design["scored"] = {str(n): counts[k] for k, n in enumerate(args.smoke_lengths)}
            self.design["lengths"] = list(args.smoke_lengths)
        self.texts = {f"len{n}": (f"sec. 13 items of {n} tokens (generator)", GENERATOR) for n in self.design["lengths"]}
        args.texts = [f"len{n}" for n in (args.lengths or self.design["lengths"])]
        self.rows: list[dict] = []

    def check(self) -> int | None:
        bad = [t for t in self.args.texts if t not in self.texts]
        if bad:
            print(f"error: --lengths {' '.join(t[3:] for t in bad)}: not in this design's lengths "
                  f"{self.design['lengths']}; pick from those", file=sys.stderr)
            return 2
        return None

    def complete_texts(self) -> list[str]:
        return list(self.texts)  # every length of the design, whichever this process runs

    def stem(self) -> str:
        kind = "ruler-pilot" if self.args.pilot else "ruler-cpu" if "scored" in self.design else "ruler"
        return f"{kind}_{self.args.model}" + (
            f"_{self.args.tag}" if self.args.tag else "")

    def header(self) -> dict:
        r, args = self.run, self.args
        if args.model in SOURCES:
            head = run_header("ruler-probe", args, r.sites, r.commit, r.dirty)
        else:  # the bundled model: smoke runs
            head = {"study": "ruler-probe", "command": common.invocation("python -m studies run ruler-probe"),
                    "commit": r.commit + ("+dirty" if r.dirty else ""),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "model": {"name": args.model, "source_sha256": None, "n_layers": r.sites.n_layers}}
        filler = {t: {"file": TEXTS[t][1], "sha256": common.sha256_bytes((common.ROOT / TEXTS[t][1]).read_bytes())}
                  for t in FILLER}
        return head | {"device": getattr(args, "device", "cpu"), "pilot": bool(args.pilot), "design": self.design, "filler": filler, "texts": {},
                       "complete": False, "files": {}}

    def _tokenizer(self):
        model = self.run.model
        tok = model.tokenizer
        bos = tok.bos_token_id if getattr(model.cfg, "default_prepend_bos", True) else None

        def encode(s: str) -> list[int]:
            return list(tok(s, add_special_tokens=False)["input_ids"])

        return encode, bos

    def _main_rungs(self) -> dict | int:
        path = self.data / f"ruler-pilot_{self.args.model}.manifest.json"
        if not path.is_file():
            print(f"error: {path} does not exist: run the pilot first (--pilot), sec. 13.2", file=sys.stderr)
            return 2
        pilot = json.loads(path.read_text())
        if not pilot.get("complete") or "rungs" not in pilot:
            print(f"error: {path} is incomplete: finish the pilot (--pilot --resume) first", file=sys.stderr)
            return 2
        self.manifest["pilot_manifest_sha256"] = common.sha256_bytes(path.read_bytes())
        return pilot["rungs"]

    def _main_items(self, texts: list[str], count, picked: dict[str, int]) -> list:
        """The main design's items on the pilot's rungs ``picked``, from the items cache
        (``--items-cache``; :func:`cached_items`, keyed by every input of ``make_items`` by content)
        unless it is ``none`` or the tokenizer cannot serialise itself."""
        d = self.design

        def make():
            return make_items(texts, count, d["seed"], d["haystacks"], d["lengths"], picked)

        tok_sha = tokenizer_sha256(self.run.model.tokenizer)
        where = getattr(self.args, "items_cache", "")
        if tok_sha is None or where == "none":
            return make()
        key = {"generator": common.sha256_bytes((common.ROOT / GENERATOR).read_bytes()),
               "filler": [common.sha256_bytes(t.encode()) for t in texts], "tokenizer": tok_sha,
               "bos": self.bos, "seed": d["seed"], "haystacks": d["haystacks"], "lengths": d["lengths"],
               "rungs": picked}
        items, hit = cached_items(Path(where) if where else common.cache_root() / "ruler-items", key, make)
        if hit:
            print("items read from the items cache (the same inputs, sha256 checked)", flush=True)
        return items

    def prepare(self) -> int | None:
        if self.args.scorer == "shared-prefix" and not shared_prefix_supported(self.run.model):
            print(f"error: --scorer shared-prefix: the model is a {type(self.run.model).__name__}; it needs "
                  f"TransformerLens 2's HookedTransformer (run with .venv-legacy) or --scorer batched",
                  file=sys.stderr)
            return 2
        self.manifest["scorer"] = self.args.scorer  # sec. 13.6 (batched) or 13.8 (shared-prefix)
        encode, bos = self._tokenizer()
        self.encode, self.bos = encode, bos

        def count(s: str) -> int:  # the tokens the forward sees: BOS and the prompt
            return len(encode(s)) + (bos is not None)

        texts = [(common.ROOT / TEXTS[t][1]).read_text(encoding="utf-8") for t in FILLER]
        t0 = time.time()
        if self.args.pilot:
            items, self.sets = pilot_items(texts, count, self.design), []
            self.fits = rung_fits(texts, count, self.design, min(self.args.smoke_lengths or MAIN["lengths"]))
            self.manifest["fits_shortest"] = {t: {str(d): v for d, v in by.items()} for t, by in self.fits.items()}
            try:  # the fit rule's refusal before any scoring, not after
                pick_rungs({t: dict.fromkeys(ladder, 0.0) for t, ladder in LADDERS.items()}, LADDERS, self.fits)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        else:
            rungs = self._main_rungs()
            if isinstance(rungs, int):
                return rungs
            self.manifest["rungs"] = rungs  # the pilot's choice, with its accuracy and floor (sec. 13.2)
            items = self._main_items(texts, count, {t: v["rung"] for t, v in rungs.items()})
            self.sets = ruler_settings(self.run.model, self.run.sites)
        self.items = {f"len{n}": [i for i in items if i.length == n] for n in self.design["lengths"]}
        self.manifest["items_sha256"] = {k: items_sha256(v) for k, v in self.items.items()}
        self.manifest["settings"] = settings_manifest(self.sets)
        print(f"{len(items)} items generated ({time.time() - t0:.0f} s)", flush=True)
        return None

    def resume(self, stem: str) -> str | None:
        import pandas as pd

        old = json.loads((self.data / f"{stem}.manifest.json").read_text())
        for key in ("design", "items_sha256", "settings", "filler", "scorer"):
            if old.get(key) != self.manifest.get(key):
                return f"was run with another {key}; use the same code and options or another --tag"
        self.manifest["texts"] = old["texts"]
        if old.get("partial"):  # lengths stopped between settings: their finished settings are kept
            self.manifest["partial"] = old["partial"]
        self.rows = pd.read_csv(self.data / f"{stem}.records.csv").to_dict("records")
        return None

    def windows(self, text: str, rel: str):
        scored = self.design.get("scored")  # sec. 13.10: the first haystacks of each length
        return [i for i in self.items[text] if scored is None or i.haystack < scored[str(i.length)]]

    def measure_text(self, text: str, batch) -> dict | int:
        from tl_directional.evaluate.suites.accuracy import loglikelihoods

        # a length a stopped run left between settings (checkpoint below): its finished settings'
        # rows are in self.rows already; their seconds carry over
        done = self.manifest.get("partial", {}).get(text, {})
        t1, spent = time.time() - done.get("seconds", 0.0), dict(done.get("setting_seconds", {}))
        if spent:
            print(f"  {text}: keeping {', '.join(spent)}", flush=True)
        reqs = [r for it in batch for r in item_requests(self.encode, self.bos, it.prompt, it.choices)]
        for lab, make in [("baseline", None)] + [(s[0], s[-1]) for s in self.sets]:
            if lab in spent:
                continue
            ts = time.time()
            with make() if make is not None else contextlib.nullcontext():
                if self.args.scorer == "shared-prefix":  # sec. 13.8: each item's prompt run once
                    lls = [v for k in range(0, len(reqs), 4)
                           for v in shared_prefix_loglikelihoods(self.run.model, reqs[k:k + 4]).tolist()]
                else:
                    lls = loglikelihoods(self.run.model, reqs, batch_size=self.args.batch_size).tolist()
            for k, it in enumerate(batch):
                four = lls[4 * k:4 * k + 4]
                pick = chosen(four)
                self.rows.append({"length": it.length, "haystack": it.haystack, "task": it.task,
                                  "difficulty": it.difficulty, "answer": it.answer, "setting": lab,
                                  **{f"ll{j}": v for j, v in enumerate(four)},
                                  "chosen": pick, "correct": int(pick == it.answer)})
            spent[lab] = round(time.time() - ts, 1)
            print(f"  {text} {lab}: {len(batch)} items ({time.time() - t1:.0f} s)", flush=True)
            if not self.args.pilot:  # a long length survives a stop: --resume keeps its settings so far
                self.checkpoint(text, {"setting_seconds": spent, "seconds": round(time.time() - t1, 1)})
        if self.args.pilot:
            acc = pilot_accuracy(self.rows)
            self.manifest["pilot_accuracy"] = {t: {str(d): a for d, a in by.items()} for t, by in acc.items()}
            try:  # a refusal here must not lose the scores: they are written, the main run refuses
                self.manifest["rungs"] = pick_rungs(acc, LADDERS, self.fits)
            except ValueError as e:
                self.manifest["rungs_error"] = str(e)
        return {"items": len(batch), "haystacks": len({it.haystack for it in batch}),
                "tasks": sorted({it.task for it in batch}, key=TASKS.index),
                "seconds": round(time.time() - t1, 1), "setting_seconds": spent}

    def files(self) -> dict[str, bytes]:
        import pandas as pd

        return {f"{self.stem()}.records.csv": csv_bytes(pd.DataFrame(self.rows))}

    def count(self) -> int:
        return len(self.rows)


def run(args) -> int:
    """Measure protocol sec. 13's pilot (``args.pilot``) or main items on ``args.model``."""
    return run_windows(RulerRun(args))
