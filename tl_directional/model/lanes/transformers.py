"""The plain ``transformers`` lane: a Hugging Face ``PreTrainedModel`` (an ``nn.Module`` with a
``config``) with no TransformerLens hook points.

The edits go on such a model as torch module hooks (:mod:`tl_directional.edit.hf`, whose sites
come from each family's ``hf_modules``, :mod:`tl_directional.model.hf_layout`); the lane says so
with :attr:`TransformersLane.hook_kind` ``"module"``, which :func:`tl_directional.apply_edits`
reads. What needs no hook point the lane does itself: loading a directory or a hub name, the deep
copy, the model as its own Hugging Face model and ``save_pretrained``. What only has a meaning
with TransformerLens hook points (hook names, extra hook points, a forward from block ``L``,
the unembedding's hook, TL-format weights) raises :class:`NoHookPointsError`, which names the
operation and the fix: load the model through TransformerLens with ``tl_directional.load_model``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from ...core.errors import TLDirectionalError
from ..families.hf import from_pretrained_kwargs, hf_architecture
from .base import BlockInput, Lane, LinearSpec, Unembedding, deep_copy_model, quiet_transformers


class NoHookPointsError(TLDirectionalError, TypeError):
    """An operation that needs TransformerLens hook points was asked of a plain ``transformers``
    model (the ``"transformers"`` lane, :class:`TransformersLane`)."""


class TransformersLane(Lane):
    """A plain ``transformers`` model, no TransformerLens (see the module docstring)."""

    __slots__ = ()
    hf_export = False  # not a wrapped model: to_hf_model is the model itself
    resolves_encoders = False
    requirement = "transformers"
    hook_kind = "module"

    def refuse(self, operation: str) -> NoHookPointsError:
        """The error for ``operation``, which needs TransformerLens hook points."""
        return NoHookPointsError(
            f"{operation} needs TransformerLens hook points, and model is on the {self.name!r} lane (a plain "
            "transformers model, which has none). Load the model through TransformerLens: "
            "model = tl_directional.load_model(path_or_name); edits alone also work on the plain model "
            "(tl_directional.apply_edits).")

    def family_refusal(self, family) -> str:
        if family.hf_modules is not None:
            return ""
        return (f"family {family.name!r} has no edit sites for plain transformers models (its record's "
                "hf_modules is None): load it with tl_directional.load_model and edit the TransformerLens model")

    # -- the model's own structure -------------------------------------------------------------

    def claims(self, model) -> bool:
        # an nn.Module with a config, without TransformerLens's hook API (a bridge has both)
        return (isinstance(model, torch.nn.Module) and getattr(model, "config", None) is not None
                and not hasattr(model, "run_with_hooks"))

    def hook_layout_key(self, model) -> tuple:
        raise self.refuse("resolving hook sites (hook_layout_key)")

    def final_norm_weight(self, model) -> Tensor | None:
        raise self.refuse("final_norm_weight (the gain of ln_final)")

    def linear_inputs(self, model, layer: int, hook_names) -> dict[str, tuple[str, Tensor | None]]:
        raise self.refuse("linear_inputs (the hooks feeding each linear)")

    def linear_weights(self, model, layer: int) -> list[LinearSpec]:
        raise self.refuse("linear_weights (the block's linears in TransformerLens's names)")

    def output_biases(self, model, layer: int) -> list[Tensor]:
        raise self.refuse("output_biases (the biases of attn.o / mlp.out)")

    # -- loading, copying, saving --------------------------------------------------------------

    def boot_by_name(self, name: str, *, device: Any, dtype: torch.dtype):
        import transformers

        with quiet_transformers():
            model = transformers.AutoModelForCausalLM.from_pretrained(name, **from_pretrained_kwargs(dtype))
        return model.to(device).eval()

    def load_dir(self, path, *, device: Any, dtype: torch.dtype):
        import transformers

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

    def clone(self, model):
        return deep_copy_model(model)

    def to_hf_model(self, model):
        return model

    def save_hf_directory(self, model, directory, *, tokenizer: Any = None) -> None:
        with quiet_transformers():
            model.save_pretrained(str(directory))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))

    # -- hooks -----------------------------------------------------------------------------------

    def add_hook_point(self, model, name: str, hook_point) -> None:
        raise self.refuse(f"add_hook_point({name!r})")

    def remove_hook_point(self, model, name: str) -> None:
        raise self.refuse(f"remove_hook_point({name!r})")

    # -- partial forwards and the unembedding ---------------------------------------------------

    @contextlib.contextmanager
    def from_block(self, model, block_input: BlockInput, repeat: int = 1) -> Iterator:
        raise self.refuse(f"from_block (a forward starting at block {block_input.start})")
        yield  # pragma: no cover - a generator, for contextmanager

    def unembedding(self, model) -> Unembedding | None:
        raise self.refuse("unembedding (the hook point the logits follow from)")

    # -- generate --------------------------------------------------------------------------------

    def wrap_generate(self, model, original):
        # transformers' own generate builds its masks and caches from the model's own modules:
        # nothing to fix on this lane.
        return original


__all__ = ["NoHookPointsError", "TransformersLane"]
