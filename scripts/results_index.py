"""Write the real-model table of ``docs/results.md`` from the pages' meta JSONs.

Every real-model page under ``docs/results/`` has a ``<stem>.meta.json`` (written by the
script that made it); this lists one row per page: experiment, model, texts and token
count, command, commit, and the headline reading line. It replaces the ``REAL_TABLE``
marker or the table between ``<!-- real-table -->`` markers.

    python scripts/results_index.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = [  # (page prefix, title, what)
    ("depth_profile", "Depth profile (paper Fig. 2)",
     "energy ratio and median par/perp ratio per layer and component vs the random-direction level, BOS in/out; "
     "per-head beta = A_tt + gamma"),
    ("scaling_sweep", "Component-scaling sweeps",
     "s_par in {-1, 0, 0.5, 2}, s_perp in {0, 0.5, 2} in value-full, value-exclusive, resid-attn, resid-mlp, "
     "resid-both; hard diagonal removal; bootstrap intervals; paper side by side"),
    ("bos_check", "BOS check (why V-Para removal hurts)",
     "the all-layer removals again with the first position spared, paired with the sweep"),
    ("layer_sensitivity", "Per-layer sensitivity",
     "one-layer parallel removal per space, layer x space heat map with intervals"),
    ("compression_study", "Compression diagnostics",
     "Spearman of perpendicular / parallel error, 1-cos, MSE with held-out loss increase across settings"),
]
MODELS = ["smollm2-135m", "gemma-3-270m"]


def rows() -> list[str]:
    out = ["| experiment | model | page | texts (predicted tokens) | command | commit |", "|---|---|---|---|---|---|"]
    for prefix, title, what in EXPERIMENTS:
        for m in MODELS:
            pages = sorted((ROOT / "docs" / "results").glob(f"{prefix}_{m}*.md"))
            if not pages:
                out.append(f"| {title}: {what} | {m} | not run (see below) | | | |")
                continue
            for page in pages:
                meta = json.loads(page.with_name(page.stem + ".meta.json").read_text())
                texts = meta.get("texts")
                if isinstance(texts, dict):
                    tok = ", ".join(f"`{t}` {v.get('tokens', v.get('tokens_bos_in', '?'))}" for t, v in texts.items())
                    if meta.get("safe"):  # the per-layer find_safe_scale search
                        tok = ", ".join(x for x in (tok, f"`{meta['safe']['text']}` {meta['safe']['tokens']} "
                                                    "(safe-scale search)") if x)
                else:
                    tok = f"`{meta.get('text')}` {meta.get('evaluation_predicted_tokens', '?')}"
                out.append(f"| {title}: {what} | {m} | [{page.stem}](results/{page.name}) | {tok} | "
                           f"`{meta['command']}` | `{meta['commit']}` |")
    return out


def main() -> int:
    path = ROOT / "docs" / "results.md"
    text = path.read_text()
    table = "<!-- real-table -->\n" + "\n".join(rows()) + "\n<!-- /real-table -->"
    if "REAL_TABLE" in text:
        text = text.replace("REAL_TABLE", table)
    else:
        text = re.sub(r"<!-- real-table -->.*?<!-- /real-table -->", lambda _: table, text, flags=re.S)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
