"""Shared plumbing of the real-model experiment scripts (depth_profile, scaling_sweep,
layer_sensitivity, and the real-model mode of compression_study).

* the two held-out texts (``kjv``: bundled KJV slice; ``prose``: the Debian Reference slice),
  cut into full windows by :func:`tl_directional.model.inputs.load_text_sequences`;
* provenance for each result's meta JSON: model argument and resolved path, the sha256 of
  ``model.safetensors`` (computed once, cached next to the outputs), git commit, device,
  lane, thread count, token count, wall time;
* per-sequence next-token metrics of edit settings against the unedited model, and a
  sequence bootstrap of every delta (the library's :func:`tl_directional.evaluate.sweeps.sweep`
  returns only pooled sums, so intervals need the per-sequence sums kept here);
* the random-direction reference levels for the depth profile.

Nothing here changes what the library measures; it only keeps the per-sequence sums.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing from a model hub, ever
from studies import common

ROOT, git_commit, sha256_file = common.ROOT, common.git_commit, common.sha256_file

import tl_directional.evaluate.sweeps.metrics as M  # noqa: E402  (the sweep's metric registries)
from tl_directional import Setting  # noqa: E402
from tl_directional.evaluate.sweeps import prediction_mask  # noqa: E402
from tl_directional.io.atomic import atomic_write_bytes, atomic_write_text  # noqa: E402

TEXTS = {
    "kjv": "bundled held-out KJV slice (test-split books: Ruth, Proverbs, Amos, Mark, James)",
    "prose": "held-out modern English prose: Debian Reference 2.100 slice (GPL-2+, tl_directional/data/prose_heldout.txt)",
}


def set_threads(n: int) -> None:
    if n > 0:
        torch.set_num_threads(n)
    torch.set_grad_enabled(False)


def load(model_arg: str):
    """``load_model(model_arg)`` (a catalogue name such as ``smollm2-135m``, ``default`` or a
    model directory). Returns ``(model, model_arg)``."""
    from tl_directional.model.load import load_model

    return load_model(model_arg), model_arg


def short_name(model_arg: str) -> str:
    """The name pages use: the catalogue name, or a directory's last component."""
    return Path(model_arg).name if Path(model_arg).exists() else model_arg


def sandwich_norm(model_path: str, model=None) -> bool:
    """True for models with a norm after the attention output projection (Gemma-2/3, OLMo-2),
    where METHOD sec. 3's value-space factorization does not apply.

    Read from the HF config's ``model_type`` (written while ``resolve_sites`` still missed
    Gemma-3's sandwich norm on the bridge; it now detects it too, see ``sites.is_sandwich_norm``).
    """
    cfg = Path(model_path) / "config.json"
    if cfg.is_file():
        mt = json.loads(cfg.read_text()).get("model_type", "")
        return any(mt.startswith(p) for p in ("gemma2", "gemma3", "olmo2"))
    if model is not None:
        name = str(getattr(model.cfg, "model_name", "")).lower()
        return "gemma-2" in name or "gemma-3" in name or "gemma2" in name or "gemma3" in name
    return False


def text_windows(model, text: str, n_sequences: int, seq_len: int, skip: int = 0):
    """``n_sequences`` full windows of ``seq_len`` tokens (BOS + text) of one held-out text,
    after skipping the first ``skip`` windows."""
    from tl_directional.io.corpus import heldout_paths, prose_heldout_text
    from tl_directional.model.inputs import load_text_sequences

    if text == "kjv":
        path = None
    elif text == "prose":
        prose_heldout_text()  # sha256 check before use
        path = str(heldout_paths()[0].parent / "prose_heldout.txt")
    else:
        path = text
    batch = load_text_sequences(model, path, max_sequences=n_sequences + skip, seq_len=seq_len)
    return batch.slice(skip, len(batch))


