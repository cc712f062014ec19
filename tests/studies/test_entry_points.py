"""The commands the committed pages cite still run: ``python scripts/NAME.py SUB ...`` (cited by
docs/results/*.md, built before the studies package existed and kept byte for byte) forwards
to ``python -m studies ...``. Every cited command has a route, and every route names a study the
registry holds or a module that imports."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from studies import cli as _registers_every_study  # noqa: F401  (each study registers on import)
from studies.registry import STUDIES

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"python (?:\S*/)?scripts/(\w+)\.py (\w+)")


def _routes(name: str) -> dict[str, list[str]]:
    tree = ast.parse((ROOT / "scripts" / f"{name}.py").read_text(encoding="utf-8"))
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "ROUTES")
    return ast.literal_eval(node)


def _cited() -> set[tuple[str, str]]:
    pages = [*ROOT.glob("docs/**/*.md"), ROOT / "README.md"]
    return {m.groups() for p in pages for m in CITED.finditer(p.read_text(encoding="utf-8"))}


def test_every_cited_command_has_a_route():
    cited = _cited()
    assert ("claims", "run") in cited  # the pages do cite them
    missing = [f"scripts/{s}.py {sub}" for s, sub in sorted(cited)
               if not (ROOT / "scripts" / f"{s}.py").is_file() or sub not in _routes(s)]
    assert not missing, f"cited commands with no entry point: {missing}"


def test_every_route_reaches_a_study_or_a_module():
    for path in sorted((ROOT / "scripts").glob("*.py")):
        if path.stem == "forward":
            continue
        for sub, route in _routes(path.stem).items():
            if route[:2] == ["studies", "run"]:
                assert route[2] in STUDIES, f"scripts/{path.name} {sub}: no study {route[2]!r}"
            elif route[0] != "studies":
                importlib.import_module(route[0])


@pytest.mark.parametrize("argv", [["claims.py", "run", "--help"], ["claims.py"]])
def test_an_entry_point_runs_from_anywhere(tmp_path, argv):
    """From another directory (the repository root is not the working directory)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / argv[0]), *argv[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    if len(argv) == 1:
        assert proc.returncode == 2 and "python -m studies run claims" in proc.stderr
    else:
        assert proc.returncode == 0 and "python -m studies run claims" in proc.stdout, proc.stderr


def test_a_device_this_machine_lacks_is_one_error_line(monkeypatch):
    """``--device`` (the RULER probe's, for sec. 13.10's GPU design) is checked before any model
    loads: a device torch cannot build, or CUDA on a machine without it, is one ``error:`` line
    naming the value and the fix, exit status 2, never torch's traceback."""
    import torch

    from studies.runner import device_problem

    assert device_problem("cpu") is None
    assert "not a torch device" in device_problem("gpu0") and "cpu, cuda or cuda:N" in device_problem("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "--device cpu" in device_problem("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device_problem("cuda:0") is None and "cuda:0 to cuda:0" in device_problem("cuda:3")
