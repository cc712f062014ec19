"""The RULER-style long-context probe (protocol sec. 13): ``python -m studies run ruler-probe
--model NAME --pilot`` scores the pilot (seed 1, 512 tokens, every rung, unedited) and picks each
task's rung; without ``--pilot`` the main items (seed 0, 40 haystacks at 256-2,048 tokens, the
pilot's rungs) under the unedited model and sec. 13.3's six edits, into
``docs/results/data/ruler[-pilot]_<model>.*``; refuses a dirty ``tl_directional/`` or ``studies/``.

    python -m studies run ruler-probe --model smollm2-135m --pilot
    python -m studies run ruler-probe --model smollm2-135m --resume

Sec. 13.8's shared-prefix scorer and sec. 13.10's CPU design (TransformerLens 2, ``.venv-legacy``)::

    python -m studies run ruler-probe --model smollm2-135m --design cpu --scorer shared-prefix --lengths 256
"""

from __future__ import annotations

import argparse

from studies import common
from studies.claims.run import SOURCES
from studies.registry import study
from studies.ruler.run import run


@study("ruler-probe", "RULER-style long-context items (needles, variable tracking, common words) under "
       "the edits: protocol sec. 13", data="ruler-pilot_<model>.*, ruler_<model>.*, ruler-cpu_<model>.*",
       pages="ruler-pilot_<model>.md, ruler_<model>.md, ruler-cpu_<model>.md")
def main(argv=None) -> int:
    r = argparse.ArgumentParser(prog="python -m studies run ruler-probe", description=__doc__.split("\n")[0])
    r.add_argument("--model", required=True, choices=[*sorted(SOURCES), "default"],
                   help="default (the bundled model): smoke runs only")
    r.add_argument("--pilot", action="store_true", help="sec. 13.2's pilot (seed 1, 512 tokens, every rung)")
    r.add_argument("--design", choices=["full", "cpu"], default="full",
                   help="main run: full (sec. 13.1, 40 haystacks at every length) or cpu (sec. 13.10: the same "
                        "items, the first haystacks of each length; data ruler-cpu_<model>.*)")
    r.add_argument("--lengths", nargs="+", type=int, default=None,
                   help="run only these of the design's lengths (the items are the whole design's)")
    r.add_argument("--haystacks", type=int, default=0, help="smoke runs only: fewer haystacks than the design")
    r.add_argument("--smoke-lengths", nargs="+", type=int, default=None,
                   help="smoke runs only: the design's lengths replaced (a model with a short context)")
    r.add_argument("--batch-size", type=int, default=4, help="sequences per forward (4: one item's candidates)")
    r.add_argument("--scorer", choices=["batched", "shared-prefix"], default="batched",
                   help="batched: an item's four candidates as four full forwards (sec. 13.6); shared-prefix: "
                        "its prompt run once into a KV cache, TransformerLens 2 only (sec. 13.8)")
    r.add_argument("--device", default="cpu", help="where the model runs (cuda: sec. 13.10's full design on a GPU)")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--data-dir", default="", help="write the data files here (smoke runs)")
    r.add_argument("--tag", default="", help="a suffix of the data files' names, for a run split over processes")
    r.add_argument("--allow-dirty", action="store_true", help="for smoke runs only: the builder refuses such data")
    r.add_argument("--items-cache", default="",
                   help="folder keeping the generated items by their inputs' sha256 (default "
                        "$TL_DIRECTIONAL_CACHE/ruler-items; none: generate every time)")
    r.add_argument("--resume", action="store_true",
                   help="keep the lengths an earlier run of the same data files finished and run the rest")
    args = r.parse_args(argv)
    if args.pilot and args.design != "full":
        r.error(f"--design {args.design}: the pilot has one design (sec. 13.2); drop --design")
    if args.pilot and args.items_cache:
        r.error(f"--items-cache {args.items_cache}: the pilot's items are not cached (the main run's are); drop it")
    if args.haystacks < 0:
        r.error(f"--haystacks {args.haystacks}: must be 1 or more (0: the design's)")
    return run(args)


if __name__ == "__main__":
    common.run_main(main)
