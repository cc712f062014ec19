"""core.direction: a Direction holds [d] / [k, d] / per-layer vectors with provenance, and is
refused with one clear error for bad parts."""

import pytest
import torch

from tl_directional import Direction, DirectionError
from tl_directional.core.direction import reference_tensor


def test_a_direction_keeps_its_vectors_and_provenance():
    v = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    d = Direction(v, source="sae_decoder", hook_name="blocks.1.hook_resid_pre", layer=1,
                  weights_processed=False, details={"features": [3, 5, 7]})
    assert d.width == 8 and d.k == 3 and d.vectors is v
    assert "sae_decoder" in repr(d) and "blocks.1.hook_resid_pre" in repr(d)
    half = d.to(torch.float64)
    assert half.vectors.dtype == torch.float64 and half.hook_name == d.hook_name
    assert reference_tensor(d) == (v, d)
    assert reference_tensor("input") == ("input", None)


@pytest.mark.parametrize("kwargs, match", [
    (dict(vectors=torch.tensor([1, 2])), "dtype torch.int64"),
    (dict(vectors=torch.zeros(2, 3, 4)), r"\[d\] or \[k, d\], got shape \(2, 3, 4\)"),
    (dict(vectors=torch.ones(4), per_layer=True), r"per_layer=True\) needs \[n_layers, d\]"),
    (dict(vectors=torch.ones(4), space="mlp"), "space must be one of"),
])
def test_bad_parts_are_named(kwargs, match):
    with pytest.raises(DirectionError, match=match):
        Direction(**kwargs)


def test_a_processed_mismatch_is_one_error_for_the_edits_and_the_resolver():
    """TransformerLens issue #642: one check, one error class (a DirectionError and a
    SubspaceError), the fix named; unknown provenance passes."""
    from tl_directional import DirectionMismatchError, SubspaceError
    from tl_directional.core.direction import check_processing_matches

    v = torch.ones(4)
    check_processing_matches(Direction(v), True, argument="reference")  # unknown: passes
    check_processing_matches(Direction(v, weights_processed=True), True, argument="reference")
    for taken, here in ((True, False), (False, True)):
        with pytest.raises(DirectionMismatchError, match="Load this model the same way") as err:
            check_processing_matches(Direction(v, weights_processed=taken), here, argument="vector")
        assert isinstance(err.value, DirectionError) and isinstance(err.value, SubspaceError)
        assert str(err.value).startswith(f"vector was taken from a model with {'un' * (not taken)}processed")
