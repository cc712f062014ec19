"""``tl-directional sweep``: the component-scaling sweep, as a CSV and a figure."""

from __future__ import annotations

import sys
from pathlib import Path

from ..model.inputs import load_text_sequences
from .errors import UsageError
from .options import (
    _HELP,
    _LEGACY_NAMES,
    _check_spaces,
    _claim_out,
    _common,
    _DefaultsHelp,
    _float_list,
    _layer_sets,
    _load_model_arg,
    _positive_int,
)


def _cmd_sweep(args) -> int:
    with _claim_out(args.out, "sweep", args.force) as out:  # checked and locked before any model work
        return _sweep_locked(args, out)


def _sweep_locked(args, out: Path) -> int:
    import shutil

    from ..evaluate.sweeps import CheckpointMismatch, grid, sweep
    from ..figures.sweep import sweep_figure
    from ..io.atomic import atomic_path, fault_point
    from ..io.records import write_manifest

    spaces = _check_spaces(args.space)
    model = _load_model_arg(args.model)
    layer_sets = _layer_sets(args.layers, int(model.cfg.n_layers))
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len,
                                text_argument="--text", seq_len_argument="--seq-len")
    settings = grid(spaces, s_par=args.s_par, s_perp=args.s_perp, layers=layer_sets)
    settings += _random_settings(args.random, spaces, args.s_perp, layer_sets, int(model.cfg.n_layers))
    ours = out.is_dir() and (_is_sweep_dir(out) or not any(out.iterdir()))
    if args.force and out.exists() and not ours:
        shutil.rmtree(out)  # --force: another command's output (checked by _claim_out), replaced
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "sweep.progress.json"
    if (args.restart or args.force) and checkpoint.exists():
        checkpoint.unlink()
    _check_checkpoint(checkpoint, out)
    try:
        df = sweep(model, batch, settings, batch_size=args.batch_size, stack=args.stack,
                   checkpoint=checkpoint, progress=not args.quiet)
    except CheckpointMismatch as exc:
        what = f"{exc.n_settings} setting{'s' if exc.n_settings != 1 else ''}"
        held = (f"a finished sweep of {what}" if exc.finished else
                f"an unfinished sweep of {what} ({exc.done} of {exc.total} batches done)")
        fix = ("pass --restart (or --force) to replace it" if exc.finished else
               "rerun with its options to resume it, pass --restart to discard it")
        raise UsageError(f"--out {out} holds {held}, which differs from this one in {', '.join(exc.diff)}; "
                         f"{fix}, or use another --out") from None
    with atomic_path(out / "sweep.csv") as tmp:
        df.to_csv(tmp, index=False)
    with atomic_path(out / "sweep.html") as tmp:
        sweep_figure(df).write_html(tmp, include_plotlyjs=True)
        fault_point("sweep.html_written")  # crash tests: a kill leaves .sweep.html.XXXXXXXX.tmp
    write_manifest(out, "sweep", {"settings": [s.label for s in settings],
                                  "random_scales": {s.label: list(s.layer_s_par) for s in settings
                                                    if s.layer_s_par is not None}})
    cols = ["label", "status", "tokens", "loss", "delta_loss", "delta_ppl", "kl", "top1_agree"]
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"\nwrote {out}/sweep.csv and {out}/sweep.html")
    failed = df[df["status"] != "ok"]
    for label, reason in zip(failed["label"], failed["reason"], strict=True):
        print(f"failed: {label}: {reason}", file=sys.stderr)
    if len(failed):  # the table is complete, but not every requested setting has numbers
        print(f"sweep: {len(failed)} of {len(df) - 1} settings failed (status and reason columns of "
              "sweep.csv); exit status 1", file=sys.stderr)
        return 1
    return 0


def _check_checkpoint(checkpoint: Path, out: Path) -> None:
    """A damaged checkpoint in ``--out`` is named with the command line's fix (the library's own
    message names a checkpoint path, which the command line does not take)."""
    from ..evaluate.sweeps.sweep_store import SweepProgress
    from ..io.atomic import ArtefactError

    if not checkpoint.exists():
        return
    try:
        SweepProgress.load(checkpoint)
    except ArtefactError:
        raise UsageError(f"--out {out} holds {checkpoint.name}, which is damaged or not a sweep checkpoint; "
                         "pass --restart to discard it and start the sweep afresh, or use another --out") from None


