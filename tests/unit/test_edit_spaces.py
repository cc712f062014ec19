"""The registry of named edit spaces (tl_directional.edit.EDIT_SPACES): the sweep's space names,
the same edits the sweep builds, a clear error for an unknown name."""

import pytest

from tl_directional.edit import (
    EDIT_SPACES,
    DiagonalRemoval,
    EffectiveDiagonal,
    MLPCarrierScale,
    ResidualScale,
    ValueScale,
    edit_space,
    edits_for_space,
)
from tl_directional.evaluate.sweeps import Setting
from tl_directional.evaluate.sweeps import runner as sweep_module

#: What each documented space name must build at (s_par=0.5, s_perp=1, layers): written out here,
#: independently of the registry, so a registry or sweep change that builds other edits fails.
EXPECTED = {
    "value": [(ValueScale, {"s_par": 0.5, "s_perp": 1.0, "mode": "full", "joint": False})],
    "value-exclusive": [(ValueScale, {"s_par": 0.5, "s_perp": 1.0, "mode": "exclusive", "joint": False})],
    "value-joint": [(ValueScale, {"s_par": 0.5, "s_perp": 1.0, "mode": "full", "joint": True})],
    "value-exclusive-joint": [(ValueScale, {"s_par": 0.5, "s_perp": 1.0, "mode": "exclusive", "joint": True})],
    "resid-attn": [(ResidualScale, {"component": "attn", "s_par": 0.5, "s_perp": 1.0})],
    "resid-mlp": [(ResidualScale, {"component": "mlp", "s_par": 0.5, "s_perp": 1.0})],
    "resid-both": [(ResidualScale, {"component": "attn", "s_par": 0.5, "s_perp": 1.0}),
                   (ResidualScale, {"component": "mlp", "s_par": 0.5, "s_perp": 1.0})],
    "block": [(ResidualScale, {"component": "block", "s_par": 0.5, "s_perp": 1.0})],
    "hard-diag": [(DiagonalRemoval, {})],
    "eff-diag": [(EffectiveDiagonal, {"s_par": 0.5})],
    "mlp-carrier-input": [(MLPCarrierScale, {"s_par": 0.5, "s_perp": 1.0, "site": "input", "remainder": "pad"})],
    "mlp-carrier-block": [(MLPCarrierScale, {"s_par": 0.5, "s_perp": 1.0, "site": "block", "remainder": "pad"})],
}


def test_registry_names_are_the_documented_spaces():
    assert list(EDIT_SPACES) == list(EXPECTED)
    assert all(isinstance(s.description, str) and s.description for s in EDIT_SPACES.values())
    assert not hasattr(sweep_module, "SPACES")  # one registry: no second view of it in the sweep
    with pytest.raises(TypeError):
        EDIT_SPACES["value"] = EDIT_SPACES["block"]  # read-only


@pytest.mark.parametrize("space", list(EXPECTED))
@pytest.mark.parametrize("layers", [None, (0, 1)])
def test_registry_and_sweep_build_the_documented_edits(space, layers):
    want = EXPECTED[space]
    for built in (edits_for_space(space, 0.5, 1.0, layers), Setting(space, 0.5, 1.0, layers).edits()):
        assert [type(e) for e in built] == [cls for cls, _ in want]
        for e, (_, fields) in zip(built, want, strict=True):
            assert {k: getattr(e, k) for k in fields} == fields
            assert e.layers == (None if layers is None else list(layers))  # normalised to a list


def test_v_para_and_attention_removal():
    (v,) = edits_for_space("value", s_par=0.0)
    assert isinstance(v, ValueScale) and (v.s_par, v.s_perp, v.mode, v.layers) == (0.0, 1.0, "full", None)
    (r,) = edits_for_space("resid-attn", s_par=0.0, layers=[1])
    assert isinstance(r, ResidualScale) and (r.component, r.s_par, r.layers) == ("attn", 0.0, [1])
    assert isinstance(edits_for_space("eff-diag", 0.0, None)[0], EffectiveDiagonal)


def test_bad_space_and_bad_scale_are_named():
    with pytest.raises(ValueError, match=r"edit space must be one of value, .*eff-diag, mlp-carrier-input, mlp-carrier-block, got 'vpara'"):
        edits_for_space("vpara", s_par=0.0)
    with pytest.raises(ValueError, match="'eff-diag' scales only the parallel part: s_perp must be 1, got 0.5"):
        edits_for_space("eff-diag", 0.0, 0.5)


def test_scope_heads_and_positions_and_the_space_flags():
    (d,) = edits_for_space("hard-diag", layers=[1], heads=[2])
    assert vars(d) == vars(DiagonalRemoval(layers=[1], heads=[2]))
    (e,) = edits_for_space("eff-diag", 0.0, layers=[0], heads=[1], positions=slice(1, None))
    assert vars(e) == vars(EffectiveDiagonal(0.0, layers=[0], heads=[1], positions=slice(1, None)))
    (r,) = edits_for_space("resid-mlp", 0.0, 1.0, positions=[3])
    assert vars(r) == vars(ResidualScale("mlp", 0.0, 1.0, positions=[3]))
    with pytest.raises(ValueError, match=r"space 'resid-attn' edits a residual-stream update, which has no heads: "
                                         r"heads must be None, got \[0\]"):
        edits_for_space("resid-attn", 0.0, heads=[0])
    assert [n for n, s in EDIT_SPACES.items() if not s.scaled] == ["hard-diag"]
    assert [n for n, s in EDIT_SPACES.items() if not s.perp] == ["hard-diag", "eff-diag"]
    with pytest.raises(ValueError, match=r"space must be one of value, .*, got 'vpara'"):
        edit_space("vpara", "space")


def test_the_registry_is_read_only_and_settings_check_their_space():
    with pytest.raises(TypeError):
        EDIT_SPACES["new"] = EDIT_SPACES["block"]  # type: ignore[index]
    with pytest.raises(ValueError, match="'eff-diag' scales only the parallel part: s_perp must be 1, got 0.5"):
        Setting("eff-diag", 0.0, 0.5)
    assert Setting("hard-diag").label == "hard-diag[L=all]" and not Setting("hard-diag").is_identity
