"""The edit spec of the lm-eval model (tl_directional.evaluate.sweeps.edit_spec): a sweep.csv row label read back
into the sweep setting it names, with the sweep command line's spaces and layer grammar."""

from __future__ import annotations

import pytest

from tl_directional.edit import EDIT_SPACES
from tl_directional.evaluate.sweeps import Setting, grid
from tl_directional.evaluate.sweeps.edit_spec import EditSpecError, parse_edit_spec, spec_edits


def test_every_sweep_label_reads_back_as_its_setting():
    # spaces with no perpendicular part take s_perp = 1 only (a grid refuses them otherwise)
    perp = [sp for sp, e in EDIT_SPACES.items() if e.perp]
    scaled_only = [sp for sp in EDIT_SPACES if sp not in perp]
    settings = grid(perp, s_par=[-1, 0, 0.5, 2, 1e6], s_perp=[1, 0, 0.25], layers=[None, [0, 1], [3]])
    settings += grid(scaled_only, s_par=[-1, 0, 0.5, 2, 1e6], s_perp=[1], layers=[None, [0, 1], [3]])
    assert {s.space for s in settings} == set(EDIT_SPACES)
    for s in settings:
        assert parse_edit_spec(s.label) == [s], s.label


def test_short_forms_defaults_and_composition():
    assert parse_edit_spec("value[s_par=0]") == [Setting("value", 0.0, 1.0, None)]
    assert parse_edit_spec("hard-diag") == [Setting("hard-diag", 1.0, 1.0, None)]
    assert parse_edit_spec(" none ") == [] and parse_edit_spec("") == []
    two = parse_edit_spec("resid-mlp[s_par=1,s_perp=0,layers=0-2]+hard-diag[L=-1]", n_layers=4)
    assert two == [Setting("resid-mlp", 1.0, 0.0, (0, 1, 2)), Setting("hard-diag", 1.0, 1.0, (3,))]
    assert parse_edit_spec("value[s_par=1e+06,L=0,2]") == [Setting("value", 1e6, 1.0, (0, 2))]
    edits = spec_edits("resid-both[s_par=0.5]")
    assert [type(e).__name__ for e in edits] == ["ResidualScale", "ResidualScale"]


@pytest.mark.parametrize("spec,message", [
    ("valu[s_par=0]", r"unknown space 'valu'; choose from value, value-exclusive"),
    ("value[s_par=x]", r"s_par='x' is not a number"),
    ("value[s_par=inf]", r"s_par='inf' is not finite"),
    ("value[foo=1]", r"unknown key 'foo'"),
    ("value[s_par=0,s_par=1]", r"s_par is given twice"),
    ("value[0]", r"'0' in 'value\[0\]' is not key=value"),
    ("value[s_par=0", r"cannot read 'value\[s_par=0'"),
    ("hard-diag[s_par=0]", r"space 'hard-diag' has no scales"),
    ("eff-diag[s_perp=0]", r"s_perp must be 1"),
    ("value[L=3-1]", r"the range '3-1' is empty"),
    ("value[L=0;1]", r"several layer sets"),
    ("value[L=4]", r"layer 4, out of range for a model with 4 layers"),
])
def test_bad_specs_name_the_argument_value_and_grammar(spec, message):
    with pytest.raises(EditSpecError, match=message) as info:
        parse_edit_spec(spec, n_layers=4)
    text = str(info.value)
    assert text.startswith(f"edits={spec!r}: ") and "SPACE[s_par=X,s_perp=Y,L=LAYERS]" in text



def test_a_random_row_label_reads_back_as_the_same_draw():
    """A ``sweep --random`` row's label names its draw; read back (with the layer count) it is the
    same setting, per-layer scales included (issue 47: it was refused as ``unknown key 'random'``)."""
    from tl_directional.evaluate.sweeps.random_draws import random_setting

    for setting in (random_setting("value", 6, "uniform", seed=3, s_perp=0.5),
                    random_setting("value-exclusive", 6, "gaussian", seed=1, layers=[1, 4]),
                    random_setting("resid-attn", 6, "uniform", seed=0, low=0.5, high=1.5)):
        (back,) = parse_edit_spec(setting.label, 6)
        assert back == setting and back.label == setting.label and back.layer_s_par == setting.layer_s_par
    with pytest.raises(EditSpecError, match="layer count is needed"):
        parse_edit_spec("value[random=uniform,seed=3]")
    with pytest.raises(EditSpecError, match="needs both random=DIST and seed=N"):
        parse_edit_spec("value[random=uniform]", 6)
    with pytest.raises(EditSpecError, match="leave s_par out"):
        parse_edit_spec("value[random=uniform,seed=1,s_par=0]", 6)
