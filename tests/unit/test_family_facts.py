"""Model-family facts come from the family records (issue 36): which families are encoders and
which normalise each sub-layer output, asked of a model the way the package asks it."""

from __future__ import annotations

from types import SimpleNamespace

from tl_directional.model.families import REGISTRY
from tl_directional.model.handle import is_encoder
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


def test_the_plain_transformers_lane_reads_its_module_paths_from_the_family_records():
    """``hf_layout`` keeps no table of its own: the model types it edits and their module paths are
    each family record's ``hf_modules``, and the sandwich fact agrees with the family's layout."""
    from tl_directional.model.hf_layout import MODEL_TYPES

    on_hf = {name for name, f in REGISTRY.items() if f.hf_modules is not None}
    assert on_hf == {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma3", "neox"}
    assert dict(MODEL_TYPES) == {t: REGISTRY[n].hf_modules for n in on_hf for t in REGISTRY[n].model_types}
    for name in on_hf:
        f = REGISTRY[name]
        assert f.hf_modules.sandwich == f.sandwich, name
        assert (f.hf_modules.mlp_norm is None) == f.layout.parallel, name
