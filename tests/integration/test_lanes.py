"""The lane object (one per TransformerLens generation), sites resolved once per model, and a
``generate`` that is fixed at load, not by ``apply_edits`` (issue 21)."""

import pickle
import re
from pathlib import Path

import pytest
import torch

import tl_directional as tld
import tl_directional.model.sites as sites_mod
from tl_directional.evaluate.sweeps import grid, sweep
from tl_directional.model.generation import fix_generate, generate_fixed
from tl_directional.model.handle import add_hook_point, clone_model, remove_hook_point
from tl_directional.model.lanes import BRIDGE, LEGACY, Lane, installed_lane, lane_named, lane_of
from tl_directional.model.load import tl_lane

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
    with pytest.raises(ValueError, match="lane must be 'bridge' or 'legacy'"):
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
