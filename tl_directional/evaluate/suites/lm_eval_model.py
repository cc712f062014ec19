"""The lm-evaluation-harness model ``tl-directional``: a local HF model with edits installed.

``TLDirectionalLM(pretrained=DIR, edits=SPEC)`` is lm-eval's ``HFLM`` around
:func:`tl_directional.model.load.load_hf_model` (eager attention, float32 by default) with the
edits of ``SPEC`` installed by :func:`tl_directional.edit.hf.install_edits` for the model's
lifetime. ``SPEC`` is a ``sweep.csv`` row label (:mod:`tl_directional.evaluate.sweeps.edit_spec`), e.g.
``value[s_par=0,s_perp=1,L=all]``; ``pretrained=default`` is the bundled model. The same model,
tokenizer, batch size and edits give exactly the numbers of
:func:`tl_directional.evaluate.suites.lm_eval_task.evaluate_edited` (the Python route).

Importing this module registers the class under :data:`MODEL_NAME` in lm-eval's model
registry. lm-eval 0.4.13's own ``lm_eval`` command imports no plugins (no entry points, no
``--include_package``), so the command line that finds it is ``tl-directional-lm-eval``
(:mod:`tl_directional.cli.lm_eval`): lm-eval's command line, unchanged, after this import.
"""

from __future__ import annotations

import logging
from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ...core.errors import TLDirectionalError
from ...edit.carrier import MLPCarrierScale
from ...edit.hf.carrier import install_carrier_edits
from ...edit.hf.edits import install_edits
from ...model.load import default_model_dir, load_hf_model
from ..sweeps.edit_spec import parse_edit_spec

MODEL_NAME = "tl-directional"
_DTYPES = ("float32", "bfloat16", "float16")
_log = logging.getLogger(__name__)


class ModelArgsError(TLDirectionalError, ValueError):
    """A ``--model_args`` value the ``tl-directional`` model cannot use (named in the message)."""


def _resolve_device(device: str | None) -> str:
    import torch

    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        # lm_eval's command line defaults to --device cuda:0; HFLM falls back the same way
        _log.warning("tl-directional: device=%s is not available here; evaluating on cpu", device)
        return "cpu"
    return str(device)


@register_model(MODEL_NAME)
class TLDirectionalLM(HFLM):
    """``HFLM`` on a local Hugging Face model directory with tl_directional edits active.

    Args:
        pretrained: a local HF model directory, or ``"default"`` for the bundled model.
        edits: an edit spec (:data:`tl_directional.evaluate.sweeps.edit_spec.GRAMMAR`); empty: no edit.
        dtype: parameter dtype, one of ``float32`` (default), ``bfloat16``, ``float16``.
        device: where the model runs (lm_eval passes its ``--device``; CUDA falls back to
            the CPU where there is none).
        **kwargs: passed on to ``HFLM`` (``batch_size``, ``max_length``, ...).
    """

    def __init__(self, pretrained: str = "default", edits: str = "", dtype: str = "float32",
                 device: str | None = None, **kwargs: Any):
        from pathlib import Path

        import torch
        from transformers import AutoConfig, AutoTokenizer

        if str(dtype) not in _DTYPES:
            raise ModelArgsError(f"dtype={dtype!r}: choose one of {', '.join(_DTYPES)}")
        path = default_model_dir() if str(pretrained) == "default" else Path(str(pretrained)).expanduser()
        if not path.is_dir():
            raise ModelArgsError(f"pretrained={str(pretrained)!r} is not a directory; pass a local Hugging Face "
                                    "model directory, or pretrained=default for the bundled model")
        try:  # the layer count from config.json: a bad spec (or a random row's) fails before the weights load
            n_layers = int(AutoConfig.from_pretrained(str(path)).num_hidden_layers)
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelArgsError(f"pretrained={str(path)!r}: its config.json cannot be read ({exc})") from None
        settings = parse_edit_spec(edits, n_layers)
        device = _resolve_device(device)
        try:
            model = load_hf_model(path, device=device, dtype=getattr(torch, str(dtype)))
        except (TLDirectionalError, OSError, RuntimeError, ValueError) as exc:
            # a truncated or damaged weight file: one error line, not lm-eval's traceback
            raise ModelArgsError(f"pretrained={str(path)!r} cannot be loaded: {' '.join(str(exc).split())}") from None
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        super().__init__(pretrained=model, tokenizer=tokenizer, **kwargs)
        self.edit_settings = settings
        self.model_path = str(path)
        edits_ = [e for s in settings for e in s.edits()]
        # the MLP carrier edits hook other modules, installed as a group of their own (as apply_edits does)
        carrier = [e for e in edits_ if isinstance(e, MLPCarrierScale)]
        others = [e for e in edits_ if not isinstance(e, MLPCarrierScale)]
        self.edit_handles = ([install_edits(model, *others)] if others else []) + (
            [install_carrier_edits(model, *carrier)] if carrier else [])

    def get_model_info(self) -> dict:
        """What lm-eval records about the model (offline: HFLM's version asks the hub for a sha)."""
        model = self._model
        return {"model_num_parameters": sum(p.numel() for p in model.parameters()),
                "model_dtype": str(model.dtype), "model_path": self.model_path,
                "tl_directional_edits": [s.label for s in self.edit_settings]}


__all__ = ["MODEL_NAME", "ModelArgsError", "TLDirectionalLM"]
