"""Point the studies' page writer at a sandbox copy of the committed data (tests only)."""

from __future__ import annotations

import sys
from pathlib import Path

from studies.claims import data as claims_data

DATA, PAGES, ROOT = claims_data.DATA, claims_data.PAGES, claims_data.ROOT


def redirect(monkeypatch, data: Path, pages: Path, root: Path) -> None:
    """Every loaded ``studies`` module's ``DATA`` / ``PAGES`` / ``ROOT`` (each module binds its
    own name) pointed at ``data`` / ``pages`` / ``root`` for the test."""
    new = {"DATA": data, "PAGES": pages, "ROOT": root}
    for name, mod in list(sys.modules.items()):
        if name == "studies" or name.startswith("studies."):
            for attr, value in (("DATA", DATA), ("PAGES", PAGES), ("ROOT", ROOT)):
                if getattr(mod, attr, None) == value:
                    monkeypatch.setattr(mod, attr, new[attr])
