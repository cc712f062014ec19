"""The accuracy study's measuring step (``python -m studies run claims --settings accuracy``,
protocol sec. 9.4): an offline multiple-choice suite cut from the three held-out texts, scored
under each edit, written per item as ``docs/results/data/accuracy_<model>.*``.

Cloze items are read from one forward per batch of windows and setting, continuation items from
their own short forwards (four per item); both unembed only the positions they read
(``tl_directional.model.handle.logits_at``), checked once per run against the full forward.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

from studies import common
from studies.claims.data import csv_bytes
from studies.claims.run import (
    SOURCES,
    TEXTS,
    amend_settings,
    layer_sets,
    run_header,
    settings_manifest,
)
from studies.runner import WindowStudy, run_windows, window_batches

#: the suite's fixed parameters (protocol sec. 9.4); part of every manifest
SUITE = {
    "seed": 0,
    "cloze_per_window": 64,
    "frequency_bands": 8,
    "continuation_per_window": 2,
    "context_len": 32,
    "continuation_len": 16,
    # sec. 9.7 (the suite made fair): a hard twin of every cloze item, the page's statistic and bootstrap
    "hard_distractors": "unedited model's top wrong tokens (ranks 2-4)",
    "average": "macro over text x kind",
    "bootstrap": "window-cluster",
}
#: protocol sec. 9.4's settings, by their labels in ``claims_run.amend_settings`` (resid-MLP added)
ACCURACY_SETTINGS = (
    *(
        f"value-exclusive{form} {ls} s_par={s}"
        for s in ("0", "0.5")
        for form in ("-joint", "")
        for ls in ("all", "skip0")
    ),
    "value-full-joint skip0 s_par=0",
    "value-full-joint skip0 s_par=0.5",
    "resid-attn skip0 s_par=0",
    "resid-mlp skip0 s_par=0",
    "hard-diag skip0",
)


def accuracy_settings(model, sites):
    """Sec. 9.4's grid as ``[(label, family, space, s_par, s_perp, context factory)]``: the amend
    grid's edits (the paper's joint form beside per head, its layer conventions), with full
    aggregate, residual and hard diagonal removal on the benchmarks' convention (all but layer 0)."""
    import tl_directional as tld

    amend = {s[0]: s for s in amend_settings(model, sites)}
    skip0 = layer_sets(sites.n_layers)["skip0"]
    amend["resid-mlp skip0 s_par=0"] = (
        "resid-mlp skip0 s_par=0",
        "amend",
        "resid-mlp",
        0.0,
        "1",
        lambda: tld.apply_edits(model, tld.ResidualScale("mlp", s_par=0.0, layers=skip0)),
    )
    return [(*amend[lab][:1], "accuracy", *amend[lab][2:]) for lab in ACCURACY_SETTINGS]


def _header(args, sites, commit, dirty):
    if args.model in SOURCES:
        return run_header("accuracy", args, sites, commit, dirty)
    return {
        "study": "accuracy",
        "command": common.invocation("python -m studies run claims --settings accuracy"),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": {"name": args.model, "source_sha256": None, "n_layers": sites.n_layers},
    }


def build_suite(model, text_name: str, path: Path, windows, suite: dict):
    """The items of one text: cloze items over ``windows`` (``[n, seq]``) with bands from the
    whole text's token stream under the model's tokenizer, and continuation items."""
    from tl_directional.evaluate.suites.accuracy import (
        build_cloze_items,
        build_continuation_items,
        frequency_bands,
    )

    stream = model.tokenizer(path.read_text(encoding="utf-8"), add_special_tokens=False)[
        "input_ids"
    ]
    bands = frequency_bands(stream, suite["frequency_bands"])
    cloze = build_cloze_items(
        windows, bands, text=text_name, per_window=suite["cloze_per_window"], seed=suite["seed"]
    )
    cont = build_continuation_items(
        windows,
        text=text_name,
        per_window=suite["continuation_per_window"],
        context_len=suite["context_len"],
        continuation_len=suite["continuation_len"],
        seed=suite["seed"],
    )
    return cloze, cont


