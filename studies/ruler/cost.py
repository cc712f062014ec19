"""The per-item cost of protocol sec. 13's scoring, for planning a design (sec. 13.8):
``python -m studies.ruler.cost --model smollm2-135m`` times, at each of sec. 13.1's lengths, the
items of the main design's first haystack (seed 0; the easiest rungs: the cost is the length's,
not the task's) under the unedited model and the heaviest edit's hooks (joint exclude-self at
0.5), scored by the shared-prefix path (TransformerLens 2) and, at the lengths of ``--batched``,
by sec. 13.6's batched path too. Reports process CPU seconds (one torch thread; on a shared
machine the wall clock also counts other processes) per item and setting, as JSON on stdout."""

from __future__ import annotations

import argparse
import json
import time

import torch

from studies import common
from studies.claims.run import TEXTS
from studies.realrun import load, set_threads
from studies.ruler.items import LENGTHS, make_items
from studies.ruler.run import FILLER, ruler_settings
from studies.ruler.score import item_requests, shared_prefix_loglikelihoods, shared_prefix_supported
from tl_directional.evaluate.suites.accuracy import loglikelihoods
from tl_directional.model.sites import resolve_sites


def main(argv=None) -> int:
    r = argparse.ArgumentParser(prog="python -m studies.ruler.cost", description=__doc__.split("\n")[0])
    r.add_argument("--model", required=True)
    r.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    r.add_argument("--items", type=int, default=2, help="items timed per length (of the haystack's four)")
    r.add_argument("--batched", nargs="*", type=int, default=[512], help="lengths also timed on the batched path")
    args = r.parse_args(argv)
    set_threads(1)
    model, _ = load(args.model)
    if not shared_prefix_supported(model):
        print("error: the shared-prefix path needs TransformerLens 2 (run with .venv-legacy)")
        return 2
    tok = model.tokenizer
    bos = tok.bos_token_id if getattr(model.cfg, "default_prepend_bos", True) else None

    def encode(s: str) -> list[int]:
        return list(tok(s, add_special_tokens=False)["input_ids"])

    texts = [(common.ROOT / TEXTS[t][1]).read_text(encoding="utf-8") for t in FILLER]
    items = make_items(texts, lambda s: len(encode(s)) + (bos is not None), 0, 1, args.lengths, check=False)
    heavy = {s[0]: s[-1] for s in ruler_settings(model, resolve_sites(model, warn=False))}
    edit = heavy["value-exclusive-joint skip0 s_par=0.5"]
    out = {"model": args.model, "threads": torch.get_num_threads(), "unit": "CPU s per item and setting"}
    for n in args.lengths:
        part = [i for i in items if i.length == n][: args.items]
        reqs = [item_requests(encode, bos, i.prompt, i.choices) for i in part]
        row = {}
        for lab, ctx in (("shared-prefix baseline", None), ("shared-prefix edited", edit)):
            t = time.process_time()
            for q in reqs:
                with ctx() if ctx is not None else torch.no_grad():
                    shared_prefix_loglikelihoods(model, q)
            row[lab] = round((time.process_time() - t) / len(reqs), 2)
        if n in args.batched:
            t = time.process_time()
            for q in reqs:
                loglikelihoods(model, q, batch_size=4)
            row["batched baseline"] = round((time.process_time() - t) / len(reqs), 2)
        out[str(n)] = row
        print(json.dumps({str(n): row}), flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
