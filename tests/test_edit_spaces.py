"""The registry of named edit spaces (tl_directional.edit.EDIT_SPACES): the sweep's space names,
the same edits the sweep builds, a clear error for an unknown name."""

import pytest

from tl_directional.edit import (
    EDIT_SPACES,
    DiagonalRemoval,
    EffectiveDiagonal,
    ResidualScale,
    ValueScale,
    edit_space,
    edits_for_space,
)
from tl_directional.sweep import SPACES, Setting


def test_registry_names_are_the_sweep_spaces():
    assert list(EDIT_SPACES) == list(SPACES)
    assert {n: s.description for n, s in EDIT_SPACES.items()} == SPACES
    with pytest.raises(TypeError):
        EDIT_SPACES["value"] = EDIT_SPACES["block"]  # read-only


@pytest.mark.parametrize("space", list(SPACES))
@pytest.mark.parametrize("layers", [None, (0, 1)])
def test_registry_builds_what_the_sweep_builds(space, layers):
    a = Setting(space, 0.5, 1.0, layers).edits()
    b = edits_for_space(space, 0.5, 1.0, layers)
    assert [type(e) for e in a] == [type(e) for e in b]
    assert [vars(e) for e in a] == [vars(e) for e in b]


def test_v_para_and_attention_removal():
    (v,) = edits_for_space("value", s_par=0.0)
    assert isinstance(v, ValueScale) and (v.s_par, v.s_perp, v.mode, v.layers) == (0.0, 1.0, "full", None)
    (r,) = edits_for_space("resid-attn", s_par=0.0, layers=[1])
    assert isinstance(r, ResidualScale) and (r.component, r.s_par, r.layers) == ("attn", 0.0, [1])
    assert isinstance(edits_for_space("eff-diag", 0.0, None)[0], EffectiveDiagonal)


def test_bad_space_and_bad_scale_are_named():
    with pytest.raises(ValueError, match=r"edit space must be one of value, .*eff-diag, got 'vpara'"):
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


def test_sweep_spaces_is_a_read_only_view_of_the_registry():
    with pytest.raises(TypeError):
        SPACES["new"] = "x"  # type: ignore[index]
    with pytest.raises(ValueError, match="'eff-diag' scales only the parallel part: s_perp must be 1, got 0.5"):
        Setting("eff-diag", 0.0, 0.5)
    assert Setting("hard-diag").label == "hard-diag[L=all]" and not Setting("hard-diag").is_identity
