"""``tl-directional compress-check`` (the label-free CI gate) and ``tl-directional compress``."""

from __future__ import annotations

import json
from pathlib import Path

from ..model.inputs import load_text_sequences
from .options import (
    _HELP,
    _claim_out,
    _DefaultsHelp,
    _load_checked,
    _model_help,
    _positive_int,
)


def _cmd_compress_check(args) -> int:
    """A user's mistake raises (``main`` prints it: one line, exit 2); a failed gate returns 1."""
    from contextlib import nullcontext

    claim = _claim_out(args.report, "compress-check", args.force, "--report") if args.report is not None \
        else nullcontext()
    with claim:  # checked and locked before any model work
        return _compress_check_locked(args)


def _compress_check_locked(args) -> int:
    from ..compression.gate import compress_check

    dense = _load_checked(args.dense, "--dense")
    compressed = _load_checked(args.compressed, "--compressed")
    batch = load_text_sequences(dense, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len,
                                text_argument="--text", seq_len_argument="--seq-len")
    result = compress_check(dense, compressed, batch, max_perp_error=args.max_perp_error, component=args.component,
                            mode=args.mode, metric=args.metric, batch_size=args.batch_size,
                            fail_on_removed_update=not args.allow_removed_updates,
                            dense_name=str(args.dense), compressed_name=str(args.compressed))
    summary = result.summary(args.top).splitlines()
    # --quiet: the verdict and its reasons only (a CI log's one line)
    print("\n".join(summary if not args.quiet else [summary[0]] + [ln for ln in summary if ln.startswith("reason: ")]))
    if args.report is not None:
        page = result.write_report(args.report, overwrite=args.force)
        print(f"wrote {page} and {Path(args.report) / 'geometry.csv'}")
    return result.exit_code


def _cmd_compress(args) -> int:
    with _claim_out(args.out, "compress", args.force):  # checked and locked before any model work
        return _compress_locked(args)


def _compress_locked(args) -> int:
    from ..compression.compressors import compress
    from ..compression.save import save_compressed

    model = _load_checked(args.model, "--model")
    calibration = None
    if args.spec.split(":")[0].strip().lower() in ("wanda", "wanda_perp", "wanda_par", "awq"):
        calibration = load_text_sequences(model, args.calib_text, max_sequences=args.calib_sequences,
                                          seq_len=args.seq_len, text_argument="--calib-text",
                                          seq_len_argument="--seq-len")
    result = compress(model, args.spec, calibration=calibration)
    path = save_compressed(result.model, args.out, result.record, force=args.force,
                           force_hint="pass --force")
    print(f"{result.record.label}: {len(result.record.weights)} weights in layers {result.record.layers}; "
          f"stats {json.dumps({k: round(v, 4) for k, v in result.record.stats.items()})}")
    print(f"wrote {path}")
    return 0


def _add_compress_commands(sub, positive_int) -> None:
    """Add ``compress-check`` and ``compress`` to the ``tl-directional`` sub-parsers."""
    from ..compression.gate import GATE_COMPONENTS, GATE_METRICS
    from ..compression.geometry import MODES
    from ..compression.specs import SPEC_HELP

    p = sub.add_parser(
        "compress-check", formatter_class=_DefaultsHelp,
        help="label-free CI gate: exit 0 when the compressed model's perpendicular layer error stays "
             "within a threshold, 1 when not (2 on bad input)")
    p.add_argument("--dense", required=True, help="dense model: HF directory, or " + _model_help())
    p.add_argument("--compressed", required=True, help="compressed model: HF directory")
    p.add_argument("--text", default=None, help="UTF-8 text file (default: bundled held-out KJV slice)")
    p.add_argument("--max-perp-error", type=float, required=True, help="threshold on the metric, e.g. 0.2")
    p.add_argument("--component", choices=GATE_COMPONENTS, default="block", help="which updates to check")
    p.add_argument("--mode", choices=MODES, default="local",
                   help="local: each unit fed the dense run's input (its own error); global: both "
                        "models end to end on the same tokens (earlier errors carried forward)")
    p.add_argument("--metric", choices=GATE_METRICS, default="err_perp_energy",
                   help="the per-(layer, unit) error the threshold applies to")
    p.add_argument("--allow-removed-updates", action="store_true",
                   help="do not fail on components whose compressed update is exactly zero (dropped layers)")
    p.add_argument("--max-sequences", type=positive_int, default=32, help=_HELP["max_sequences"])
    p.add_argument("--seq-len", type=positive_int, default=128, help=_HELP["seq_len"])
    p.add_argument("--batch-size", type=positive_int, default=8, help=_HELP["batch_size"])
    p.add_argument("--top", type=positive_int, default=10, help="worst rows shown")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line and its reasons")
    p.add_argument("--report", default=None, help="directory for report.html + geometry.csv")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.set_defaults(func=_cmd_compress_check)

    p = sub.add_parser("compress", formatter_class=_DefaultsHelp,
                       help="compress a model's weights and save it as a HF directory (bridge lane)")
    p.add_argument("--model", default="default", help=_model_help())
    p.add_argument("--spec", required=True, help=SPEC_HELP)
    p.add_argument("--out", required=True, help="output directory (written beside it, then swapped in)")
    p.add_argument("--force", action="store_true",
                   help="replace --out even when it holds files that are not a previous compress output")
    p.add_argument("--calib-text", default=None, help="calibration text for wanda / awq (default: bundled text)")
    p.add_argument("--calib-sequences", type=positive_int, default=32,
                   help="calibration sequences of --calib-text (wanda / awq)")
    p.add_argument("--seq-len", type=positive_int, default=128, help=_HELP["seq_len"])
    p.set_defaults(func=_cmd_compress)


def add_parser(sub) -> None:
    _add_compress_commands(sub, _positive_int)
