"""Loader of the local ``tld_kjv_cloze`` task: the jsonl next to this file as a test split."""

from __future__ import annotations

import json
from pathlib import Path

DATA_FILE = Path(__file__).with_name("kjv_cloze.jsonl")


def load_cloze(**kwargs):  # noqa: ARG001 - lm-eval passes the task's metadata as keywords
    """``DatasetDict(test=...)`` of the cloze items (context, choices, label)."""
    import datasets

    if not DATA_FILE.is_file():
        raise FileNotFoundError(f"tld_kjv_cloze: {DATA_FILE} is missing; rebuild it with "
                                "python -m studies.data.make_lm_eval_task")
    rows = [json.loads(line) for line in DATA_FILE.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
