"""The lane object (one per kind of model: the two TransformerLens generations and plain
``transformers``), sites resolved once per model, and a ``generate`` that is fixed at load, not by
``apply_edits`` (issue 21; the third lane: issue 49)."""

import pickle
import re
from pathlib import Path

import pytest
import torch

import tl_directional as tld
import tl_directional.model.sites as sites_mod
from tl_directional.evaluate.sweeps import grid, sweep
from tl_directional.model.families import REGISTRY, lane_families
from tl_directional.model.generation import fix_generate, generate_fixed
from tl_directional.model.handle import (
    add_hook_point,
    clone_model,
    from_block,
    remove_hook_point,
    save_hf_directory,
    to_hf_model,
    unembedding,
)
from tl_directional.model.hf_layout import MODEL_TYPES
from tl_directional.model.lanes import (
    BRIDGE,
    LANES,
    LEGACY,
    TRANSFORMERS,
    BlockInput,
    Lane,
    NoHookPointsError,
    installed_lane,
    is_bridge,
    is_plain_transformers,
    lane_named,
    lane_of,
)
from tl_directional.model.load import load_model, tl_lane
from tl_directional.model.weights import final_norm_weight

TEXTS = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]
PACKAGE = Path(tld.__file__).resolve().parent


@pytest.fixture
def resolutions(monkeypatch):
    """The number of real site resolutions (cache misses of resolve_sites) per model id."""
    counts: dict[int, int] = {}
    real = sites_mod._resolve

    def counting(model):
        counts[id(model)] = counts.get(id(model), 0) + 1
        return real(model)

    monkeypatch.setattr(sites_mod, "_resolve", counting)
    return counts


# -- the lane object ------------------------------------------------------------------------------

def test_lane_of_is_the_installed_lane_singleton(tiny_model, lane):
    model = tiny_model("gpt2")
    got = lane_of(model)
    assert isinstance(got, Lane) and got is installed_lane() and got is tl_lane()
    assert got == lane and got.name == lane and type(got.name) is str
    assert got is (BRIDGE if lane == "bridge" else LEGACY)
    assert pickle.loads(pickle.dumps(got)) is got  # records keep the singleton
    assert lane_named(lane) is got
    with pytest.raises(AttributeError):
        got.extra = 1  # frozen
    assert tld.resolve_sites(model, warn=False).lane == lane


def test_lane_named_rejects_unknown_names():
    with pytest.raises(ValueError, match="lane must be one of 'bridge', 'legacy', 'transformers', got 'hooked'"):
        lane_named("hooked")


def test_lane_capabilities(lane):
    here = lane_named(lane)
    assert here.hf_export is (lane == "bridge")
    assert here.resolves_encoders is (lane == "bridge")
    assert here.requirement.startswith("transformer-lens")


def test_no_lane_or_class_name_comparison_outside_the_lanes():
    """Done-when of issue 21: only tl_directional/model/lanes/ compares lane names or TL class names."""
    pattern = re.compile(
        r'(==|!=) *"(bridge|legacy)"|"(bridge|legacy)" *(==|!=)|lane_of\([^)]*\) *(==|!=)'
        r'|\.__name__ *(==|!=|in)\b|\.__name__\.startswith|"(LinearBridge|Conv1D|RMSNorm)"'
        r'|_weights_processed|_W_[KV]\b|_tld_generate|_tld_kv_cache')
    hits = []
    for path in PACKAGE.rglob("*.py"):
        if "lanes" in path.relative_to(PACKAGE).parts:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


# -- resolve once ---------------------------------------------------------------------------------

def test_resolve_sites_is_cached_per_model(tiny_model, resolutions):
    model = tiny_model("gpt2", fresh=True)
    a = tld.resolve_sites(model, warn=False)
    b = tld.resolve_sites(model, warn=False)
    assert a is b and resolutions[id(model)] == 1


def test_one_resolution_per_model_in_a_sweep(tiny_model, resolutions):
    model = tiny_model("gpt2", fresh=True)
    settings = grid("value,resid-attn,resid-mlp,block", s_par=[0.0, 2.0])
    sweep(model, TEXTS, settings, batch_size=2, progress=False)
    assert resolutions == {id(model): 1}


