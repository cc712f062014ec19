"""The default model's directory: the bundled pretrained GPT-2, or its seeded stand-in.

The stand-in (:data:`DEFAULT_MODEL_SPEC`, random weights) is built, atomically, only when the
bundled package data is missing, with a :class:`BundledModelMissingWarning`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .paths import bundled_model_dir, cache_dir
from .tiny import BUILD_INFO_FILE, build_tiny_hf_model

#: Shape of the seeded stand-in that ``load_model("default")`` builds and caches.
DEFAULT_MODEL_SPEC: dict[str, Any] = {
    "family": "gpt2",
    "seed": 0,
    "n_layers": 4,
    "d_model": 128,
    "n_heads": 4,
    "n_ctx": 256,
    "vocab_size": 2048,
}


class BundledModelMissingWarning(UserWarning):
    """The bundled pretrained default model is not installed; a random-weight stand-in is used."""


def default_model_dir() -> Path:
    """Directory of the default model: the bundled pretrained GPT-2 (package data, see
    ``docs/default_model.md``). If the package data is missing (a broken install), warns with
    :class:`BundledModelMissingWarning` and falls back to :func:`seeded_default_model_dir`."""
    bundled = bundled_model_dir()
    if bundled is not None:
        return bundled
    import warnings

    warnings.warn(
        "the bundled default model (tl_directional/data/default_model) is missing; using a "
        "seeded RANDOM-WEIGHT stand-in instead. Reinstall tl-directional, or rebuild the model "
        "with `python -m studies.data.train_default_model all --corpus DIR`.",
        BundledModelMissingWarning,
        stacklevel=2,
    )
    return seeded_default_model_dir()


def seeded_default_model_dir() -> Path:
    """Directory of the seeded random-weight stand-in (``DEFAULT_MODEL_SPEC``), building it on
    first use (atomically). Used only when the bundled model is missing.

    The directory name encodes the spec and the ``transformers`` major version, so venvs with
    different ``transformers`` never share (or fight over) one build.
    """
    import transformers

    spec = dict(DEFAULT_MODEL_SPEC)
    key = "{family}-L{n_layers}-d{d_model}-h{n_heads}-ctx{n_ctx}-v{vocab_size}-s{seed}".format(
        **spec
    )
    key += f"-tf{transformers.__version__.split('.')[0]}"
    root = cache_dir() / "seeded-default"
    final = root / key
    if (final / "config.json").is_file() and (final / BUILD_INFO_FILE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename: a concurrent or interrupted build never leaves a
    # half-written directory at `final`.
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        family = spec.pop("family")
        build_tiny_hf_model(family, tmp, **spec)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished first (or a stale dir exists): keep a complete one.
            if not (final / BUILD_INFO_FILE).is_file():
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
