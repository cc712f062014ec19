"""``tl-directional profile``: per-layer / per-head geometry of a model over a text."""

from __future__ import annotations

from ..core.stats import EXACT_QUANTILE_LIMIT
from ..model.inputs import load_text_sequences
from .options import _HELP, _claim_out, _common, _DefaultsHelp, _load_model_arg, _nonnegative_int


def _cmd_profile(args) -> int:
    with _claim_out(args.out, "profile", args.force):  # checked and locked before any model work
        return _profile_locked(args)


def _profile_locked(args) -> int:
    import pandas as pd

    from ..measure import profile

    model = _load_model_arg(args.model)
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len,
                                text_argument="--text", seq_len_argument="--seq-len")
    prof = profile(model, batch, batch_size=args.batch_size, exclude_first_token=not args.include_first_token,
                   progress=not args.quiet, drop_cosine=args.drop_cosine, exact_quantiles=args.exact_quantiles)
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


def add_parser(sub) -> None:

    p = sub.add_parser("profile", help="per-layer and per-head geometry over a text", formatter_class=_DefaultsHelp,
                       description="Per-layer (residual) and per-head (value space) geometry of a model over a text.")
    _common(p, max_sequences=32, seq_len=128)
    p.add_argument("--include-first-token", action="store_true",
                   help="count each sequence's first token (BOS, the attention sink) in the statistics "
                        "(left out by default)")
    p.add_argument("--drop-cosine", action="store_true",
                   help="also report the layer-drop cosine columns drop_rho and drop_cos_distance (about 6%% "
                        "slower)")
    p.add_argument("--exact-quantiles", type=_nonnegative_int, default=EXACT_QUANTILE_LIMIT, metavar="N",
                   help="values kept per metric and layer / head for exact quantiles; past N, or with 0, the "
                        "quantiles come from fixed histograms (0: memory flat in the text's length)")
    p.add_argument("--format", choices=("csv", "parquet"), default="csv", help="table file format")
    p.add_argument("--out", required=True, help="output directory (residual, value tables and metadata.json)")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.add_argument("--quiet", action="store_true", help=_HELP["quiet"])
    p.set_defaults(func=_cmd_profile)
