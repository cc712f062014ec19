"""Is the damage of an all-layer parallel removal at the first position (BOS, the attention sink)?

Re-runs the removals of ``studies/explore/scaling_sweep.py`` (s_par = 0, all layers) with the first
position spared (``positions=slice(1, None)``: METHOD sec. 4's mask; the paper's default
spares nothing), on the same windows, and compares them with the sweep's unspared numbers
per sequence (paired bootstrap: same windows, same baseline).

    python -m studies.explore.bos_check --model smollm2-135m --sweep-out results/real/sweep_smollm2-135m \\
        --out results/real/bos_smollm2-135m --page docs/results/bos_check_smollm2-135m.md

Reads ``SWEEP_OUT/seq_<text>.pt`` and ``SWEEP_OUT/meta.json`` (texts, window count, length).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from studies import common
from studies import realrun as R
from tl_directional import Setting  # noqa: E402
from tl_directional.edit import edits_for_space  # noqa: E402

SPACES = ["value", "resid-attn", "resid-mlp"]  # hard-diag leaves the BOS row unchanged anyway
SPARE = slice(1, None)  # every query position but the first (windows are BOS + text, no padding)


@dataclass(frozen=True)
class Spared:
    """A removal of one space on all layers, with the first position left unedited."""

    space: str

    @property
    def label(self) -> str:
        return f"{self.space}[s_par=0,BOS spared]"

    def edits(self):
        return edits_for_space(self.space, 0.0, 1.0, positions=SPARE)


def unspared_label(space: str) -> str:
    return Setting(space, 1.0 if space == "hard-diag" else 0.0, 1.0).label


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--sweep-out", required=True)
    ap.add_argument("--texts", nargs="+", default=None, help="subset of the sweep's texts (default: all)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/real/bos")
    ap.add_argument("--page", default=None)
    ap.add_argument("--keep-previous", default=None,
                    help="OUT directory of an earlier run: its rows for texts not run here are kept (with its "
                         "command and commit in the meta)")
    args = ap.parse_args(argv)
    R.set_threads(args.threads)
    t0 = time.time()
    sw = Path(args.sweep_out)
    smeta = json.loads((sw / "meta.json").read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, resolved = R.load(args.model)
    meta = R.provenance(model, args.model, resolved, out.parent)
    meta.update({"command": "python -m studies.explore.bos_check " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "sweep": str(sw), "sweep_commit": smeta["commit"], "seq_len": smeta["seq_len"], "texts": {},
                 "bootstrap": smeta["bootstrap"], "seed": smeta["seed"]})
    sets = [Spared(s) for s in SPACES]
    rows = []
    for text, info in smeta["texts"].items():
        if args.texts and text not in args.texts:
            continue
        batch = R.text_windows(model, text, info["sequences"], smeta["seq_len"])
        seq = R.per_sequence_sweep(model, batch, sets, args.batch_size, log=lambda m: print(m, flush=True))
        old = torch.load(sw / f"seq_{text}.pt")
        # the same windows: the baseline NLL per sequence must agree with the sweep's
        assert torch.allclose(seq["baseline"][:, 2], old["baseline"][:, 2], rtol=1e-4, atol=1e-3), "windows differ"
        w = R.bootstrap_weights(seq["baseline"].shape[0], smeta["bootstrap"], smeta["seed"])
        for s in SPACES:
            a, b = seq[Spared(s).label], old[unspared_label(s)]
            ra, rb = R.summarize(a, w), R.summarize(b, w)
            da = (w @ a)[:, 1] - (w @ a)[:, 2]
            db = (w @ b)[:, 1] - (w @ b)[:, 2]
            diff = (db - da) / (w @ a)[:, 0]  # share of the damage that sparing BOS removes, in nats
            rows.append({"text": text, "space": s, "tokens": ra["tokens"],
                         "unspared_delta_loss": rb["delta_loss"], "unspared_lo": rb["delta_loss_lo"],
                         "unspared_hi": rb["delta_loss_hi"], "spared_delta_loss": ra["delta_loss"],
                         "spared_lo": ra["delta_loss_lo"], "spared_hi": ra["delta_loss_hi"],
                         "bos_part": float(diff[0]), "bos_part_lo": float(torch.quantile(diff[1:], 0.025)),
                         "bos_part_hi": float(torch.quantile(diff[1:], 0.975))})
        meta["texts"][text] = {"sequences": len(batch), "tokens": rows[-1]["tokens"]}
    if args.keep_previous:
        pdir = Path(args.keep_previous)
        pmeta = json.loads((pdir / "meta.json").read_text())
        if pmeta["seq_len"] != smeta["seq_len"] or pmeta.get("sweep_commit") != smeta["commit"]:
            raise SystemExit(f"--keep-previous {pdir}: it ran against another sweep (commit "
                             f"{pmeta.get('sweep_commit')}, seq_len {pmeta['seq_len']}) than {sw}")
        old = pd.read_csv(pdir / "bos.csv")
        kept = [t for t in pmeta["texts"] if t not in meta["texts"]]
        rows = old[old.text.isin(kept)].to_dict("records") + rows
        meta["texts"] = {**{t: pmeta["texts"][t] for t in kept}, **meta["texts"]}
        meta["previous"] = {"command": pmeta["command"], "commit": pmeta["commit"], "texts": kept,
                            "seconds": pmeta["seconds"]}
    df = pd.DataFrame(rows)
    df.to_csv(out / "bos.csv", index=False)
    meta["seconds"] = time.time() - t0
    meta["tokens_total"] = sum(v["tokens"] for v in meta["texts"].values())
    reading = []
    for r in df.itertuples():
        share = r.bos_part / r.unspared_delta_loss if abs(r.unspared_delta_loss) > 1e-9 else float("nan")
        reading.append(f"- `{r.text}`, {r.space} removal: {r.unspared_delta_loss:+.4f} [{r.unspared_lo:+.4f}, "
                       f"{r.unspared_hi:+.4f}] nats with BOS edited, {r.spared_delta_loss:+.4f} [{r.spared_lo:+.4f}, "
                       f"{r.spared_hi:+.4f}] with BOS spared; the BOS edit accounts for {r.bos_part:+.4f} "
                       f"[{r.bos_part_lo:+.4f}, {r.bos_part_hi:+.4f}] ({share:.0%} of the damage).")
    meta["reading"] = reading
    R.write_json(out / "meta.json", meta)
    print("\n".join(reading))
    if args.page:
        page = Path(args.page)
        stem = page.stem
        L = [f"# BOS check: {meta['model']}", "", "**Reading (computed from the table below):**", ""] + reading + [
            "", f"Generated by `{meta['command']}` (commit `{meta['commit']}`, {meta['date']}, {meta['device']}, "
            f"{meta['seconds']:.0f} s), against the sweep run at commit `{meta['sweep_commit']}` "
            f"(same windows, checked by their baseline NLL)."
            + (f" Text(s) {', '.join(meta['previous']['texts'])}: from the earlier run `{meta['previous']['command']}` "
               f"(commit `{meta['previous']['commit']}`, {meta['previous']['seconds']:.0f} s)."
               if meta.get("previous") else ""), "",
            f"Model: `{meta['model']}` from `{meta['model_path']}` (model.safetensors sha256 "
            f"`{meta.get('model_safetensors_sha256', 'n/a')}`). Each removal is s_par = 0 on all layers (all heads); "
            "'BOS spared' leaves the first query position unedited (the windows are BOS + text, no padding). "
            f"Intervals: 95% paired bootstrap over sequences ({meta['bootstrap']} resamples).", ""]
        for t, i in meta["texts"].items():
            L.append(f"- text `{t}`: {i['sequences']} windows of {meta['seq_len']} tokens = {i['tokens']} predicted tokens.")
        L += ["", "| text | space | delta loss, BOS edited | delta loss, BOS spared | part due to the BOS edit |",
              "|---|---|---|---|---|"]
        for r in df.itertuples():
            L.append(f"| {r.text} | {r.space} | {r.unspared_delta_loss:+.4f} [{r.unspared_lo:+.4f}, {r.unspared_hi:+.4f}] | "
                     f"{r.spared_delta_loss:+.4f} [{r.spared_lo:+.4f}, {r.spared_hi:+.4f}] | "
                     f"{r.bos_part:+.4f} [{r.bos_part_lo:+.4f}, {r.bos_part_hi:+.4f}] |")
        L += ["", f"Table: [`{stem}.csv`]({stem}.csv); meta: [`{stem}.meta.json`]({stem}.meta.json).", ""]
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("\n".join(L))
        shutil.copy(out / "bos.csv", page.with_name(f"{stem}.csv"))
        shutil.copy(out / "meta.json", page.with_name(f"{stem}.meta.json"))
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    common.run_main(main)
