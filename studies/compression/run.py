"""Claim 3's measuring step (``python -m studies run compression``): every compression
setting of the protocol's grid on the held-out windows, written after each setting to
``docs/results/data/compression_<model>.*``.

The data layout, its writer and the protocol constants are :mod:`studies.compression.layout`'s.
"""

from __future__ import annotations

import os
import sys
import time

from studies import common
from studies.compression.layout import (
    CALIB_PER_TEXT,
    CALIB_START,
    DATA,
    GRID,
    KEEP,
    LAYER_KEEP,
    ROOT,
    RUN_ORDER,
    SOURCES,
    TEXTS,
    UNITS,
    expected_source_sha,
    write_data,
)
from studies.compression.stats import SEED
from studies.runner import start

# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------


def window_nll(model, batch, batch_size):
    """Per-window sums of next-token NLL (float64) and predicted-token counts."""
    import torch

    from tl_directional.evaluate.sweeps import prediction_mask

    nll, cnt = [], []
    for i in range(0, len(batch), batch_size):
        part = batch.slice(i, i + batch_size)
        logits = model(part.tokens, attention_mask=part.attention_mask)
        lp = torch.log_softmax(logits[:, :-1].float(), -1)
        del logits
        m = prediction_mask(part.attention_mask)
        tok = -lp.gather(-1, part.tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
        nll.append((tok.double() * m).sum(-1))
        cnt.append(m.sum(-1).double())
    return torch.cat(nll), torch.cat(cnt)


def _check_windows(args) -> int | None:
    if args.windows > CALIB_START:
        print(f"error: --windows must be <= {CALIB_START} (calibration windows start there)", file=sys.stderr)
        return 2
    return None


def _model_info(args, sites) -> dict:
    """The manifest's ``model``: source file, quantisation, sha256s, size and lane."""
    src, quant, deq = SOURCES[args.model]
    info = {"name": args.model, "source_file": src, "quantisation": quant, "dequantised": deq,
            "source_sha256": expected_source_sha(args.model), "n_layers": sites.n_layers,
            "d_model": sites.d_model, "lane": sites.lane}
    if args.model != "default":
        from tl_directional.model.load.catalog import REAL_MODELS

        man = common.model_manifest(args.model)
        info["architecture"] = REAL_MODELS[args.model].architecture
        info["safetensors_sha256"] = man.get("files", {}).get("model.safetensors", {}).get("sha256")
    else:
        info["architecture"] = "GPT2LMHeadModel (4 layers, trained on KJV)"
    return info


def _cut_windows(model, args):
    """``(evaluation batch, calibration batch, texts' manifest entries, text per window, window
    number per window)``: each text's first ``args.windows`` windows and its calibration windows,
    or ``None`` after an ``error:`` line when a text is too short."""
    import torch

    from tl_directional.model.inputs import TokenBatch, load_text_sequences

    evals, calibs, texts_info, wtext, wwin = [], [], {}, [], []
    for text in args.texts:
        desc, rel = TEXTS[text]
        b = load_text_sequences(model, str(ROOT / rel), max_sequences=CALIB_START + CALIB_PER_TEXT,
                                seq_len=args.seq_len)
        if len(b) < CALIB_START + CALIB_PER_TEXT:
            print(f"error: text {text} gives only {len(b)} windows of {args.seq_len}", file=sys.stderr)
            return None
        evals.append(b.slice(0, args.windows))
        calibs.append(b.slice(CALIB_START, CALIB_START + CALIB_PER_TEXT))
        wtext += [text] * args.windows
        wwin += list(range(args.windows))
        texts_info[text] = {"description": desc, "file": rel, "sha256": common.sha256_bytes((ROOT / rel).read_bytes()),
                            "windows": args.windows}
    evalb = TokenBatch(torch.cat([b.tokens for b in evals]), torch.cat([b.attention_mask for b in evals]))
    calib = TokenBatch(torch.cat([b.tokens for b in calibs]), torch.cat([b.attention_mask for b in calibs]))
    return evalb, calib, texts_info, wtext, wwin


def run(args) -> int:
    """Measure every setting of the grid (or ``args.grid``) on ``args.model``, writing the data
    after each: the pipeline's opening (:func:`studies.runner.start`), then setting by setting
    (compress, held-out NLL, local geometry per window)."""
    import gc

    import pandas as pd
    import torch

    from tl_directional.compression import compression_geometry
    from tl_directional.compression.accumulate import STAT_INDEX
    from tl_directional.compression.compressors import collect_input_stats, compress

    started = start(args, lambda: _check_windows(args))
    if isinstance(started, int):
        return started
    commit, dirty, model, sites, t0 = started.commit, started.dirty, started.model, started.sites, started.t0
    stem = f"compression_{args.model}" + (f"_{args.tag}" if args.tag else "")
    model_info = _model_info(args, sites)
    if (cut := _cut_windows(model, args)) is None:
        return 2
    evalb, calib, texts_info, wtext, wwin = cut
    base_nll, counts = window_nll(model, evalb, args.batch_size)
    print(f"{args.model}: {len(evalb)} evaluation windows ({int(counts.sum())} predicted tokens), dense loss "
          f"{float(base_nll.sum() / counts.sum()):.4f}; calibration {len(calib)} windows", flush=True)
    stats = collect_input_stats(model, calib, batch_size=args.batch_size, n_samples=512, seed=SEED)
    order = [s for s in RUN_ORDER if s in set(args.grid or GRID)]
    manifest = {
        "study": "compression_claims",
        "command": common.invocation("python -m studies run compression"),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"CPU, {os.cpu_count()} cores shared, {args.threads} torch thread(s), torch {torch.__version__}",
        "model": model_info,
        "windows": args.windows,
        "seq_len": args.seq_len,
        "calibration": {"windows_per_text": CALIB_PER_TEXT, "first_window": CALIB_START,
                        "texts": list(args.texts), "tokens": int(calib.attention_mask.sum())},
        "geometry": "local mode, split against the dense update, BOS position excluded",
        "texts": texts_info,
        "grid": list(GRID),
        "run_order": order,
        "settings": [],
        "complete": False,
        "files": {},
    }
    records, layers = [], []
    for spec in order:
        t1 = time.time()
        res = compress(model, spec, calibration=calib, stats=stats)
        t_comp = time.time() - t1
        nll, _ = window_nll(res.model, evalb, args.batch_size)
        df = compression_geometry(model, res, evalb, mode="local", batch_size=args.batch_size, per_sequence=True,
                                  verify=False, exclude_first_token=True)
        per = next(iter(df.attrs["per_sequence"].values())).numpy()  # [n, rows, K]
        rows = df.attrs["rows"]
        label = res.record.label
        for i in range(len(evalb)):
            r = {"setting": label, "text": wtext[i], "window": wwin[i], "tokens": float(counts[i]),
                 "nll": float(nll[i]), "base_nll": float(base_nll[i])}
            for unit in UNITS:
                idx = [j for j, (_, u) in enumerate(rows) if u == unit]
                tot = per[i, idx].sum(0)
                for k in KEEP:
                    r[f"{unit}_{k}"] = float(tot[STAT_INDEX[k]])
            records.append(r)
            for j, (L, u) in enumerate(rows):
                if u == "attn":
                    layers.append({"setting": label, "text": wtext[i], "window": wwin[i], "layer": L,
                                   **{k: float(per[i, j, STAT_INDEX[k]]) for k in LAYER_KEEP}})
        manifest["settings"].append({
            "spec": spec, "label": label, "method": res.record.method,
            "weight_rel_error": res.record.stats.get("weight_rel_error_mean"),
            "zero_fraction": res.record.stats.get("zero_fraction"),
            "seconds": round(time.time() - t1, 1), "compress_seconds": round(t_comp, 1)})
        manifest["complete"] = len(manifest["settings"]) == len(order) and set(order) == set(GRID)
        manifest["seconds"] = round(time.time() - t0, 1)
        write_data(stem, pd.DataFrame(records), pd.DataFrame(layers), manifest)
        inc = float((nll.sum() - base_nll.sum()) / counts.sum())
        print(f"  [{len(manifest['settings'])}/{len(order)}] {label:24s} loss increase {inc:+.4f} "
              f"({time.time() - t1:.0f} s, compress {t_comp:.0f} s; total {time.time() - t0:.0f} s)", flush=True)
        del res, df, per
        gc.collect()
    print(f"wrote {DATA / stem}.* ({len(records)} records, {time.time() - t0:.0f} s)", flush=True)
    return 0
