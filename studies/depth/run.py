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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = common.ROOT

from studies.claims import data as D
from studies.claims import run as claims_run

COMPONENTS = ("attn", "mlp")


def run(args) -> int:
    import pandas as pd
    import torch

    from tl_directional.model.inputs import load_text_sequences
    from tl_directional.model.load import load_model
    from tl_directional.model.sites import resolve_sites

    commit, dirty = common.git_state()
    if (refused := common.refuse_dirty(dirty, args.allow_dirty)) is not None:
        return refused
    if args.batch_size < 2:
        print("error: --batch-size must be >= 2 (the control pairs windows of one batch)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(args.model)
    sites = resolve_sites(model, warn=False)
    units = [u for c in COMPONENTS for u in sites.units.get(c, [])]
    names = {u.update_hook for u in units} | {u.reference_hook for u in units}
    stem = f"depth_{args.model}"
    manifest = claims_run.run_header("depth", args, sites, commit, dirty)
    manifest.update({
        "windows": args.windows,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "texts": {},
        "complete": False,
        "files": {},
    })
    records = []
    for text in args.texts:
        desc, rel = claims_run.TEXTS[text]
        path = ROOT / rel
        batch = load_text_sequences(model, str(path), max_sequences=args.windows, seq_len=args.seq_len)
        if len(batch) < args.windows or args.windows % args.batch_size:
            print(f"error: text {text} gives {len(batch)} windows; --windows must be a multiple of "
                  f"--batch-size and available", file=sys.stderr)
            return 2
        t1 = time.time()
        for i in range(0, len(batch), args.batch_size):
            part = batch.slice(i, i + args.batch_size)
            _, cache = model.run_with_cache(part.tokens, attention_mask=part.attention_mask,
                                            names_filter=lambda n: n in names)
            mask = part.attention_mask.bool().clone()
            mask[:, 0] = False  # BOS excluded: the attention sink's stream is another object
            # the control pairs window w with window w + 1 of the batch at the same position
            both = mask & mask.roll(-1, 0)
            for u in units:
                upd = cache[u.update_hook].double()
                ref = cache[u.reference_hook].double()
                if u.update_is_difference:
                    upd = upd - ref
                un, rn = upd.norm(dim=-1), ref.norm(dim=-1)
                ok = (un > 0) & (rn > 0)
                cos = (upd * ref).sum(-1) / (un * rn).clamp_min(1e-300)
                ref_c = ref.roll(-1, 0)
                cos_c = (upd * ref_c).sum(-1) / (un * ref_c.norm(dim=-1)).clamp_min(1e-300)
                m = mask & ok
                mc = both & ok & (ref_c.norm(dim=-1) > 0)
                for j in range(part.tokens.shape[0]):
                    records.append({
                        "text": text, "window": i + j, "layer": u.layer, "component": u.component,
                        "tokens": int(m[j].sum()),
                        "abs_cos": float(cos[j][m[j]].abs().sum()),
                        "control_tokens": int(mc[j].sum()),
                        "abs_cos_control": float(cos_c[j][mc[j]].abs().sum()),
                        "cos": float(cos[j][m[j]].sum()),
                    })
            del cache
            print(f"{text}: windows {i}-{i + part.tokens.shape[0] - 1} done ({time.time() - t1:.0f} s)", flush=True)
        manifest["texts"][text] = {"description": desc, "file": rel, "sha256": common.sha256_bytes(path.read_bytes()),
                                   "windows": len(batch), "seconds": round(time.time() - t1, 1)}
    manifest["seconds"] = round(time.time() - t0, 1)
    manifest["complete"] = True
    write_records(stem, pd.DataFrame(records), manifest)
    return 0


def write_records(stem, rec, manifest):
    common.write_data(D.DATA, {f"{stem}.records.csv": D.csv_bytes(rec)}, manifest, f"{stem}.manifest.json")
    print(f"wrote {D.DATA / stem}.* ({len(rec)} records)", flush=True)


# ---------------------------------------------------------------------------
# build (pure function of the data)
# ---------------------------------------------------------------------------