def test_one_resolution_per_model_in_a_report(tiny_model, resolutions, tmp_path):
    from tl_directional.views.report import build_report

    model = tiny_model("gpt2", fresh=True)
    build_report(model, TEXTS, tmp_path / "report", spaces=("value", "resid-attn"), s_par=(0.0,))
    assert resolutions == {id(model): 1}


def test_a_change_that_matters_resolves_again(tiny_model, resolutions):
    model = tiny_model("gpt2", fresh=True)
    first = tld.resolve_sites(model, warn=False)
    with torch.no_grad():  # an in-place weight write (a compressor, weight processing)
        p = next(model.parameters())
        p.mul_(1.0)
    assert tld.resolve_sites(model, warn=False) is not first
    assert resolutions[id(model)] == 2
    from transformer_lens.hook_points import HookPoint

    name = f"{first.units['attn'][0].update_hook}.hook_extra"
    add_hook_point(model, name, HookPoint())  # a hook point added: the layout changed
    try:
        tld.resolve_sites(model, warn=False)
        assert resolutions[id(model)] == 3
    finally:
        remove_hook_point(model, name)
    model.cfg.model_name = "renamed"  # a config field the sites read
    assert tld.resolve_sites(model, warn=False).model_name == "renamed"
    assert resolutions[id(model)] == 4


def test_processing_resolves_again_and_cached_sites_still_warn(tiny_model, lane, resolutions):
    model = tiny_model("gpt2", fresh=True)
    assert not tld.resolve_sites(model, warn=False).weights.any
    if lane == "bridge":
        model.enable_compatibility_mode(disable_warnings=True)
    else:
        model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    assert tld.resolve_sites(model, warn=False).weights.centered_writing_weights  # seen again
    n = resolutions[id(model)]
    with pytest.warns(tld.WeightProcessingWarning, match="processed"):
        tld.resolve_sites(model)  # from the cache, still warned about
    assert resolutions[id(model)] == n


# -- generate: fixed at load or explicitly, never by apply_edits ------------------------------------

def test_apply_edits_leaves_generate_untouched(tiny_model, tiny_model_dir):
    loaded = tiny_model("gpt2")
    assert generate_fixed(loaded)  # load_model fixed it
    before = loaded.__dict__.get("generate")
    with tld.apply_edits(loaded, tld.ValueScale(0.0)):
        assert loaded.__dict__.get("generate") is before
    assert loaded.__dict__.get("generate") is before
    # a model loaded without load_model: apply_edits does not patch it either
    own = lane_of(loaded).load_dir(tiny_model_dir("gpt2"), device="cpu", dtype=torch.float32).eval()
    assert not generate_fixed(own) and "generate" not in own.__dict__
    with tld.apply_edits(own, tld.ValueScale(0.0)):
        assert "generate" not in own.__dict__
    assert "generate" not in own.__dict__
    assert fix_generate(own) is own and generate_fixed(own)  # the explicit call
    installed = own.__dict__["generate"]
    fix_generate(own)
    assert own.__dict__["generate"] is installed  # idempotent