def _random_settings(spec: str | None, spaces, s_perps, layer_sets, n_layers: int) -> list:
    """``--random "uniform:0,1;gaussian:0"``: one random per-layer setting per scaled space, s_perp,
    layer set, distribution and seed (tl_directional.evaluate.sweeps.random_draws)."""
    from ..edit import EDIT_SPACES
    from ..evaluate.sweeps.random_draws import DISTRIBUTIONS, random_setting

    if not spec:
        return []
    if not any(EDIT_SPACES[space].scaled for space in spaces):
        # nothing to draw scales for: the random rows would be dropped without a word
        raise UsageError(f"--random draws a per-layer s_par, but no space of --space {','.join(spaces)!r} "
                         "takes a scale; add a scaled space (e.g. --space value) or drop --random")
    out = []
    for item in filter(None, (x.strip() for x in spec.split(";"))):
        dist, sep, seeds = item.partition(":")
        try:
            seed_list = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            seed_list = []
        if not sep or dist.strip() not in DISTRIBUTIONS or not seed_list:
            raise UsageError(f"--random item {item!r} must be DIST:SEED[,SEED...] with DIST one of {DISTRIBUTIONS}, "
                             "e.g. --random 'uniform:0,1,2;gaussian:0'")
        for space in spaces:
            if not EDIT_SPACES[space].scaled:
                continue
            for sq in s_perps:
                for layers in layer_sets:
                    out += [random_setting(space, n_layers, dist.strip(), seed=seed, s_perp=sq, layers=layers)
                            for seed in seed_list]
    return out


def _is_sweep_dir(out: Path) -> bool:
    from ..io.atomic import ArtefactError
    from ..io.records import read_manifest

    try:
        doc = read_manifest(out)
    except ArtefactError:
        return False
    if doc is not None:
        return doc.get("kind") == "sweep"
    return all(p.name in _LEGACY_NAMES["sweep"] for p in out.iterdir() if not p.name.startswith("."))


def add_parser(sub) -> None:
    from ..edit import EDIT_SPACES

    p = sub.add_parser("sweep", help="component-scaling sweep over edit spaces and scales", formatter_class=_DefaultsHelp,
                       description="Loss / perplexity / KL / top-1 agreement per edit setting.")
    p.add_argument("--space", default="value-exclusive-joint,value-exclusive,value,resid-attn,resid-mlp",
                   help="comma-separated edit spaces: " + ", ".join(EDIT_SPACES))
    p.add_argument("--s-par", type=_float_list, default=[-1.0, 0.0, 0.5, 1.0, 2.0],
                   help="comma-separated parallel scales, e.g. --s-par=-1,0,0.5,2")
    p.add_argument("--s-perp", type=_float_list, default=[1.0], help="comma-separated perpendicular scales")
    p.add_argument("--layers", default="all",
                   help="layer sets: 'all', '0-3', '0,2;4-5', '-1' (';' separates sets; negative = from the end)")
    p.add_argument("--random", default=None,
                   help="random per-layer s_par settings beside the grid: 'DIST:SEED[,SEED...]' items separated by "
                        "';', DIST uniform (on [0, 2]) or gaussian (mean 1, sd 1/3, truncated to [0, 2]), "
                        "e.g. 'uniform:0,1,2;gaussian:0'")
    _common(p, max_sequences=32, seq_len=128)
    p.add_argument("--stack", type=_positive_int, default=1, help="settings per forward (stacked on the batch)")
    p.add_argument("--out", required=True, help="output directory (sweep.csv, sweep.html; resumes if interrupted)")
    p.add_argument("--restart", action="store_true",
                   help="discard an unfinished sweep in --out instead of resuming it")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.add_argument("--quiet", action="store_true", help=_HELP["quiet"])
    p.set_defaults(func=_cmd_sweep)