def sha256_cached(path: Path, cache: Path) -> str:
    """sha256 of ``path``, cached in the JSON file ``cache`` keyed by path, size and mtime."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    data = json.loads(cache.read_text()) if cache.is_file() else {}
    if key not in data:
        data[key] = sha256_file(path)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data[key]


def provenance(model, model_arg: str, resolved: str, cache_dir: Path) -> dict:
    """Model identity and machine, for the meta JSON."""
    from tl_directional.model.handle import device_of
    from tl_directional.model.lanes import lane_of

    info = {"model": short_name(model_arg), "model_argument": model_arg, "model_path": resolved,
            "lane": lane_of(model), "n_layers": int(model.cfg.n_layers), "d_model": int(model.cfg.d_model),
            "n_heads": int(model.cfg.n_heads), "d_head": int(model.cfg.d_head)}
    path = Path(resolved)
    if not path.is_dir():  # a catalogue name: its converted directory in the cache
        from tl_directional.model.load.catalog import REAL_MODELS, entry_dir

        if resolved in REAL_MODELS and entry_dir(resolved).is_dir():
            path = entry_dir(resolved)
            info["model_path"] = str(path)
            want = common.model_manifest(resolved).get("files", {}).get("model.safetensors", {}).get("sha256")
            if want:  # load_model verified the file against its manifest
                info["model_safetensors_sha256"] = want
    st = path / "model.safetensors"
    if st.is_file() and "model_safetensors_sha256" not in info:
        info["model_safetensors_sha256"] = sha256_cached(st, cache_dir / "model_sha256.json")
    dev = device_of(model)
    info["device"] = (f"{dev}" + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else
                                  f" ({platform.machine()}, {os.cpu_count()} cores shared, "
                                  f"{torch.get_num_threads()} torch thread(s))"))
    info["torch"] = torch.__version__
    info["commit"] = git_commit()
    info["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return info


# ---------------------------------------------------------------------------
# per-sequence metrics and the sequence bootstrap
# ---------------------------------------------------------------------------

SEQ_FIELDS = tuple(M.QUANTITIES)  # ("tokens", "nll", "base_nll", "kl", "top1_agree")


def generated_line(meta: dict, tail: str = "") -> str:
    """A page's provenance sentence: the command, commit, date, device and run time of ``meta``."""
    return (f"Generated by `{meta['command']}` (commit `{meta['commit']}`, {meta['date']}, {meta['device']}, "
            f"{meta['seconds']:.0f} s).{tail}")


def model_line(meta: dict) -> str:
    """The start of a page's model sentence: name, directory, weights' sha256, lane and depth."""
    return (f"Model: `{meta['model']}` loaded from `{meta['model_path']}` (model.safetensors sha256 "
            f"`{meta.get('model_safetensors_sha256', 'n/a')}`), lane {meta['lane']}, {meta['n_layers']} layers")


def publish(page: Path, text: str, out: Path, files: dict[str, str]) -> None:
    """Write a results page and its side files atomically (a crash leaves the old ones whole).

    ``files`` maps a file name in the run directory ``out`` to its suffix after the page's stem
    (``{"meta.json": ".meta.json"}`` -> ``docs/results/STEM.meta.json``); the page goes last.
    """
    page.parent.mkdir(parents=True, exist_ok=True)
    for name, suffix in files.items():
        atomic_write_bytes(page.with_name(page.stem + suffix), (out / name).read_bytes())
    atomic_write_text(page, text)
    print(f"wrote {page}")


def _per_row(base_lp, lp, target, mask):
    """Per-row sums ``[b, 5]``: tokens, nll, base nll, KL(base || edited), top-1 agreement, by
    the sweep's own formulas (:data:`tl_directional.evaluate.sweeps.metrics.QUANTITIES`; top-1 by
    :func:`~tl_directional.evaluate.sweeps.metrics.top1_agreement`, the rule of ``sweep``)."""
    return M.per_position_sums(base_lp, lp, target, mask)


def run_stem(prefix: str, args) -> str:
    """The data stem of a real-model run: ``<prefix>_<model>``, then ``_len<seq>`` when the windows
    are not 128 tokens and ``_<tag>`` when a tag is given."""
    return (
        f"{prefix}_{args.model}"
        + (f"_len{args.seq_len}" if args.seq_len != 128 else "")
        + (f"_{args.tag}" if args.tag else "")
    )


def protocol_windows(model, text: str, rel: str, args):
    """``args.windows`` full windows of ``args.seq_len`` tokens cut from the protocol text at
    ``rel`` (repository-relative), or ``None`` after printing which text falls short."""
    import sys

    from tl_directional.model.inputs import load_text_sequences

    batch = load_text_sequences(
        model, str(common.ROOT / rel), max_sequences=args.windows, seq_len=args.seq_len
    )
    if len(batch) < args.windows or int(batch.attention_mask.sum()) != batch.tokens.numel():
        print(
            f"error: text {text} gives fewer than {args.windows} full windows of {args.seq_len}",
            file=sys.stderr,
        )
        return None
    return batch


def window_records(model, part, sets, text: str, offset: int, spent: dict | None = None) -> list[dict]:
    """Per-window records of one batch of windows (``part``: a batch with ``[b, seq]`` tokens
    and mask) under the baseline and every setting of ``sets`` (tuples ``(label, ..., context
    factory)``): the summed tokens, edited NLL, baseline NLL, KL(base || edited) and top-1
    agreement over the predicted tokens (:func:`_per_row`), one dict per (window, setting),
    windows numbered from ``offset``. ``spent`` (optional) accumulates seconds per label,
    ``"baseline"`` included."""
    spent = {} if spent is None else spent
    mask = prediction_mask(part.attention_mask)
    target = part.tokens[:, 1:].unsqueeze(-1)
    ts = time.time()
    base_lp = torch.log_softmax(model(part.tokens, attention_mask=part.attention_mask)[:, :-1].float(), -1)
    rows = {"baseline": _per_row(base_lp, base_lp, target, mask)}
    spent["baseline"] = spent.get("baseline", 0.0) + time.time() - ts
    for label, *_rest, make in sets:
        ts = time.time()
        with make():
            logits = model(part.tokens, attention_mask=part.attention_mask)
        lp = torch.log_softmax(logits[:, :-1].float(), -1)
        del logits
        rows[label] = _per_row(base_lp, lp, target, mask)
        del lp
        spent[label] = spent.get(label, 0.0) + time.time() - ts
    cols = ("tokens", "nll", "base_nll", "kl", "agree")
    return [
        {"text": text, "window": offset + j, "setting": label, **dict(zip(cols, r[j].tolist(), strict=True))}
        for label, r in rows.items()
        for j in range(r.shape[0])
    ]