def test_a_clone_of_a_fixed_model_gets_its_own_fixed_generate(tiny_model):
    model = tiny_model("gpt2")
    clone = clone_model(model)
    assert generate_fixed(clone)
    assert clone.__dict__["generate"] is not model.__dict__["generate"]
    prompt = tld.prepare_inputs(clone, TEXTS[:1]).tokens
    with torch.no_grad():
        want = torch.cat([prompt, clone(prompt)[:, -1].argmax(-1, keepdim=True)], dim=1)
    got = clone.generate(prompt, max_new_tokens=1, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(got.cpu(), want.cpu())


# -- the plain transformers lane (issue 49) -------------------------------------------------------

def test_lane_of_each_kind_of_model(tiny_model, tiny_hf_model, lane):
    tl, hf = tiny_model("gpt2"), tiny_hf_model("gpt2")
    assert lane_of(tl) is lane_named(lane) and lane_of(hf) is TRANSFORMERS
    assert list(LANES) == ["bridge", "legacy", "transformers"] and lane_named("transformers") is TRANSFORMERS
    assert TRANSFORMERS == "transformers" and pickle.loads(pickle.dumps(TRANSFORMERS)) is TRANSFORMERS
    assert is_plain_transformers(hf) and not is_plain_transformers(tl)
    assert not is_bridge(hf) and is_bridge(tl) is (lane == "bridge")
    # the capability the edit floor dispatches on, instead of the model's class
    assert TRANSFORMERS.hook_kind == "module" and lane_of(tl).hook_kind == "transformer_lens"
    assert not TRANSFORMERS.hf_export and not TRANSFORMERS.resolves_encoders


@pytest.mark.parametrize("thing", [object(), "gpt2", torch.nn.Linear(2, 2)], ids=["object", "str", "Linear"])
def test_what_is_no_model_is_refused_with_the_accepted_models(thing):
    with pytest.raises(TypeError, match=(
            rf"^dense must be a TransformerLens model \(a TL 4 TransformerBridge or a TL 2.x / 3.x HookedTransformer\) "
            rf"or a plain transformers model \(an nn.Module with a .config, e.g. AutoModelForCausalLM\), got "
            rf"{type(thing).__name__}\. Load one with tl_directional.load_model")):
        lane_of(thing, "dense")
    assert not is_plain_transformers(thing) and not is_bridge(thing)  # predicates answer, never raise
    with pytest.raises(TypeError, match="^model must be a TransformerLens model"), \
            tld.apply_edits(thing, tld.ValueScale(0.0)):
        pass


def test_the_transformers_lane_refuses_what_needs_hook_points(tiny_hf_model):
    from transformer_lens.hook_points import HookPoint

    hf = tiny_hf_model("gpt2")
    refused = {  # operation named in the message -> the call
        "add_hook_point('x')": lambda: add_hook_point(hf, "x", HookPoint()),
        "remove_hook_point('x')": lambda: remove_hook_point(hf, "x"),
        "unembedding": lambda: unembedding(hf),
        "from_block": lambda: from_block(hf, BlockInput(1, torch.zeros(1, 3, 32), None)).__enter__(),
        "final_norm_weight": lambda: final_norm_weight(hf),
        "linear_inputs": lambda: TRANSFORMERS.linear_inputs(hf, 0, {}),
        "linear_weights": lambda: TRANSFORMERS.linear_weights(hf, 0),
        "output_biases": lambda: TRANSFORMERS.output_biases(hf, 0),
        "resolving hook sites": lambda: TRANSFORMERS.hook_layout_key(hf),
    }
    for operation, call in refused.items():
        with pytest.raises(NoHookPointsError) as err:
            call()
        assert isinstance(err.value, TypeError) and isinstance(err.value, tld.TLDirectionalError)
        message = str(err.value)
        assert message.startswith(operation), (operation, message)
        assert "model is on the 'transformers' lane (a plain transformers model, which has none)" in message
        assert "model = tl_directional.load_model(path_or_name)" in message
    with pytest.raises(NoHookPointsError, match="plain transformers GPT2LMHeadModel"):
        tld.edit_hooks(hf, tld.ValueScale(0.0))


def test_the_transformers_lane_copies_exports_and_loads(tiny_hf_model, tiny_model_dir, tmp_path):
    hf = tiny_hf_model("gpt2")
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        base = hf(ids).logits
    assert to_hf_model(hf) is hf  # already a Hugging Face model
    copy = clone_model(hf)
    assert copy is not hf and type(copy) is type(hf) and not copy.training
    with torch.no_grad():
        assert torch.equal(copy(ids).logits, base)
        copy.get_input_embeddings().weight.add_(1.0)  # the copy's weights are its own
        assert torch.equal(hf(ids).logits, base)
    save_hf_directory(hf, tmp_path / "out")
    back = TRANSFORMERS.load_dir(tmp_path / "out", device="cpu", dtype=torch.float32)
    assert type(back) is type(hf) and lane_of(back) is TRANSFORMERS and not back.training
    want, got = hf.state_dict(), back.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    # the lane's families: those whose model types the module hooks know
    on_lane = lane_families(TRANSFORMERS)
    assert set(on_lane) == {n for n, f in REGISTRY.items() if set(f.model_types) & set(MODEL_TYPES)}
    assert "gpt2" in on_lane and "bert" not in on_lane
    assert "hf_modules is None" in TRANSFORMERS.family_refusal(REGISTRY["bert"])
    with pytest.raises(ValueError, match="got 'transformers': load_model loads TransformerLens models"):
        load_model(tiny_model_dir("gpt2"), lane="transformers")
