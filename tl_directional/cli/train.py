"""Command lines of the training workflow: ``tl-directional train`` (one run) and
``tl-directional experiment`` (every variant x seed, then the report).

``python -m tl_directional.training train ...`` / ``... experiment ...`` and the
``tl-directional`` command run them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from ..cli.errors import USER_ERRORS, UsageError, report_user_error
from ..cli.options import _Parser
from ..io.outputs import check_output_path, claim_output
from ..training.checkpoint import checkpoint_paths
from ..training.config import (
    CHECKPOINT_DIR,
    INIT_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    TOKENIZER_DIR,
    VARIANT_SPACES,
    VARIANTS,
    TrainConfig,
)
from ..training.data import load_tokenizer
from ..training.experiment import DEFAULT_SEEDS, EXPERIMENT_DEFAULTS, check_seeds, run_experiment
from ..training.export import EXPORT_NAMES, export_model
from ..training.trainer import train


def add_config_arguments(p: argparse.ArgumentParser, defaults: TrainConfig | None = None) -> None:
    """Add one ``--flag`` per :class:`TrainConfig` field (shared with the experiment runner)."""
    d = defaults or TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(d, f.name)
        if f.name == "variant":
            p.add_argument(flag, choices=tuple(VARIANT_SPACES), default=value)
        elif f.name in ("tokenizer", "corpus"):
            p.add_argument(flag, default=value)
        elif f.name == "d_mlp":
            p.add_argument(flag, type=int, default=value, help="default 4 * d_model")
        else:
            p.add_argument(flag, type=type(value), default=value)


def config_from_args(args: argparse.Namespace, **override: Any) -> TrainConfig:
    """The :class:`TrainConfig` of parsed ``args`` (flags from :func:`add_config_arguments`), with ``override``."""
    data = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    data.update(override)
    return TrainConfig(**data)


def build_train_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="tl-directional train",
        description="Train a GPT-2 with a directional edit active (baseline | vpara | attn-para). "
        "Resumes from the last checkpoint in --out. Use torchrun for several processes.",
    )
    p.add_argument("--out", required=True, help="run directory (created; resumed if it has checkpoints)")
    add_config_arguments(p)
    p.add_argument("--no-resume", action="store_true", help="refuse to continue existing checkpoints")
    p.add_argument("--stop-after", type=int, default=None, help="stop after this step (checkpointed)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="after training, save the model as a Hugging Face directory (bridge lane)")
    p.add_argument("--export-dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--export-force", action="store_true",
                   help="let --export replace a non-empty DIR that is not a previous export")
    p.add_argument("--quiet", action="store_true")
    return p


#: What a training run directory and an experiment directory hold. They carry no manifest
#: (they grow checkpoint by checkpoint and resume), so a rerun recognises its own output by
#: these names; a directory holding anything else is refused.
_RUN_NAMES = frozenset({TOKENIZER_DIR, INIT_DIR, CHECKPOINT_DIR, METRICS_FILE, SUMMARY_FILE})
_EXPERIMENT_NAMES = frozenset({TOKENIZER_DIR, "runs", "profiles", "curves.csv", "final.csv", "geometry.csv",
                               "curves.html", "table.md", "results.json"})


def _has_checkpoint(out: Path) -> bool:
    """A run directory, or an experiment's ``runs/*``, holding a checkpoint to resume."""
    runs = out / "runs"
    return bool(checkpoint_paths(out)) or (runs.is_dir() and any(
        checkpoint_paths(d) for d in runs.iterdir() if d.is_dir()))


@contextmanager
def _claim_run(out: str, kind: str, names: frozenset[str]) -> Iterator[Path]:
    """Check ``--out`` before any work and hold its lock for the whole run (on rank 0 of a
    ``torchrun`` job; the other ranks only check it). A run that fails (or is interrupted)
    before its first checkpoint leaves ``--out`` as it found it: absent or empty."""
    if int(os.environ.get("RANK", "0")) != 0:
        check_output_path(out, "--out")
        yield Path(out)
        return
    with claim_output(out, kind, command=f"tl-directional {kind}", legacy_names=names, force_hint="",
                      argument="--out") as path:
        existed = path.exists()
        fresh = not existed or not any(path.iterdir())
        try:
            yield Path(out)
        except BaseException:
            if fresh and path.is_dir() and not _has_checkpoint(path):
                for child in list(path.iterdir()):  # all written by this run: nothing to resume
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
                if not existed:
                    path.rmdir()
            raise


