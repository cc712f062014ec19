"""``tl-directional report``: one self-contained offline HTML page with the CSVs behind it."""

from __future__ import annotations

from ..model.inputs import load_text_sequences
from .errors import UsageError
from .options import (
    _HELP,
    _check_spaces,
    _claim_out,
    _common,
    _DefaultsHelp,
    _float_list,
    _load_model_arg,
)


def _cmd_report(args) -> int:
    with _claim_out(args.out, "report", args.force):  # checked and locked before any model work
        return _report_locked(args)


def _report_locked(args) -> int:
    from ..model.indices import normalize_index
    from ..views.report import build_report

    spaces = _check_spaces(args.space)
    model = _load_model_arg(args.model)
    try:  # checked before the (slow) profile; negative indices count from the end
        if args.layer is not None:
            normalize_index(args.layer, int(model.cfg.n_layers), "--layer")
        if args.head is not None:
            normalize_index(args.head, int(model.cfg.n_heads), "--head", "head")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    batch = load_text_sequences(model, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len,
                                text_argument="--text", seq_len_argument="--seq-len")
    page = build_report(model, batch, args.out, spaces=spaces,
                        s_par=args.s_par, layer=args.layer, head=args.head, batch_size=args.batch_size,
                        model_label=args.model, progress=not args.quiet, overwrite=args.force)
    print(f"wrote {page} (open it in a browser; it needs no network) and the CSVs beside it")
    return 0


def add_parser(sub) -> None:
    from ..edit import EDIT_SPACES


    p = sub.add_parser("report", help="self-contained offline HTML report with the CSVs behind each figure",
                       formatter_class=_DefaultsHelp, description="One offline HTML page: profile, head maps, sweep, triptych.")
    _common(p, max_sequences=8, seq_len=64)
    p.add_argument("--out", required=True, help="output directory (index.html, one CSV per figure, profile/)")
    p.add_argument("--space", default="value-exclusive-joint,value-exclusive,value,resid-attn,resid-mlp,hard-diag",
                   help="comma-separated sweep spaces: " + ", ".join(EDIT_SPACES))
    p.add_argument("--s-par", type=_float_list, default=[0.0, 0.5, 1.0, 1.5], help="sweep scales, e.g. --s-par=-1,0,1")
    p.add_argument("--layer", type=int, default=None,
                   help="triptych layer, negative = from the end (default: the most self-attending head's)")
    p.add_argument("--head", type=int, default=None, help="triptych head, negative = from the end (default: as --layer)")
    p.add_argument("--force", action="store_true", help=_HELP["force"])
    p.add_argument("--quiet", action="store_true", help=_HELP["quiet"])
    p.set_defaults(func=_cmd_report)
