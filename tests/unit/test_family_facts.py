"""Model-family facts come from the family records (issue 36): which families are encoders and
which normalise each sub-layer output, asked of a model the way the package asks it."""

from __future__ import annotations

from types import SimpleNamespace

from tl_directional.model.families import REGISTRY
from tl_directional.model.handle import is_encoder
from tl_directional.model.structure import is_sandwich_norm, model_facts


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


def test_model_facts_read_once_agree_with_each_question():
    """``model_facts`` (what resolve_sites reads, the architecture name read once) gives the
    same answers as the separate predicates, for every family and for names outside the registry."""
    names = [f.hf_class for f in REGISTRY.values()] + ["DistilBertForMaskedLM", "Olmo3ForCausalLM", "SomeNew", ""]
    for name in names:
        model = _model(name)
        facts = model_facts(model)
        assert (facts.architecture, facts.encoder, facts.sandwich, facts.parallel) == (
            name, is_encoder(model), is_sandwich_norm(model), False), name
        assert facts.family is next((f for f in REGISTRY.values() if f.hf_class == name), None), name


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