def train_main(argv: Sequence[str] | None = None) -> int:
    args = build_train_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with ExitStack() as held:  # the outputs stay locked until the run (and its export) ends
            cfg = config_from_args(args)
            held.enter_context(_claim_run(args.out, "train", _RUN_NAMES))
            if args.export is not None and int(os.environ.get("RANK", "0")) != 0:
                check_output_path(args.export, "--export")  # rank 0 writes it
            elif args.export is not None:  # refuse a bad --export before training, not after
                held.enter_context(claim_output(args.export, "export", force=args.export_force,
                                                force_hint="pass --export-force", argument="--export",
                                                legacy_names=EXPORT_NAMES,
                                                command="tl-directional train --export"))
            result = train(cfg, args.out, resume=not args.no_resume, stop_after=args.stop_after,
                           progress=not args.quiet, device=args.device)
            return _after_training(args, cfg, result)
    except USER_ERRORS as err:  # the CLI's one error path: one line 'error: ...', exit 2
        return report_user_error(err)


def _after_training(args, cfg: TrainConfig, result) -> int:
    if int(os.environ.get("RANK", "0")) == 0:
        if result.final_val_loss is not None:
            print(f"{cfg.variant} seed {cfg.seed}: step {result.step}, final validation loss "
                  f"{result.final_val_loss:.4f} ({result.tokens_per_s:.0f} tokens/s)")
        else:
            print(f"{cfg.variant} seed {cfg.seed}: stopped at step {result.step} (checkpointed)")
        if args.export and result.step == cfg.max_steps:
            tokenizer = load_tokenizer(cfg.tokenizer or Path(args.out) / TOKENIZER_DIR)
            try:
                export_model(result.model, tokenizer, args.export, dtype=getattr(torch, args.export_dtype),
                             extra_info={"train_config": cfg.to_dict(), "final_val_loss": result.final_val_loss},
                             force=args.export_force, force_hint="pass --export-force")
            except USER_ERRORS as err:
                return report_user_error(err)
            print(f"exported to {args.export}")
    return 0


def build_experiment_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="tl-directional experiment",
        description="Train baseline / vpara / attn-para over several seeds and compare them "
        "(validation curves, paired final-loss table, pre-edit geometry).",
    )
    p.add_argument("--out", required=True, help="experiment directory (runs/, curves.csv, table.md, ...)")
    p.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="comma-separated seeds")
    p.add_argument("--variants", default=",".join(VARIANTS))
    add_config_arguments(p, EXPERIMENT_DEFAULTS)
    p.add_argument("--profile-windows", type=int, default=16,
                   help="validation windows for the geometry of each trained model (0 = skip)")
    p.add_argument("--report-only", action="store_true", help="only collect finished runs")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quiet", action="store_true")
    return p


def experiment_main(argv: Sequence[str] | None = None) -> int:
    args = build_experiment_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2") from None
        check_seeds(seeds, "--seeds")
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        base = config_from_args(args)
        with _claim_run(args.out, "experiment", _EXPERIMENT_NAMES):  # locked for the whole experiment
            run_experiment(base, args.out, seeds=seeds, variants=variants, progress=not args.quiet,
                           report_only=args.report_only, profile_windows=args.profile_windows)
    except USER_ERRORS as err:
        return report_user_error(err)
    return 0


#: The commands of ``python -m tl_directional.training``.
COMMANDS = {"train": train_main, "experiment": experiment_main}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tl_directional.training {train,experiment} ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        got = repr(argv[0]) if argv else "nothing"
        print(f"usage: python -m tl_directional.training {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return report_user_error(UsageError(f"the first argument must be one of {', '.join(COMMANDS)}, "
                                            f"got {got}; add --help after it for its settings."))
    return COMMANDS[argv[0]](argv[1:])
