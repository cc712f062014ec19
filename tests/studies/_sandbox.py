"""Helpers of the studies' tests: the studies module that was a script, and the page writer
pointed at a sandbox copy of the committed data."""

from __future__ import annotations

import importlib
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


#: the old script names the tests still call modules by -> the studies module now
MODULES = {
    "_common": "studies.common",
    "_realrun": "studies.realrun",
    "accuracy_claims": "studies.accuracy.page",
    "instruments_claims": "studies.instruments.page",
    "instruments_run": "studies.instruments.run",
    "paper_vs_ours": "studies.paper_vs_ours",
    "claims": "studies.claims.cli",
    "ioi_attribution": "studies.explore.ioi_attribution",
}


def load(name: str):
    """The studies module that was ``scripts/<name>.py``."""
    return importlib.import_module(MODULES[name])
