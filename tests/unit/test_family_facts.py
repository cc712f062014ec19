"""Model-family facts come from the family records (issue 36): which families are encoders and
which normalise each sub-layer output, asked of a model the way the package asks it."""

from __future__ import annotations

from types import SimpleNamespace

from tl_directional.model.adapter import is_encoder
from tl_directional.model.families import REGISTRY
from tl_directional.model.structure import is_sandwich_norm


def _model(architecture: str) -> SimpleNamespace:
    """A stand-in with only what the two questions read: the architecture name, no flag, no blocks."""
    return SimpleNamespace(cfg=SimpleNamespace(architecture=architecture), blocks=[])


def test_each_registered_family_answers_from_its_record():
    encoders = {name for name, f in REGISTRY.items() if is_encoder(_model(f.hf_class))}
    sandwiches = {name for name, f in REGISTRY.items() if is_sandwich_norm(_model(f.hf_class))}
    assert encoders == {name for name, f in REGISTRY.items() if f.encoder} == {"bert"}
    assert sandwiches == {name for name, f in REGISTRY.items() if f.sandwich} == {"gemma2", "gemma3", "olmo2"}


def test_architectures_outside_the_registry_keep_their_answers():
    assert is_encoder(_model("DistilBertForMaskedLM"))
    assert not is_encoder(_model("SomeNewForCausalLM"))
    assert is_sandwich_norm(_model("Gemma3ForConditionalGeneration"))
    assert is_sandwich_norm(_model("Olmo3ForCausalLM"))
    assert not is_sandwich_norm(_model("SomeNewForCausalLM"))
