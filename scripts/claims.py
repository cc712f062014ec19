"""The seed's claims on a real model, as committed data and pages built from it alone.

Two steps (the protocol, with every statistic, budget and verdict rule, is
``docs/results/protocol.md``; it was written before these runs):

    # measure: per-window records of every all-layer edit on three held-out texts, plus the
    # per-head value-space profile; refuses a dirty tl_directional/ or scripts/
    python scripts/claims.py run --model smollm2-135m --windows 32 --seq-len 128 --batch-size 8

    # build every claims page from docs/results/data/ alone (make results); --check compares
    # with the pages on disk and fails on any difference (the suite runs it)
    python scripts/claims.py build [--check]

Data files (``docs/results/data/claims_<model>.*``): ``records.csv`` (text, window, setting,
tokens, nll, base_nll, kl, agree: sums over the window's predicted tokens), ``profile.csv``
(per-head value-space means and per-layer residual energy ratios, BOS excluded) and
``manifest.json`` (command, commit, model source file / quantisation / sha256, texts and their
sha256, settings, per-file sha256). A page is a pure function of those files.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

DATA = ROOT / "docs" / "results" / "data"
PAGES = ROOT / "docs" / "results"
TEXTS = {
    "kjv": ("bundled held-out KJV slice (test-split books)", "tl_directional/data/kjv_heldout.txt"),
    "prose": (
        "modern English prose, Debian Reference slice (GPL-2+)",
        "tl_directional/data/prose_heldout.txt",
    ),
    "code": (
        "Python source, CPython 3.11 difflib / fractions / textwrap (PSF-2.0)",
        "tl_directional/data/code_heldout.txt",
    ),
}
#: the source file, its quantisation and the catalogue's sha256 of it, per catalogue model
SOURCES = {
    "smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    "gemma-3-270m": ("gemma-3-270m Q4_K_M GGUF (four -partN wheels)", "Q4_K_M"),
}
#: the headline subset (512-token windows): the four removals the revision's table compares
HEADLINE = (
    "value-exclusive s_par=0",
    "value-full s_par=0",
    "resid-attn s_par=0",
    "resid-mlp s_par=0",
)
BUDGET = 0.05  # nats/token: "barely changes behaviour" (about 5% perplexity); protocol sec. 2
BUDGET_TO3 = 0.065  # the revision's 1.3x allowance up to s_par = 3
EXCL_GRID = (0.0, 0.25, 0.5, 0.75, 1.5, 2.0, 3.0)
B = 2000
SEED = 0


class DataError(RuntimeError):
    """A committed data file is missing, corrupt, or from another model."""


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def git_state() -> tuple[str, bool]:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "tl_directional", "scripts"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    return head, bool(dirty)


# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------


def _concat_hooks(model, sites, mode: str, s_par: float):
    """METHOD sec. 4's value-space edit with the projection on the *concatenated* heads: ``y``
    is all heads' ``z_t`` (or the cross aggregates ``c_t``) flattened to ``n_heads * d_head``,
    the reference the concatenated own values (GQA: each query head's KV value). The per-head
    form is the library's ``ValueScale``; this is the variant the paper leaves open."""
    import torch

    from tl_directional.sites import expand_kv_heads

    hooks, store = [], {}
    for vs in sites.value:

        def grab_v(t, hook, L=vs.layer):  # noqa: ARG001
            store[("v", L)] = t

        def grab_a(t, hook, L=vs.layer):  # noqa: ARG001
            store[("a", L)] = torch.diagonal(t, dim1=-2, dim2=-1)  # [b, h, q]

        def edit_z(z, hook, L=vs.layer):  # noqa: ARG001
            v = expand_kv_heads(store.pop(("v", L)), sites.n_heads)  # [b, p, h, d]
            a = store.pop(("a", L)).transpose(1, 2).unsqueeze(-1)  # [b, p, h, 1]
            y = z - a * v if mode == "exclusive" else z
            r, yf = v.flatten(-2).float(), y.flatten(-2).float()
            rr = (r * r).sum(-1, keepdim=True)
            coef = torch.where(
                rr > 1e-12, (yf * r).sum(-1, keepdim=True) / rr.clamp_min(1e-12), 0.0
            )
            return z + ((s_par - 1.0) * coef * r).to(z.dtype).view_as(z)

        hooks += [(vs.v_hook, grab_v), (vs.pattern_hook, grab_a), (vs.z_hook, edit_z)]
    return hooks


def settings(model, sites, prof_value, prof_resid):
    """``[(label, family, space, s_par, s_perp_desc, context factory)]`` for one text; the
    matched-norm scales come from that text's own profile (BOS excluded)."""
    import torch

    import tl_directional as tld

    L, H = sites.n_layers, sites.n_heads

    def ed(*edits):
        return lambda: tld.apply_edits(model, *edits)

    def per_head(col):
        t = torch.ones(L, H, dtype=torch.float64)
        for r in prof_value.itertuples():
            t[int(r.layer), int(r.head)] = float(getattr(r, col))
        return t

    def per_layer(comp):
        t = torch.ones(L, dtype=torch.float64)
        for r in prof_resid[prof_resid.component == comp].itertuples():
            t[int(r.layer)] = float(r.energy_ratio)
        return t

    out = []
    for s in EXCL_GRID:
        out.append(
            (
                f"value-exclusive s_par={s:g}",
                "exclusive",
                "value-exclusive",
                s,
                "1",
                ed(tld.ValueScale(s_par=s, mode="exclusive")),
            )
        )
    out.append(
        (
            "value-full s_par=0",
            "removal",
            "value-full",
            0.0,
            "1",
            ed(tld.ValueScale(s_par=0.0, mode="full")),
        )
    )
    out.append(
        (
            "value-full s_par=2",
            "scale",
            "value-full",
            2.0,
            "1",
            ed(tld.ValueScale(s_par=2.0, mode="full")),
        )
    )
    out.append(
        (
            "resid-attn s_par=0",
            "removal",
            "resid-attn",
            0.0,
            "1",
            ed(tld.ResidualScale("attn", s_par=0.0)),
        )
    )
    out.append(
        (
            "resid-mlp s_par=0",
            "removal",
            "resid-mlp",
            0.0,
            "1",
            ed(tld.ResidualScale("mlp", s_par=0.0)),
        )
    )
    out.append(("hard-diag", "removal", "hard-diag", float("nan"), "-", ed(tld.DiagonalRemoval())))
    out.append(
        (
            "value-full-concat s_par=0",
            "concat",
            "value-full-concat",
            0.0,
            "1",
            lambda: model.hooks(fwd_hooks=_concat_hooks(model, sites, "full", 0.0)),
        )
    )
    out.append(
        (
            "value-exclusive-concat s_par=0",
            "concat",
            "value-exclusive-concat",
            0.0,
            "1",
            lambda: model.hooks(fwd_hooks=_concat_hooks(model, sites, "exclusive", 0.0)),
        )
    )
    # perpendicular at the same scale (s_perp = 0; value-full and value-exclusive share it)
    out.append(
        (
            "value s_perp=0",
            "perp-scale",
            "value-exclusive",
            1.0,
            "0",
            ed(tld.ValueScale(s_perp=0.0, mode="exclusive")),
        )
    )
    out.append(
        (
            "resid-attn s_perp=0",
            "perp-scale",
            "resid-attn",
            1.0,
            "0",
            ed(tld.ResidualScale("attn", s_perp=0.0)),
        )
    )
    out.append(
        (
            "resid-mlp s_perp=0",
            "perp-scale",
            "resid-mlp",
            1.0,
            "0",
            ed(tld.ResidualScale("mlp", s_perp=0.0)),
        )
    )
    # perpendicular at the parallel removal's perturbation norm: (1 - s_perp) ||u_perp|| = ||u_par||
    # in energy per layer (residual) or per layer and head (value): s_perp = 1 - energy ratio
    kx, kf = per_head("energy_ratio_exclusive"), per_head("energy_ratio_full")
    ka, km = per_layer("attn"), per_layer("mlp")
    out.append(
        (
            "value-exclusive matched-norm perp",
            "perp-norm",
            "value-exclusive",
            1.0,
            "1-k",
            ed(tld.ValueScale(s_perp=1.0 - kx, mode="exclusive")),
        )
    )
    out.append(
        (
            "value-full matched-norm perp",
            "perp-norm",
            "value-full",
            1.0,
            "1-k",
            ed(tld.ValueScale(s_perp=1.0 - kf, mode="full")),
        )
    )
    out.append(
        (
            "resid-attn matched-norm perp",
            "perp-norm",
            "resid-attn",
            1.0,
            "1-k",
            ed(tld.ResidualScale("attn", s_perp=1.0 - ka)),
        )
    )
    out.append(
        (
            "resid-mlp matched-norm perp",
            "perp-norm",
            "resid-mlp",
            1.0,
            "1-k",
            ed(tld.ResidualScale("mlp", s_perp=1.0 - km)),
        )
    )
    return out


# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------


def run_header(study: str, script: str, args, sites, commit: str, dirty: bool) -> dict:
    """The opening fields of a run's manifest: command, commit, machine, and the model's source
    file, quantisation and sha256s (every page says "dequantised" from them)."""
    import torch

    from tl_directional.models.catalog import REAL_MODELS, entry_dir, read_manifest

    entry = REAL_MODELS[args.model]
    man = read_manifest(entry_dir(args.model)) or {}
    src, quant = SOURCES[args.model]
    return {
        "study": study,
        "command": f"python scripts/{script} " + " ".join(sys.argv[1:] if getattr(args, "cli", True) else []),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"CPU, {os.cpu_count()} cores shared, {args.threads} torch thread(s), torch {torch.__version__}",
        "model": {
            "name": args.model,
            "architecture": entry.architecture,
            "source_file": src,
            "quantisation": quant,
            "dequantised": True,
            "source_sha256": entry.source_sha256,
            "safetensors_sha256": man.get("files", {}).get("model.safetensors", {}).get("sha256"),
            "n_layers": sites.n_layers,
            "n_heads": sites.n_heads,
            "n_kv_heads": sites.n_kv_heads,
            "d_model": sites.d_model,
            "sandwich_norm": not sites.factorization_applicable,
            "lane": sites.lane,
        },
    }


def run(args) -> int:
    import pandas as pd
    import torch

    import tl_directional as tld
    from tl_directional.inputs import load_text_sequences
    from tl_directional.models import load_model
    from tl_directional.models.catalog import REAL_MODELS
    from tl_directional.sites import resolve_sites
    from tl_directional.sweep import prediction_mask

    sys.path.insert(0, str(ROOT / "scripts"))
    from _realrun import (
        _per_row,  # per-window sums: tokens, nll, base nll, KL(base || edited), top-1 agreement
    )

    commit, dirty = git_state()
    if dirty and not args.allow_dirty:
        print(
            "error: tl_directional/ or scripts/ has uncommitted changes; commit them first (data must name "
            "the code that made it)",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(args.model)
    sites = resolve_sites(model, warn=False)
    entry = REAL_MODELS[args.model]
    stem = (
        f"claims_{args.model}"
        + (f"_len{args.seq_len}" if args.seq_len != 128 else "")
        + (f"_{args.tag}" if args.tag else "")
    )
    manifest = run_header("claims", "claims.py", args, sites, commit, dirty)
    manifest |= {
        "windows": args.windows,
        "seq_len": args.seq_len,
        "texts": {},
        "complete": False,
        "files": {},
    }
    records, profiles = [], []
    if args.resume and (DATA / f"{stem}.manifest.json").is_file():
        # Keep the texts an earlier run of the same stem finished; each text names its own commit and
        # command, so a page stitched from several runs says which run made which text.
        old, old_rec, old_prof = load_data(stem)
        for key in ("windows", "seq_len"):
            if old[key] != manifest[key]:
                print(
                    f"error: --resume: {stem} was run with {key}={old[key]}, this run has {manifest[key]}; "
                    "use the same options or another --tag",
                    file=sys.stderr,
                )
                return 2
        if old["model"]["source_sha256"] != entry.source_sha256:
            print(f"error: --resume: {stem} holds another model's data", file=sys.stderr)
            return 2
        for t, info in old["texts"].items():
            info.setdefault("commit", old["commit"])
            info.setdefault("command", old["command"])
            manifest["texts"][t] = info
        manifest["settings"] = old["settings"]
        records = old_rec.to_dict("records")
        profiles = [old_prof]
        print(f"resuming {stem}: keeping {', '.join(old['texts'])}", flush=True)
    for text in args.texts:
        if text in manifest["texts"]:
            continue
        desc, rel = TEXTS[text]
        path = ROOT / rel
        batch = load_text_sequences(
            model, str(path), max_sequences=args.windows, seq_len=args.seq_len
        )
        if len(batch) < args.windows:
            print(
                f"error: text {text} gives only {len(batch)} windows of {args.seq_len}",
                file=sys.stderr,
            )
            return 2
        prof = tld.profile(
            model,
            batch.tokens,
            attention_mask=batch.attention_mask,
            batch_size=args.batch_size,
            exclude_first_token=True,
            components=["attn", "mlp", "value"],
            progress=False,
        )
        pv = prof.value[
            [
                "layer",
                "head",
                "count",
                "A_tt_mean",
                "beta_mean",
                "gamma_mean",
                "par_frac_full_mean",
                "par_frac_exclusive_mean",
                "energy_ratio_full",
                "energy_ratio_exclusive",
            ]
        ].copy()
        pr = prof.residual[
            ["layer", "component", "count", "energy_ratio", "par_frac_mean", "par_frac_median"]
        ].copy()
        for df, kind in ((pv, "value"), (pr, "residual")):
            df.insert(0, "table", kind)
            df.insert(0, "text", text)
            profiles.append(df)
        sets = settings(model, sites, pv, pr)
        if args.settings == "headline":
            sets = [x for x in sets if x[0] in HEADLINE]
        if manifest.get("settings") and [s["label"] for s in manifest["settings"]] != [s[0] for s in sets]:
            print(
                f"error: --resume: {stem} holds other settings; use the same --settings or another --tag",
                file=sys.stderr,
            )
            return 2
        t1 = time.time()
        print(f"{text}: {len(batch)} windows x {args.seq_len}, {len(sets)} settings", flush=True)
        for i in range(0, len(batch), args.batch_size):
            part = batch.slice(i, i + args.batch_size)
            mask = prediction_mask(part.attention_mask)
            target = part.tokens[:, 1:].unsqueeze(-1)
            base_lp = torch.log_softmax(
                model(part.tokens, attention_mask=part.attention_mask)[:, :-1].float(), -1
            )
            rows = {"baseline": _per_row(base_lp, base_lp, target, mask)}
            for label, *_rest, make in sets:
                with make():
                    logits = model(part.tokens, attention_mask=part.attention_mask)
                lp = torch.log_softmax(logits[:, :-1].float(), -1)
                del logits
                rows[label] = _per_row(base_lp, lp, target, mask)
                del lp
            for label, r in rows.items():
                for j in range(r.shape[0]):
                    records.append(
                        {
                            "text": text,
                            "window": i + j,
                            "setting": label,
                            **dict(
                                zip(
                                    ("tokens", "nll", "base_nll", "kl", "agree"),
                                    r[j].tolist(),
                                    strict=True,
                                )
                            ),
                        }
                    )
            print(
                f"  windows {i}-{i + part.tokens.shape[0] - 1} done ({time.time() - t1:.0f} s)",
                flush=True,
            )
        manifest["texts"][text] = {
            "description": desc,
            "file": rel,
            "sha256": sha256_bytes(path.read_bytes()),
            "windows": len(batch),
            "seconds": round(time.time() - t1, 1),
            "commit": manifest["commit"],
            "command": manifest["command"],
        }
        manifest["settings"] = [
            {
                "label": s[0],
                "family": s[1],
                "space": s[2],
                "s_par": None if s[3] != s[3] else s[3],
                "s_perp": s[4],
            }
            for s in sets
        ]
        manifest["seconds"] = round(time.time() - t0, 1)
        manifest["complete"] = set(args.texts) <= set(manifest["texts"])
        commits = list(dict.fromkeys(v.get("commit", manifest["commit"]) for v in manifest["texts"].values()))
        if len(commits) > 1:
            manifest["commits"] = commits
        _write_data(stem, pd.DataFrame(records), pd.concat(profiles, ignore_index=True), manifest)
    return 0


def _csv(df) -> bytes:
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.10g", lineterminator="\n")
    return buf.getvalue().encode()


def _write_data(stem, rec, prof, manifest):
    from tl_directional.fileio import atomic_write_bytes

    DATA.mkdir(parents=True, exist_ok=True)
    files = {f"{stem}.records.csv": _csv(rec), f"{stem}.profile.csv": _csv(prof)}
    for name, b in files.items():
        atomic_write_bytes(DATA / name, b)
        manifest["files"][name] = sha256_bytes(b)
    atomic_write_bytes(
        DATA / f"{stem}.manifest.json", (json.dumps(manifest, indent=1) + "\n").encode()
    )
    print(f"wrote {DATA / stem}.* ({len(rec)} records)", flush=True)


# ---------------------------------------------------------------------------
# build (pure function of the data)
# ---------------------------------------------------------------------------


def load_data(stem: str):
    import pandas as pd

    mpath = DATA / f"{stem}.manifest.json"
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{mpath.relative_to(ROOT)}: cannot read the manifest ({e})") from None
    frames = {}
    for name, want in manifest.get("files", {}).items():
        p = DATA / name
        if not p.is_file():
            raise DataError(
                f"{p.relative_to(ROOT)}: missing (named by {mpath.name}); restore it from git"
            )
        b = p.read_bytes()
        if sha256_bytes(b) != want:
            raise DataError(
                f"{p.relative_to(ROOT)}: sha256 {sha256_bytes(b)[:12]} does not match the manifest's "
                f"{want[:12]}: the file is corrupt or was edited; restore it from git or rerun"
            )
        frames[name.split(".")[-2]] = pd.read_csv(io.BytesIO(b))
    m = manifest["model"]
    from tl_directional.models.catalog import REAL_MODELS

    if m["name"] in REAL_MODELS and REAL_MODELS[m["name"]].source_sha256 != m["source_sha256"]:
        raise DataError(
            f"{mpath.relative_to(ROOT)}: model source sha256 {m['source_sha256'][:12]} is not the "
            f"catalogue's {m['name']} ({REAL_MODELS[m['name']].source_sha256[:12]}): data from another model"
        )
    if any("+dirty" in t.get("commit", "") for t in manifest["texts"].values()) or "+dirty" in manifest["commit"]:
        raise DataError(
            f"{mpath.relative_to(ROOT)}: made from a dirty tree ({manifest['commit']}); rerun from a clean one"
        )
    return manifest, frames["records"], frames["profile"]


def _boot(rec, B=B, seed=SEED):
    """Stratified bootstrap over windows within each text: ``{text: [B + 1, n]}`` counts."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for text in sorted(rec.text.unique()):
        n = int(rec[rec.text == text].window.nunique())
        w = np.ones((B + 1, n))
        for b in range(1, B + 1):
            w[b] = np.bincount(rng.integers(0, n, n), minlength=n)
        out[text] = w
    return out


def _stats(rec, weights):
    """Per setting: ``{"pooled": [B+1] delta loss, text: [B+1] ...}`` and KL / top-1 / ppl."""
    import numpy as np

    res = {}
    for setting, g in rec.groupby("setting", sort=False):
        d = {}
        tok_all = nll_all = base_all = kl_all = ag_all = 0.0
        for text, w in weights.items():
            gt = g[g.text == text].sort_values("window")
            if gt.empty:
                continue
            a = gt[["tokens", "nll", "base_nll", "kl", "agree"]].to_numpy()
            s = w @ a  # [B+1, 5]
            d[text] = (s[:, 1] - s[:, 2]) / s[:, 0]
            # the paper's statistic: per-window perplexity, averaged over windows of the text
            ppl_e, ppl_b = np.exp(a[:, 1] / a[:, 0]), np.exp(a[:, 2] / a[:, 0])
            d[text + ":ppl_rel"] = (w @ ppl_e) / (w @ ppl_b) - 1.0
            d[text + ":kl"] = s[:, 3] / s[:, 0]
            d[text + ":top1"] = s[:, 4] / s[:, 0]
            tok_all, nll_all, base_all = tok_all + s[:, 0], nll_all + s[:, 1], base_all + s[:, 2]
            kl_all, ag_all = kl_all + s[:, 3], ag_all + s[:, 4]
        d["pooled"] = (nll_all - base_all) / tok_all
        d["pooled:kl"], d["pooled:top1"] = kl_all / tok_all, ag_all / tok_all
        d["pooled:ppl_rel"] = np.mean(
            [d[t + ":ppl_rel"] for t in weights if t + ":ppl_rel" in d], axis=0
        )
        res[setting] = d
    return res


def _ci(x):
    """Point value and 95% percentile interval, rounded to 9 decimals: a quantile can fall exactly
    on a printed digit's boundary (rank statistics are rational), where the last bit differs
    between numpy builds; rounding first makes every lane print the same page."""
    import numpy as np

    return tuple(round(float(v), 9) for v in (x[0], np.quantile(x[1:], 0.025), np.quantile(x[1:], 0.975)))


def _fmt(x, f="+.3f"):
    v, lo, hi = _ci(x)
    return f"{v:{f}} [{lo:{f}}, {hi:{f}}]"


def _pct_format(x) -> str:
    """Fixed decimals for ordinary changes; 3 significant digits past 1000% (exp of a large loss
    change has more digits than float64 carries, and they differ between numpy builds)."""
    import numpy as np

    return "+.1f" if float(np.max(np.abs(x))) * 100 < 1000 else "+.3g"


def _verdict_upper(stat, budget):
    """held: upper bound <= budget; failed: lower bound > budget; else not decided."""
    v, lo, hi = _ci(stat)
    return "**held**" if hi <= budget else "**failed**" if lo > budget else "**not decided**"


def _verdict_threshold(stat, level):
    """held: lower bound > level; failed: upper bound < level; else not decided."""
    v, lo, hi = _ci(stat)
    return "**held**" if lo > level else "**failed**" if hi < level else "**not decided**"


def _verdict_sign(stat, held_if_positive=True):
    v, lo, hi = _ci(stat)
    if lo > 0:
        return "**held**" if held_if_positive else "**failed**"
    if hi < 0:
        return "**failed**" if held_if_positive else "**held**"
    return "**not decided**"


def _holm(pvals: dict[str, float], alpha=0.05) -> set[str]:
    order = sorted(pvals, key=pvals.get)
    rejected = set()
    for i, k in enumerate(order):
        if pvals[k] <= alpha / (len(order) - i):
            rejected.add(k)
        else:
            break
    return rejected


def _avg_ranks(a):
    """Ranks with ties sharing their average rank (a bootstrap resample repeats values; the
    order an unstable sort gives ties differs between numpy builds)."""
    import numpy as np

    ranks = np.empty(len(a))
    ranks[np.argsort(a, kind="stable")] = np.arange(len(a))
    _, inv = np.unique(a, return_inverse=True)
    return (np.bincount(inv, ranks) / np.bincount(inv))[inv]


def _spearman(x, y):
    import numpy as np

    return float(np.corrcoef(_avg_ranks(x), _avg_ranks(y))[0, 1])


def build_page(stem: str) -> str:
    import numpy as np

    manifest, rec, prof = load_data(stem)
    weights = _boot(rec)
    st = _stats(rec, weights)
    texts = list(weights)
    m = manifest["model"]
    tokens = {
        t: int(rec[(rec.text == t) & (rec.setting == "baseline")].tokens.sum()) for t in texts
    }
    subset = "" if "value-exclusive s_par=0.25" in st else ", the four removals only"
    L = [
        f"# The seed's claims on {m['name']} ({manifest['seq_len']}-token windows{subset}, "
        + ", ".join(f"`{t}`" for t in texts)
        + ")",
        "",
        "Built by `python scripts/claims.py build` from the committed data "
        f"`docs/results/data/{stem}.*` alone (protocol: [protocol.md](protocol.md)); do not edit by hand.",
        "",
        (
            f"- Data made by `{manifest['command']}` at commit `{manifest['commit']}`, {manifest['date']}, "
            f"{manifest['machine']}, {manifest['seconds']:.0f} s"
            if "commits" not in manifest
            else "- Data stitched from "
            + str(len(manifest["commits"]))
            + " runs of the same settings: "
            + "; ".join(
                f"`{t}` by `{manifest['texts'][t]['command']}` at commit `{manifest['texts'][t]['commit']}` "
                f"({manifest['texts'][t]['seconds']:.0f} s)"
                for t in texts
            )
            + f"; last {manifest['date']}, {manifest['machine']}"
        )
        + ("" if manifest["complete"] else " (**incomplete run**: the texts below only)")
        + ".",
        f"- Model: `{m['name']}` ({m['architecture']}, {m['n_layers']} layers, {m['n_heads']} query / "
        f"{m['n_kv_heads']} KV heads{', sandwich norms' if m['sandwich_norm'] else ''}), **dequantised** from "
        f"`{m['source_file']}` ({m['quantisation']}, sha256 `{m['source_sha256'][:16]}...`) to float32 "
        f"(model.safetensors sha256 `{(m['safetensors_sha256'] or 'n/a')[:16]}...`), unprocessed weights, "
        f"{m['lane']} lane. It is a 4-bit model's numbers, not the original float checkpoint's.",
        "- Texts: "
        + "; ".join(
            f"`{t}` ({manifest['texts'][t]['description']}, sha256 "
            f"`{manifest['texts'][t]['sha256'][:12]}`): {manifest['texts'][t]['windows']} windows, "
            f"{tokens[t]} predicted tokens"
            for t in texts
        )
        + ".",
        f"- Every edit on all layers and heads, no BOS exemption. Intervals: 95% percentile bootstrap over windows, "
        f"stratified by text ({B} resamples, seed {SEED}), the same resamples for every setting (paired). "
        "`delta` is nats per predicted token (token-weighted); `ppl` is the paper's statistic, the per-window "
        "perplexity averaged over the windows of a text, as a relative change; `spread` is the range over texts.",
        "",
    ]

    def row(label):
        d = st[label]
        per = [float(d[t][0]) for t in texts if t in d]
        return (
            f"| {label} | {_fmt(d['pooled'])} | "
            + " | ".join(f"{float(d[t][0]):+.3f}" for t in texts)
            + f" | {min(per):+.3f} .. {max(per):+.3f} | {_fmt(d['pooled:ppl_rel'] * 100, _pct_format(d['pooled:ppl_rel']))}% | "
            f"{float(d['pooled:kl'][0]):.3f} | {float(d['pooled:top1'][0]):.3f} |"
        )

    head = (
        "| setting | delta pooled [95% CI] | "
        + " | ".join(f"delta `{t}`" for t in texts)
        + " | spread | ppl change [95% CI] | KL | top-1 agree |"
    )
    sep = "|---|---|" + "---:|" * len(texts) + "---|---|---:|---:|"
    verdicts = []
    # claim A: exclude-self robust over [0, 1] and up to 3
    ex = [f"value-exclusive s_par={s:g}" for s in EXCL_GRID]
    in01 = [lab for lab, s in zip(ex, EXCL_GRID, strict=True) if s <= 1.0]
    has = lambda *labels: all(lab in st for lab in labels)  # noqa: E731 - a run may hold a subset
    if has(*ex):
        worst01 = np.max([np.abs(st[lab]["pooled"]) for lab in in01], axis=0)
        worst3 = np.max([np.abs(st[lab]["pooled"]) for lab in ex], axis=0)
        verdicts.append(
            (
                "A1",
                f"exclude-self value edits change loss by at most {BUDGET} nats/token over s_par in [0, 1]",
                f"max abs(delta) over s_par in {{0, .25, .5, .75}} = {_fmt(worst01)}",
                _verdict_upper(worst01, BUDGET),
            )
        )
        verdicts.append(
            (
                "A2",
                f"... and by at most {BUDGET_TO3} up to s_par = 3",
                f"max abs(delta) over all 7 scales = {_fmt(worst3)}",
                _verdict_upper(worst3, BUDGET_TO3),
            )
        )
    comps = [
        "value-full s_par=0",
        "resid-attn s_par=0",
        "resid-mlp s_par=0",
        "value-exclusive matched-norm perp",
    ]
    if has("value-exclusive s_par=0", *comps):
        exr = st["value-exclusive s_par=0"]["pooled"]
        margin = np.min([st[c]["pooled"] - exr for c in comps], axis=0)
        verdicts.append(
            (
                "A3",
                "exclude-self removal is less damaging than full-aggregate V-Para, resid-attn and resid-MLP "
                "removal and than its matched-norm perpendicular edit",
                f"min over the four of (their delta - exclude-self delta) = {_fmt(margin)}",
                _verdict_sign(margin),
            )
        )
    if has("value-full s_par=0"):
        full0 = st["value-full s_par=0"]["pooled"]
        v = _verdict_upper(full0, BUDGET)
        verdicts.append(
            (
                "B",
                f"full-aggregate V-Para removal hurts (the revision; the earlier version said no damage): "
                f"delta > {BUDGET}",
                f"delta = {_fmt(full0)}",
                {"**held**": "**failed**", "**failed**": "**held**"}.get(v, v),
            )
        )
    # claim C: perpendicular hurts more than parallel, matched norm and matched scale
    pairs_norm = {
        "value-exclusive": ("value-exclusive matched-norm perp", "value-exclusive s_par=0"),
        "value-full": ("value-full matched-norm perp", "value-full s_par=0"),
        "resid-attn": ("resid-attn matched-norm perp", "resid-attn s_par=0"),
        "resid-mlp": ("resid-mlp matched-norm perp", "resid-mlp s_par=0"),
    }
    pairs_scale = {
        "value-exclusive": ("value s_perp=0", "value-exclusive s_par=0"),
        "value-full": ("value s_perp=0", "value-full s_par=0"),
        "resid-attn": ("resid-attn s_perp=0", "resid-attn s_par=0"),
        "resid-mlp": ("resid-mlp s_perp=0", "resid-mlp s_par=0"),
    }
    for cid, name, pairs in (
        ("C1", "matched perturbation norm", pairs_norm),
        ("C2", "matched scale (0)", pairs_scale),
    ):
        if not has(*[x for pair in pairs.values() for x in pair]):
            continue
        diffs = {sp: st[a]["pooled"] - st[b]["pooled"] for sp, (a, b) in pairs.items()}
        mn = np.min(list(diffs.values()), axis=0)
        p_pos = {sp: float(np.mean(d[1:] <= 0)) for sp, d in diffs.items()}
        p_neg = {sp: float(np.mean(d[1:] >= 0)) for sp, d in diffs.items()}
        pos, neg = _holm(p_pos), _holm(p_neg)
        verdicts.append(
            (
                cid,
                f"perpendicular removal hurts more than parallel removal in every space, at {name}",
                f"min over 4 spaces of (perp delta - par delta) = {_fmt(mn)}; Holm (4 tests each way, "
                f"alpha 0.05): perp worse in {len(pos)} of 4 ({', '.join(sorted(pos)) or 'none'}), "
                f"par worse in {len(neg)} of 4 ({', '.join(sorted(neg)) or 'none'})",
                _verdict_sign(mn),
            )
        )
    # claim E: attention's value-space parallel ratio tracks A_tt (per head, bootstrap over heads)
    pv = prof[prof.table == "value"]
    rng = np.random.default_rng(SEED)
    e_rows = []
    for text in texts:
        g = pv[pv.text == text]
        x, y = g.A_tt_mean.to_numpy(), g.par_frac_full_mean.to_numpy()
        rho = [_spearman(x, y)]
        for _ in range(B):
            idx = rng.integers(0, len(x), len(x))
            rho.append(_spearman(x[idx], y[idx]))
        e_rows.append((text, np.array(rho), len(x)))
    pooled_rho = np.mean([r for _, r, _ in e_rows], axis=0)
    verdicts.append(
        (
            "E",
            "a head's value-space parallel share (mean abs cos(o_t, v_t)) tracks its mean A_tt: "
            "Spearman > 0.5 across heads",
            f"mean over texts of Spearman = {_fmt(pooled_rho, '+.2f')}",
            _verdict_threshold(pooled_rho, 0.5),
        )
    )
    L += [
        "## Verdicts (rules in [protocol.md](protocol.md))",
        "",
        "| claim | test | statistic [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    L += [f"| {c} | {t} | {s} | {v} |" for c, t, s, v in verdicts]
    L += ["", "## Removals (s_par = 0 unless named), all layers", "", head, sep]
    for lab in [
        "value-exclusive s_par=0",
        "value-full s_par=0",
        "value-exclusive-concat s_par=0",
        "value-full-concat s_par=0",
        "resid-attn s_par=0",
        "resid-mlp s_par=0",
        "hard-diag",
    ]:
        if lab in st:
            L.append(row(lab))
    if "value-full-concat s_par=0" in st:
        L += [
            "",
            "`-concat`: the same edit with the projection on all heads' concatenated outputs against the "
            "concatenated own values (the per-head question the paper's revision leaves open).",
        ]
    if any(lab in st for lab in ex[1:]):
        L += ["", "## Exclude-self value edits over s_par", "", head, sep]
        L += [row(lab) for lab in ex if lab in st]
    perp = [
        "value s_perp=0",
        "resid-attn s_perp=0",
        "resid-mlp s_perp=0",
        "value-exclusive matched-norm perp",
        "value-full matched-norm perp",
        "resid-attn matched-norm perp",
        "resid-mlp matched-norm perp",
        "value-full s_par=2",
    ]
    if any(lab in st for lab in perp):
        L += [
            "",
            "## Perpendicular edits",
            "",
            "Matched scale: `s_perp = 0` (remove the perpendicular part). Matched norm: "
            "`s_perp = 1 - k` with `k` the text's energy ratio `sqrt(sum ||u_par||^2 / sum ||u_perp||^2)` per layer "
            "(residual) or per layer and head (value; exclusive or full aggregate), so that the perpendicular edit "
            "moves the update by the same energy as the parallel removal (`k > 1` gives `s_perp < 0`).",
            "",
            head,
            sep,
        ]
        L += [row(lab) for lab in perp if lab in st]
    if m["sandwich_norm"] and "value-full s_par=2" in st:
        L += [
            "",
            "Sandwich norms: the post-attention RMSNorm removes a common scale of the attention output and there "
            "is no `o_proj` bias, so in value space `s_par = 2` is the same edit as `s_perp = 0.5` (see "
            "[method](../method.md)); such pairs are not counted as parallel-versus-perpendicular evidence.",
        ]
    L += [
        "",
        "## Parallel share tracks A_tt (claim E)",
        "",
        "| text | heads | Spearman(A_tt mean, mean abs cos(o_t, v_t)) [95% CI, bootstrap over heads] |",
        "|---|---:|---|",
    ]
    L += [f"| `{t}` | {n} | {_fmt(r, '+.2f')} |" for t, r, n in e_rows]
    pr = prof[prof.table == "residual"]
    L += [
        "",
        "## Depth profile (BOS excluded): mean abs cos(u, r) per layer",
        "",
        "| layer | "
        + " | ".join(f"attn `{t}`" for t in texts)
        + " | "
        + " | ".join(f"mlp `{t}`" for t in texts)
        + " |",
        "|---:|" + "---:|" * (2 * len(texts)),
    ]
    rnd = math.exp(
        math.lgamma(prof_d := _d_model(manifest) / 2) - math.lgamma(prof_d + 0.5)
    ) / math.sqrt(math.pi)
    for layer in sorted(pr.layer.unique()):
        cells = []
        for comp in ("attn", "mlp"):
            for t in texts:
                r = pr[(pr.text == t) & (pr.layer == layer) & (pr.component == comp)]
                cells.append(f"{float(r.par_frac_mean.iloc[0]):.3f}" if len(r) else "")
        L.append(f"| {int(layer)} | " + " | ".join(cells) + " |")
    L += [
        "",
        f"Random-direction level of E abs cos in d_model = {_d_model(manifest)}: {rnd:.3f}. "
        "No anisotropy control (a mismatched token's stream) in this run.",
        "",
    ]
    return "\n".join(L)


def _d_model(manifest) -> int:
    return {"smollm2-135m": 576, "gemma-3-270m": 640}.get(manifest["model"]["name"], 0)


SUMMARY_START, SUMMARY_END = "<!-- claims-summary -->", "<!-- /claims-summary -->"


def summary_block(stems, depth=(), training=()) -> str:
    """The verdict table of every run, for docs/results.md (between the two markers)."""
    import depth_claims
    import training_claims

    L = [SUMMARY_START, "", "| run | claim | statistic [95% CI] | verdict |", "|---|---|---|---|"]
    for stem in training:
        for claim, stat, verdict in training_claims.verdict_rows(stem, DATA):
            L.append(f"| [claims_{stem}](results/claims_{stem}.md) | {claim} | {stat} | {verdict} |")
    for stem in depth:
        for claim, stat, verdict in depth_claims.verdict_rows(stem, DATA):
            L.append(f"| [{stem}](results/{stem}.md) | {claim} | {stat} | {verdict} |")
    compression = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("compression_*.manifest.json")
                         if not p.name[len("compression_"):].split(".")[0].count("_"))
    if compression:
        import compression_claims

        for stem in compression:
            page = compression_claims.build_page(stem)
            row = next(ln for ln in page.splitlines() if "(**pre-registered**)" in ln)
            cells = [c.strip() for c in row.strip("|").split(" | ")]
            L.append(
                f"| [claims_{stem}](results/claims_{stem}.md) | 3: perpendicular error ranks compression damage "
                f"better than parallel error, 1-cos and MSE ({cells[0].split(' (')[0]}) | T = {cells[1]} | {cells[-1]} |"
            )
    for stem in stems:
        manifest = json.loads((DATA / f"{stem}.manifest.json").read_text())
        page = build_page(stem)
        rows = [
            ln
            for ln in page.split("\n## Verdicts", 1)[1].split("\n\n", 2)[1].splitlines()[2:]
            if ln.startswith("|")
        ]
        done = "" if manifest["complete"] else " (incomplete)"
        for ln in rows:
            cells = [c.strip() for c in ln.strip("|").split(" | ")]
            L.append(
                f"| [{stem}](results/{stem}.md){done} | {cells[0]} | {cells[2]} | {cells[3]} |"
            )
    L += ["", SUMMARY_END]
    return "\n".join(L)


def build(check: bool) -> int:
    import compression_claims
    import depth_claims
    import training_claims

    stems = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("claims_*.manifest.json"))
    depth = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("depth_*.manifest.json"))
    training = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("training_*.manifest.json"))
    if not stems:
        print(f"error: no claims data under {DATA.relative_to(ROOT)}", file=sys.stderr)
        return 2
    pages = {}
    try:
        for stem in stems:
            pages[PAGES / f"{stem}.md"] = build_page(stem) + "\n"
        for stem in depth:
            pages[PAGES / f"{stem}.md"] = depth_claims.build_page(stem, DATA) + "\n"
        for stem in training:
            pages[PAGES / f"claims_{stem}.md"] = training_claims.build_page(stem, DATA) + "\n"
        index = PAGES.parent / "results.md"
        if index.is_file():
            text = index.read_text()
            if SUMMARY_START in text and SUMMARY_END in text:
                head, rest = text.split(SUMMARY_START, 1)
                pages[index] = head + summary_block(stems, depth, training) + rest.split(SUMMARY_END, 1)[1]
    except (DataError, depth_claims.C.DataError, compression_claims.DataError, training_claims.DataError) as e:  # each script's own class
        print(f"error: {e}", file=sys.stderr)
        return 2
    return write_pages(pages, check, ROOT, "make results")


def write_pages(pages: dict, check: bool, root: Path, command: str) -> int:
    """Write every built page (atomically), or with ``check`` compare each with the file on disk
    and fail (exit status 1), naming the pages that differ and ``command`` to rebuild them."""
    from tl_directional.fileio import atomic_write_text

    bad = []
    for path, text in pages.items():
        if check:
            if not path.is_file() or path.read_text() != text:
                bad.append(str(path.relative_to(root)))
        else:
            atomic_write_text(path, text)
            print(f"wrote {path.relative_to(root)}")
    if bad:
        print(
            "error: these pages differ from what the committed data builds (edited by hand, or data changed "
            f"without a rebuild): {', '.join(bad)}; run `{command}`",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, choices=sorted(SOURCES))
    r.add_argument("--texts", nargs="+", default=list(TEXTS), choices=list(TEXTS))
    r.add_argument("--windows", type=int, default=32)
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--settings", choices=("all", "headline"), default="all")
    r.add_argument(
        "--tag",
        default="",
        help="a suffix of the data files' names, for a run split over processes",
    )
    r.add_argument(
        "--allow-dirty",
        action="store_true",
        help="for smoke runs only: the builder refuses such data",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="keep the texts an earlier run of the same data files finished and run the rest",
    )
    b = sub.add_parser("build")
    b.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    args.cli = argv is None
    return run(args) if args.cmd == "run" else build(args.check)


if __name__ == "__main__":
    sys.exit(main())
