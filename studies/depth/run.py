"""Claim D's measuring step (protocol sec. 7): per (text, window, layer, component) sums of
abs cos(u_t, r_t) (the paper's E|cos| depth profile) and of the anisotropy control abs cos(u_t,
r'_t), r' the same layer's reference of another window at the same position, written to
``docs/results/data/depth_<model>.{records.csv,manifest.json}``; refuses a dirty tree.

    python -m studies run depth --model smollm2-135m --windows 32 --batch-size 8
"""

from __future__ import annotations

import os
import sys
import time

from studies import common
from studies.claims import data as D
from studies.claims import run as claims_run
from studies.runner import WindowStudy, run_windows, window_batches

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = common.ROOT

COMPONENTS = ("attn", "mlp")


class DepthRun(WindowStudy):
    """Protocol sec. 7 on one model: per window, layer and component, the sums of abs cos(u_t, r_t)
    and of the control's abs cos(u_t, r'_t); written once, when every text is measured."""

    texts = claims_run.TEXTS
    text_provenance = False
    record_commits = False
    write_each_text = False

    def __init__(self, args):
        super().__init__(args)
        self.data = D.DATA
        self.records: list[dict] = []

    def check(self) -> int | None:
        if self.args.batch_size < 2:
            print("error: --batch-size must be >= 2 (the control pairs windows of one batch)", file=sys.stderr)
            return 2
        return None

    def stem(self) -> str:
        return f"depth_{self.args.model}"

    def header(self) -> dict:
        args, r = self.args, self.run
        return claims_run.run_header("depth", args, r.sites, r.commit, r.dirty) | {
            "windows": args.windows, "seq_len": args.seq_len, "batch_size": args.batch_size, "texts": {},
            "complete": False, "files": {}}

    def windows(self, text: str, rel: str):
        from tl_directional.model.inputs import load_text_sequences

        args = self.args
        batch = load_text_sequences(self.run.model, str(ROOT / rel), max_sequences=args.windows, seq_len=args.seq_len)
        if len(batch) < args.windows or args.windows % args.batch_size:
            print(f"error: text {text} gives {len(batch)} windows; --windows must be a multiple of "
                  f"--batch-size and available", file=sys.stderr)
            return None
        return batch

    def measure_text(self, text: str, batch) -> dict | int:
        units = [u for c in COMPONENTS for u in self.run.sites.units.get(c, [])]
        names = {u.update_hook for u in units} | {u.reference_hook for u in units}
        t1 = time.time()
        for i, part in window_batches(batch, self.args.batch_size, t1, prefix=f"{text}: "):
            _, cache = self.run.model.run_with_cache(part.tokens, attention_mask=part.attention_mask,
                                                     names_filter=lambda n: n in names)
            mask = part.attention_mask.bool().clone()
            mask[:, 0] = False  # BOS excluded: the attention sink's stream is another object
            for u in units:
                self.records += _unit_records(text, i, u, cache, mask)
            del cache
        return {"seconds": round(time.time() - t1, 1)}

    def files(self) -> dict[str, bytes]:
        import pandas as pd

        return {f"{self.stem()}.records.csv": D.csv_bytes(pd.DataFrame(self.records))}

    def count(self) -> int:
        return len(self.records)


def _unit_records(text: str, first: int, u, cache, mask) -> list[dict]:
    """One record per window of one batch for site unit ``u``: abs cos(u_t, r_t) over the masked
    positions and the control's, which pairs window w with window w + 1 at the same position."""
    both = mask & mask.roll(-1, 0)
    upd, ref = cache[u.update_hook].double(), cache[u.reference_hook].double()
    if u.update_is_difference:
        upd = upd - ref
    un, rn = upd.norm(dim=-1), ref.norm(dim=-1)
    ok = (un > 0) & (rn > 0)
    cos = (upd * ref).sum(-1) / (un * rn).clamp_min(1e-300)
    ref_c = ref.roll(-1, 0)
    cos_c = (upd * ref_c).sum(-1) / (un * ref_c.norm(dim=-1)).clamp_min(1e-300)
    m, mc = mask & ok, both & ok & (ref_c.norm(dim=-1) > 0)
    return [{"text": text, "window": first + j, "layer": u.layer, "component": u.component,
             "tokens": int(m[j].sum()), "abs_cos": float(cos[j][m[j]].abs().sum()),
             "control_tokens": int(mc[j].sum()), "abs_cos_control": float(cos_c[j][mc[j]].abs().sum()),
             "cos": float(cos[j][m[j]].sum())} for j in range(mask.shape[0])]


def run(args) -> int:
    """Measure the depth profile of ``args`` (the depth command line) on its model."""
    return run_windows(DepthRun(args))
