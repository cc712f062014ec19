"""Command line: ``tl-directional <command>``.

Commands:
    profile   per-layer / per-head geometry of a model over a text, as tables and CSV/parquet.
    sweep     component-scaling sweep: loss / perplexity / KL / top-1 per edit setting, CSV + figure.
    report    one self-contained offline HTML page (profile, head maps, sweep, attention triptych) + CSVs.
    train     train a GPT-2 with an edit active (baseline | vpara | attn-para); see tl_directional.train.
    experiment  all variants x seeds, validation curves, paired table; see tl_directional.experiment.
    compress-check  label-free CI gate on a compressed model's perpendicular layer error (exit 0 / 1).
    compress  compress a model's weights (rtn / awq / magnitude / wanda / svd / drop), save a HF directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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


def load_text_sequences(model, text_file: str | None, *, max_sequences: int, seq_len: int):
    """Token sequences of at most ``seq_len`` tokens from ``text_file`` (default: the
    bundled held-out KJV slice), at most ``max_sequences`` of them."""
    from .corpus import heldout_text
    from .inputs import pad_sequences, tokenize

    if text_file is None:
        text = heldout_text()
    else:
        path = Path(text_file)
        if not path.is_file():
            raise SystemExit(f"error: --text {text_file}: no such file")
        text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise SystemExit(f"error: --text {text_file or '(bundled held-out text)'} is empty")
    # One long token stream cut into windows: every window is full, so no padding is needed.
    stream = tokenize(model, [text], prepend_bos=False, max_length=10**9).tokens[0]
    bos = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    body = seq_len - 1 if bos is not None else seq_len
    seqs = []
    for start in range(0, stream.numel() - 1, body):
        chunk = stream[start:start + body].tolist()
        if len(chunk) < 2:
            break
        seqs.append(([int(bos)] if bos is not None else []) + chunk)
        if len(seqs) >= max_sequences:
            break
    return pad_sequences(seqs, pad_id=0, padding_side="right")


def _cmd_profile(args) -> int:
    import pandas as pd

    from .measure import profile
    from .models import load_model

    model = load_model(args.model)
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
    prof = profile(model, batch, batch_size=args.batch_size, exclude_first_token=args.exclude_first_token,
                   progress=not args.quiet)
    out = prof.save(args.out, format=args.format)
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.precision", 3):
        cols = ["layer", "component", "count", "par_frac_median", "par_perp_ratio_median", "alpha_mean",
                "rel_update_median", "energy_ratio"]
        print(f"model: {prof.metadata['model_name']}  tokens: {prof.metadata['tokens_seen']}  "
              f"lane: {prof.metadata['lane']}  arch: {prof.metadata['architecture']}")
        print(prof.residual[cols].to_string(index=False))
        print()
        vcols = ["layer", "head", "beta_mean", "A_tt_mean", "gamma_mean", "phi_mean", "energy_ratio_full",
                 "factorization_error_max"]
        print(prof.value[vcols].to_string(index=False))
    print(f"\nwrote {out}/residual.{args.format}, value.{args.format}, metadata.json")
    return 0


def _layer_sets(text: str) -> list:
    """``"all"`` -> [None]; ``"0-3;5"`` -> [[0, 1, 2, 3], [5]] (``;`` separates sets)."""
    out = []
    for part in text.split(";"):
        part = part.strip()
        if not part or part == "all":
            out.append(None)
            continue
        layers = []
        for piece in part.split(","):
            if "-" in piece.strip()[1:]:
                a, b = piece.split("-", 1)
                layers += list(range(int(a), int(b) + 1))
            else:
                layers.append(int(piece))
        out.append(layers)
    return out


def _cmd_sweep(args) -> int:
    from .models import load_model
    from .sweep import grid, sweep, sweep_figure

    model = load_model(args.model)
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
    settings = grid(args.space, s_par=args.s_par, s_perp=args.s_perp, layers=_layer_sets(args.layers))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df = sweep(model, batch, settings, batch_size=args.batch_size, stack=args.stack,
               checkpoint=out / "sweep.progress.json", progress=not args.quiet)
    df.to_csv(out / "sweep.csv", index=False)
    sweep_figure(df).write_html(out / "sweep.html", include_plotlyjs=True)
    cols = ["label", "tokens", "loss", "delta_loss", "delta_ppl", "kl", "top1_agree"]
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"\nwrote {out}/sweep.csv and {out}/sweep.html")
    return 0


def _cmd_report(args) -> int:
    from .models import load_model
    from .report import build_report

    model = load_model(args.model)
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
    page = build_report(model, batch, args.out, spaces=[s for s in args.space.split(",") if s.strip()],
                        s_par=args.s_par, layer=args.layer, head=args.head, batch_size=args.batch_size,
                        model_label=args.model, progress=not args.quiet)
    print(f"wrote {page} (open it in a browser; it needs no network) and the CSVs beside it")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tl-directional", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile", help="per-layer and per-head geometry over a text")
    p.add_argument("--model", default="default", help="'default', a local HF directory, or a TL model name")
    p.add_argument("--text", default=None, help="UTF-8 text file (default: bundled held-out KJV slice)")
    p.add_argument("--max-sequences", type=_positive_int, default=32)
    p.add_argument("--seq-len", type=_positive_int, default=128)
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--exclude-first-token", action="store_true", help="leave BOS out of every statistic")
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_profile)

    from .sweep import SPACES

    p = sub.add_parser("sweep", help="component-scaling sweep over edit spaces and scales")
    p.add_argument("--model", default="default", help="'default', a local HF directory, or a TL model name")
    p.add_argument("--text", default=None, help="UTF-8 text file (default: bundled held-out KJV slice)")
    p.add_argument("--space", default="value,resid-attn,resid-mlp",
                   help="comma-separated edit spaces: " + ", ".join(SPACES))
    p.add_argument("--s-par", type=_float_list, default=[-1.0, 0.0, 0.5, 1.0, 2.0],
                   help="comma-separated parallel scales, e.g. --s-par=-1,0,0.5,2")
    p.add_argument("--s-perp", type=_float_list, default=[1.0], help="comma-separated perpendicular scales")
    p.add_argument("--layers", default="all", help="layer sets: 'all', '0-3', '0,2;4-5' (';' separates sets)")
    p.add_argument("--max-sequences", type=_positive_int, default=32)
    p.add_argument("--seq-len", type=_positive_int, default=128)
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--stack", type=_positive_int, default=1, help="settings per forward (stacked on the batch)")
    p.add_argument("--out", required=True, help="output directory (sweep.csv, sweep.html; resumes if interrupted)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("report", help="self-contained offline HTML report with the CSVs behind each figure")
    p.add_argument("--model", default="default", help="'default', a local HF directory, or a TL model name")
    p.add_argument("--text", default=None, help="UTF-8 text file (default: bundled held-out KJV slice)")
    p.add_argument("--out", required=True, help="output directory (index.html, one CSV per figure, profile/)")
    p.add_argument("--max-sequences", type=_positive_int, default=8)
    p.add_argument("--seq-len", type=_positive_int, default=64)
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--space", default="value,resid-attn,resid-mlp,hard-diag",
                   help="comma-separated sweep spaces: " + ", ".join(SPACES))
    p.add_argument("--s-par", type=_float_list, default=[0.0, 0.5, 1.0, 1.5], help="sweep scales, e.g. --s-par=-1,0,1")
    p.add_argument("--layer", type=int, default=None, help="triptych layer (default: the most self-attending head)")
    p.add_argument("--head", type=int, default=None, help="triptych head")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_report)

    from .compress_geometry import add_cli_commands as _add_compress_commands

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
    args = build_parser().parse_args(_join_list_options(argv))
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
