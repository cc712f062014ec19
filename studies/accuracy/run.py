"""The accuracy study's measuring step (``python scripts/claims.py run --settings accuracy``,
protocol sec. 9.4): an offline multiple-choice suite cut from the three held-out texts, scored
under each edit, written per item as ``docs/results/data/accuracy_<model>.*``.

Cloze items are read from one forward per batch of windows and setting, continuation items from
their own short forwards (four per item); both unembed only the positions they read
(``tl_directional.model.adapter.logits_at``), checked once per run against the full forward.
"""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

from studies import common

#: the suite's fixed parameters (protocol sec. 9.4); part of every manifest
SUITE = {
    "seed": 0,
    "cloze_per_window": 64,
    "frequency_bands": 8,
    "continuation_per_window": 2,
    "context_len": 32,
    "continuation_len": 16,
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
    from studies.claims.run import amend_settings, layer_sets

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


def _csv(df) -> bytes:
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.10g", lineterminator="\n")
    return buf.getvalue().encode()


def _header(args, sites, commit, dirty):
    if args.model in _common_sources():
        from studies.claims.run import run_header

        return run_header("accuracy", args, sites, commit, dirty)
    return {
        "study": "accuracy",
        "command": common.invocation("python -m studies run claims --settings accuracy"),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": {"name": args.model, "source_sha256": None, "n_layers": sites.n_layers},
    }


def _common_sources():
    from studies.claims.run import SOURCES

    return SOURCES


def build_suite(model, text_name: str, path: Path, windows, suite: dict):
    """The items of one text: cloze items over ``windows`` (``[n, seq]``) with bands from the
    whole text's token stream under the model's tokenizer, and continuation items."""
    from tl_directional.evaluate.accuracy import (
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


def run_accuracy(args) -> int:
    import pandas as pd
    import torch
    from studies.realrun import protocol_windows, run_stem
    from studies.claims.run import TEXTS

    from tl_directional.evaluate.accuracy import (
        cloze_choice_logits,
        cloze_choices,
        continuation_choice_scores,
        continuation_requests,
        loglikelihoods,
    )
    from tl_directional.model.load import load_model
    from tl_directional.model.sites import resolve_sites

    commit, dirty = common.git_state()
    if (refused := common.refuse_dirty(dirty, args.allow_dirty)) is not None:
        return refused
    data = Path(args.data_dir) if args.data_dir else common.ROOT / "docs" / "results" / "data"
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(args.model)
    sites = resolve_sites(model, warn=False)
    stem = run_stem("accuracy", args)
    manifest = _header(args, sites, commit, dirty) | {
        "windows": args.windows,
        "seq_len": args.seq_len,
        "suite": SUITE,
        "texts": {},
        "complete": False,
        "files": {},
    }
    sets = accuracy_settings(model, sites)
    labels = ["baseline"] + [s[0] for s in sets]
    rows, items = [], []
    mpath = data / f"{stem}.manifest.json"
    if args.resume and mpath.is_file():
        old = json.loads(mpath.read_text())
        for key in ("windows", "seq_len", "suite"):
            if old[key] != manifest[key]:
                print(
                    f"error: --resume: {stem} was run with {key}={old[key]}, this run has {manifest[key]}; "
                    "use the same options or another --tag",
                    file=sys.stderr,
                )
                return 2
        if [s["label"] for s in old["settings"]] != labels[1:]:
            print(
                f"error: --resume: {stem} holds other settings; use another --tag", file=sys.stderr
            )
            return 2
        manifest["texts"] = old["texts"]
        rows = pd.read_csv(data / f"{stem}.records.csv").to_dict("records")
        items = json.loads((data / f"{stem}.items.json").read_text())
        print(f"resuming {stem}: keeping {', '.join(old['texts'])}", flush=True)
    from studies.claims.run import settings_manifest

    manifest["settings"] = settings_manifest(sets)
    for text in args.texts:
        if text in manifest["texts"]:
            continue
        desc, rel = TEXTS[text]
        path = common.ROOT / rel
        if (batch := protocol_windows(model, text, rel, args)) is None:
            return 2
        cloze, cont = build_suite(model, text, path, batch.tokens, SUITE)
        t1 = time.time()
        print(
            f"{text}: {len(batch)} windows, {len(cloze)} cloze + {len(cont)} continuation items, "
            f"{len(labels)} settings",
            flush=True,
        )
        correct = {lab: [] for lab in labels}
        spent = dict.fromkeys(labels, 0.0)  # seconds per setting, for planning runs
        for i in range(0, len(batch), args.batch_size):
            part = batch.tokens[i : i + args.batch_size]
            its = [it for it in cloze if i <= it.window < i + part.shape[0]]
            for lab, make in [("baseline", None)] + [(s[0], s[-1]) for s in sets]:
                ts = time.time()
                if make is None:
                    ch = cloze_choices(model, part, its, window_offset=i)
                else:
                    with make():
                        ch = cloze_choices(model, part, its, window_offset=i)
                correct[lab] += (
                    (ch.argmax(-1) == torch.tensor([it.answer for it in its])).long().tolist()
                )
                spent[lab] += time.time() - ts
                if make is None and "scorer_check" not in manifest:
                    # the scored-positions path against the full forward, once per run
                    full = cloze_choice_logits(model(part), its, window_offset=i)
                    err = float((full - ch).abs().max())
                    manifest["scorer_check"] = {
                        "text": text,
                        "windows": [i, i + part.shape[0] - 1],
                        "max_abs_logit_difference": err,
                        "same_choices": bool(torch.equal(full.argmax(-1), ch.argmax(-1))),
                    }
                    if err > 1e-3 * (float(full.abs().max()) + 1.0):
                        print(f"error: scored-positions logits differ from the full forward by {err:.3g}",
                              file=sys.stderr)
                        return 2
            print(
                f"  cloze windows {i}-{i + part.shape[0] - 1} done ({time.time() - t1:.0f} s)",
                flush=True,
            )
        reqs = continuation_requests(cont)
        for lab, make in [("baseline", None)] + [(s[0], s[-1]) for s in sets]:
            ts = time.time()
            if make is None:
                lls = loglikelihoods(model, reqs, batch_size=args.batch_size)
            else:
                with make():
                    lls = loglikelihoods(model, reqs, batch_size=args.batch_size)
            sc = continuation_choice_scores(lls, cont)
            correct[lab] += (
                (sc.argmax(-1) == torch.tensor([it.answer for it in cont])).long().tolist()
            )
            spent[lab] += time.time() - ts
        print(f"  continuation items done ({time.time() - t1:.0f} s)", flush=True)
        for k, it in enumerate([*cloze, *cont]):
            rows.append(
                {
                    "text": text,
                    "item": k,
                    "kind": it.to_json()["kind"],
                    "window": it.window,
                    **{lab: correct[lab][k] for lab in labels},
                }
            )
            items.append(it.to_json())
        manifest["texts"][text] = {
            "description": desc,
            "file": rel,
            "sha256": common.sha256_bytes(path.read_bytes()),
            "windows": len(batch),
            "cloze_items": len(cloze),
            "continuation_items": len(cont),
            "seconds": round(time.time() - t1, 1),
            "setting_seconds": {lab: round(v, 1) for lab, v in spent.items()},
            "commit": manifest["commit"],
            "command": manifest["command"],
        }
        manifest["seconds"] = round(time.time() - t0, 1)
        manifest["complete"] = set(args.texts) <= set(manifest["texts"])
        files = {
            f"{stem}.records.csv": _csv(pd.DataFrame(rows)),
            f"{stem}.items.json": (json.dumps(items, separators=(",", ":")) + "\n").encode(),
        }
        common.write_data(data, files, manifest, f"{stem}.manifest.json")
        print(f"wrote {data / stem}.* ({len(rows)} items)", flush=True)
    return 0
