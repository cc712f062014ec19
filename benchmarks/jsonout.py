"""One writer for the benchmark commands' ``--json`` documents: indented JSON, non-JSON values as
``str``, written to a temporary file beside the target and moved into place, so a stopped run
never leaves half a document where a committed result was."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: str | Path, doc: dict) -> Path:
    """Write ``doc`` to ``path`` atomically (its folder created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, out)
    return out