@torch.no_grad()
def per_sequence_sweep(model, batch, settings: list[Setting], batch_size: int, log=print) -> dict[str, torch.Tensor]:
    """``{label: [n_seq, 5]}`` per-sequence sums (see ``SEQ_FIELDS``) of every setting, plus
    ``"baseline"``. One forward per setting and batch, each edit through the library's
    :class:`~tl_directional.evaluate.sweeps.Setting` / :func:`~tl_directional.edit.apply_edits`."""
    from tl_directional.edit import apply_edits

    out = {s.label: [] for s in settings}
    out["baseline"] = []
    t0 = time.time()
    n_batches = math.ceil(len(batch) / batch_size)
    for bi, i in enumerate(range(0, len(batch), batch_size)):
        part = batch.slice(i, i + batch_size)
        mask = prediction_mask(part.attention_mask)
        target = part.tokens[:, 1:].unsqueeze(-1)
        base_lp = torch.log_softmax(model(part.tokens, attention_mask=part.attention_mask)[:, :-1].float(), -1)
        out["baseline"].append(_per_row(base_lp, base_lp, target, mask))
        for j, s in enumerate(settings):
            if j and j % 10 == 0:
                log(f"    batch {bi + 1}: {j}/{len(settings)} settings ({time.time() - t0:.0f} s)")
            with apply_edits(model, *s.edits()):
                logits = model(part.tokens, attention_mask=part.attention_mask)
            lp = torch.log_softmax(logits[:, :-1].float(), -1)
            del logits
            out[s.label].append(_per_row(base_lp, lp, target, mask))
            del lp
        log(f"  batch {bi + 1}/{n_batches} done ({time.time() - t0:.0f} s)")
    return {k: torch.cat(v) for k, v in out.items()}


def bootstrap_weights(n: int, B: int, seed: int) -> torch.Tensor:
    """``[B + 1, n]`` resample counts of sequences; row 0 is the full sample."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.ones(B + 1, n, dtype=torch.float64)
    for b in range(1, B + 1):
        w[b] = torch.bincount(torch.randint(0, n, (n,), generator=gen), minlength=n).double()
    return w


def summarize(sums: torch.Tensor, weights: torch.Tensor) -> dict[str, float]:
    """Point values and 95% percentile intervals of delta loss, delta ppl, KL and top-1
    agreement (each registered metric's ``interval`` columns) from per-sequence sums ``[n, 5]``
    under bootstrap weights ``[B + 1, n]``; the columns are the sweep's
    (:func:`tl_directional.evaluate.sweeps.metrics.metric_columns`)."""
    agg = weights @ sums  # [B+1, len(QUANTITIES)]
    tok = agg[:, 0].clamp_min(1)
    cols = M.metric_columns({k: agg[:, j] for j, k in enumerate(M.QUANTITIES)}, tok)  # the sweep's own columns
    interval = [c for m in M.METRIC_REGISTRY.values() for c in m.interval]
    order = [*interval, *sorted((c for c in cols if c not in interval), key=lambda c: c.startswith("base_"))]
    row = {"tokens": int(agg[0, 0])}
    for k in order:
        v = cols[k]
        row[k] = float(v[0])
        if k in interval:
            row[f"{k}_lo"] = float(torch.quantile(v[1:], 0.025))
            row[f"{k}_hi"] = float(torch.quantile(v[1:], 0.975))
    return row


# ---------------------------------------------------------------------------
# random-direction reference levels (depth profile)
# ---------------------------------------------------------------------------


def random_levels(d: int, n: int = 20000, seed: int = 0) -> dict[str, float]:
    """Levels of the split statistics for an update whose direction is uniform on the sphere
    in ``d`` dims, independent of the reference: ``E|cos|`` (exact), the median of
    ``|cos| / sqrt(1 - cos^2)`` (the per-token par_perp_ratio; Monte Carlo, seeded) and the
    energy ratio ``sqrt(E cos^2 / E sin^2) = 1 / sqrt(d - 1)`` (exact)."""
    e_abs_cos = math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    c = (x[:, 0] / x.norm(dim=-1)).abs()
    ratio = c / (1 - c * c).clamp_min(1e-300).sqrt()
    return {"e_abs_cos": e_abs_cos, "median_par_perp_ratio": float(ratio.median()),
            "energy_ratio": 1.0 / math.sqrt(d - 1)}


def fmt_ci(row: dict, key: str, f: str = "+.4f") -> str:
    return f"{row[key]:{f}} [{row[key + '_lo']:{f}}, {row[key + '_hi']:{f}}]"


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
