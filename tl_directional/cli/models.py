"""``tl-directional models``: what ``--model`` can load offline; ``--convert NAME`` converts one now."""

from __future__ import annotations

from .errors import UsageError


def _cmd_models(args) -> int:
    import json

    from ..model.load.catalog import RealModelError, listing
    from ..model.load.convert import real_model_dir

    if args.convert:
        try:
            path = real_model_dir(args.convert, progress=not args.quiet)
        except (ValueError, RealModelError) as exc:  # an unknown name, a missing or damaged package,
            # an unwritable cache: the CLI's one error path (one line, exit 2)
            raise UsageError(f"--convert {args.convert}: {exc}") from None
        print(f"{args.convert}: {path}")
        return 0
    rows = listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from ..model.load import cache_dir

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


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="what --model can load offline (installed? converted? size)")
    p.add_argument("--convert", default=None, metavar="NAME",
                   help="convert one real model into the cache now (smollm2-135m, gemma-3-270m)")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar with --convert")
    p.set_defaults(func=_cmd_models)
