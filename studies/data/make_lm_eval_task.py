"""Build the local lm-evaluation-harness task ``tld_kjv_cloze`` from the bundled held-out KJV text.

Each item is a cloze: a context of the held-out text (the ~160 characters before a word, cut at a
word boundary) and four one-word choices, the word that follows in the text and three distractors
drawn from the text's other words of about the same frequency (3+ letters, within 25 places of the
answer in the frequency ranking, never the answer in any case), so that word frequency alone does not
pick the answer and the context has to. Positions, distractors
and the answer's slot are drawn from one seeded generator, so the output is a pure function of
``--seed``, ``--n`` and the text (whose sha256 is recorded in the task's metadata).

    python -m studies.data.make_lm_eval_task --n 80 --seed 0 --out tl_directional/data/lm_eval/tld_kjv_cloze

writes ``kjv_cloze.jsonl`` (one item a line: context, choices, label) and ``build.json`` there; the
YAML and its loader (``tld_kjv_cloze.yaml``, ``_loader.py``) live next to them in the repository.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from studies import common

WORD = re.compile(r"[A-Za-z]+")
CONTEXT_CHARS = 160
NEIGHBOURS = 25


def build_items(text: str, n: int, seed: int) -> list[dict]:
    """``n`` cloze items from ``text`` (see the module docstring); raises if the text is too short."""
    words = [(m.start(), m.group()) for m in WORD.finditer(text)]
    counts: dict[str, int] = {}
    for _, w in words:
        if len(w) >= 3:
            counts[w] = counts.get(w, 0) + 1
    vocab = sorted(counts, key=lambda w: (-counts[w], w))  # by frequency, ties alphabetical
    rank = {w: i for i, w in enumerate(vocab)}
    candidates = [i for i, (start, w) in enumerate(words) if len(w) >= 3 and start >= CONTEXT_CHARS]
    if len(candidates) < n or len(vocab) < 10:
        raise ValueError(f"--n {n}: the text has only {len(candidates)} usable positions; pass a smaller --n")
    rng = random.Random(seed)
    picked = sorted(rng.sample(candidates, n))
    items = []
    for i in picked:
        start, answer = words[i]
        raw = text[start - CONTEXT_CHARS:start]
        cut = raw.find(" ")
        context = " ".join(raw[cut + 1:].split())  # from a word boundary, whitespace collapsed
        distractors: list[str] = []
        r = rank[answer]
        near = vocab[max(0, r - NEIGHBOURS):r + NEIGHBOURS + 1]
        while len(distractors) < 3:
            w = rng.choice(near)
            if w.lower() != answer.lower() and w.lower() not in (d.lower() for d in distractors):
                distractors.append(w)
        label = rng.randrange(4)
        choices = distractors[:label] + [answer] + distractors[label:]
        items.append({"context": context, "choices": choices, "label": label})
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=80, help="number of items (default 80)")
    ap.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    ap.add_argument("--out", type=Path, default=Path("tl_directional/data/lm_eval/tld_kjv_cloze"))
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"--n must be >= 1, got {args.n}")
    from tl_directional.io.corpus import heldout_paths, heldout_text

    text = heldout_text()
    items = build_items(text, args.n, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "kjv_cloze.jsonl", "w") as f:
        for item in items:
            f.write(json.dumps(item, sort_keys=True) + "\n")
    text_path = heldout_paths()[0]
    # the committed build.json names the script by its old path; kept, so a rebuild is byte-identical
    info = {"script": "scripts/make_lm_eval_task.py", "n": args.n, "seed": args.seed,
            "source": text_path.name, "source_sha256": common.sha256_bytes(text.encode()),
            "context_chars": CONTEXT_CHARS, "choices": 4, "distractor_rank_window": NEIGHBOURS}
    (args.out / "build.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(items)} items to {args.out / 'kjv_cloze.jsonl'}")
    return 0


if __name__ == "__main__":
    common.run_main(main)