class AccuracyRun(WindowStudy):
    """Protocol sec. 9.4 on one model: per text, the suite's cloze and continuation items scored
    under the baseline and each setting; data ``accuracy_<model>.{records.csv,items.json}``."""

    prefix = "accuracy"
    texts = TEXTS
    unit = "items"
    record_commits = False

    def __init__(self, args):
        super().__init__(args)
        self.rows: list[dict] = []
        self.items: list[dict] = []

    def header(self) -> dict:
        r = self.run
        return _header(self.args, r.sites, r.commit, r.dirty) | {
            "windows": self.args.windows, "seq_len": self.args.seq_len, "suite": SUITE, "texts": {},
            "complete": False, "files": {}}

    def prepare(self) -> int | None:
        self.sets = accuracy_settings(self.run.model, self.run.sites)
        self.labels = ["baseline"] + [s[0] for s in self.sets]
        self.manifest["settings"] = settings_manifest(self.sets)
        return None

    def resume(self, stem: str) -> str | None:
        import pandas as pd

        old = json.loads((self.data / f"{stem}.manifest.json").read_text())
        for key in ("windows", "seq_len", "suite"):
            if old[key] != self.manifest[key]:
                return f"was run with {key}={old[key]}, this run has {self.manifest[key]}; use the same options or another --tag"
        if [s["label"] for s in old["settings"]] != self.labels[1:]:
            return "holds other settings; use another --tag"
        self.manifest["texts"] = old["texts"]
        self.rows = pd.read_csv(self.data / f"{stem}.records.csv").to_dict("records")
        self.items = json.loads((self.data / f"{stem}.items.json").read_text())
        return None

    def _edits(self):
        return [("baseline", None)] + [(s[0], s[-1]) for s in self.sets]

    def _scorer_check(self, text, i, part, its, ch) -> int | None:
        # the scored-positions path against the full forward, once per run
        import torch

        from tl_directional.evaluate.suites.accuracy import cloze_choice_logits

        full = cloze_choice_logits(self.run.model(part), its, window_offset=i)
        err = float((full - ch).abs().max())
        self.manifest["scorer_check"] = {"text": text, "windows": [i, i + part.shape[0] - 1],
                                         "max_abs_logit_difference": err,
                                         "same_choices": bool(torch.equal(full.argmax(-1), ch.argmax(-1)))}
        if err > 1e-3 * (float(full.abs().max()) + 1.0):
            print(f"error: scored-positions logits differ from the full forward by {err:.3g}", file=sys.stderr)
            return 2
        return None

    def _hard_twins(self, part, its, i):
        # sec. 9.7: the unedited model's top-4 at each item's position, one scored-rows forward
        import torch

        from tl_directional.evaluate.suites.accuracy import hard_cloze_items
        from tl_directional.model.handle import logits_at

        b = torch.tensor([it.window - i for it in its], dtype=torch.long)
        p = torch.tensor([it.position for it in its], dtype=torch.long)
        ranked = logits_at(self.run.model, part, b, p).topk(4, dim=-1).indices.cpu()
        return hard_cloze_items(its, ranked, seed=SUITE["seed"])

    def _score_cloze(self, text, batch, cloze, correct, spent, t1, hard: list) -> int | None:
        import torch

        from tl_directional.evaluate.suites.accuracy import cloze_choices

        model = self.run.model
        for i, window_part in window_batches(batch, self.args.batch_size, t1, what="cloze windows"):
            part = window_part.tokens
            its = [it for it in cloze if i <= it.window < i + part.shape[0]]
            twins = self._hard_twins(part, its, i)
            hard += twins
            for lab, make in self._edits():
                ts = time.time()
                with make() if make is not None else contextlib.nullcontext():
                    ch = cloze_choices(model, part, its + twins, window_offset=i)
                right = (ch.argmax(-1) == torch.tensor([it.answer for it in its + twins])).long().tolist()
                correct[lab] += right[:len(its)]
                correct[lab + " hard"] += right[len(its):]
                spent[lab] += time.time() - ts
                if make is None and "scorer_check" not in self.manifest:
                    if (rc := self._scorer_check(text, i, part, its + twins, ch)) is not None:
                        return rc
        return None

    def _score_continuation(self, cont, correct, spent) -> None:
        import torch

        from tl_directional.evaluate.suites.accuracy import (
            continuation_choice_scores,
            continuation_requests,
            loglikelihoods,
        )

        reqs = continuation_requests(cont)
        for lab, make in self._edits():
            ts = time.time()
            with make() if make is not None else contextlib.nullcontext():
                lls = loglikelihoods(self.run.model, reqs, batch_size=self.args.batch_size)
            sc = continuation_choice_scores(lls, cont)
            correct[lab] += (sc.argmax(-1) == torch.tensor([it.answer for it in cont])).long().tolist()
            spent[lab] += time.time() - ts

    def measure_text(self, text: str, batch) -> dict | int:
        cloze, cont = build_suite(self.run.model, text, common.ROOT / TEXTS[text][1], batch.tokens, SUITE)
        t1 = time.time()
        print(f"{text}: {len(batch)} windows, {len(cloze)} cloze + {len(cont)} continuation items, "
              f"{len(self.labels)} settings", flush=True)
        correct = {lab: [] for lab in self.labels} | {lab + " hard": [] for lab in self.labels}
        spent = dict.fromkeys(self.labels, 0.0)  # seconds per setting, for planning runs
        hard: list = []
        if (rc := self._score_cloze(text, batch, cloze, correct, spent, t1, hard)) is not None:
            return rc
        self._score_continuation(cont, correct, spent)
        print(f"  continuation items done ({time.time() - t1:.0f} s)", flush=True)
        # rows: the random cloze items, their hard twins (sec. 9.7), the continuation items
        scored = {lab: correct[lab][:len(cloze)] + correct[lab + " hard"] + correct[lab][len(cloze):]
                  for lab in self.labels}
        for k, it in enumerate([*cloze, *hard, *cont]):
            self.rows.append({"text": text, "item": k, "kind": it.to_json()["kind"], "window": it.window,
                              **{lab: scored[lab][k] for lab in self.labels}})
            self.items.append(it.to_json())
        return {"cloze_items": len(cloze), "hard_cloze_items": len(hard), "continuation_items": len(cont),
                "seconds": round(time.time() - t1, 1),
                "setting_seconds": {lab: round(v, 1) for lab, v in spent.items()}}

    def files(self) -> dict[str, bytes]:
        import pandas as pd

        stem = self.stem()
        return {f"{stem}.records.csv": csv_bytes(pd.DataFrame(self.rows)),
                f"{stem}.items.json": (json.dumps(self.items, separators=(",", ":")) + "\n").encode()}

    def count(self) -> int:
        return len(self.rows)


def run_accuracy(args) -> int:
    """Measure protocol sec. 9.4's suite (``--settings accuracy`` of the claims command line)."""
    return run_windows(AccuracyRun(args))
