"""The suite's runtime shape checking (tests/_shapecheck.py) is really in force.

With it on (the default), a call that breaks an annotation raises the checker's error; with
``TLD_SHAPECHECK=0`` the same call runs unchecked. Each case below is one that the package
itself would let through silently, so only the checker can make it raise."""

from __future__ import annotations

import pytest
import torch
from beartype.roar import BeartypeException
from jaxtyping import TypeCheckError

from tests._shapecheck import ENABLED
from tl_directional.core import kernels
from tl_directional.core.geometry import SplitStats, decompose

CHECK_ERRORS = (TypeCheckError, BeartypeException)


def _calls():
    """Calls that break an annotation but that the package's own code would accept."""
    # split_stats takes update and reference of one shape ("*batch d"); unchecked, torch
    # broadcasts the [1, d] reference silently.
    yield "split_stats reference shape", lambda: kernels.split_stats(
        torch.ones(3, 4), torch.ones(1, 4))
    # an integer tensor where Float is annotated: unchecked, it is promoted to float32
    yield "split_stats reference dtype", lambda: kernels.split_stats(
        torch.ones(3, 4), torch.ones(3, 4, dtype=torch.int64))
    # a frozen dataclass's fields share "*batch": a [2] field next to [3] ones
    ok = kernels.split_stats(torch.ones(3, 4), torch.ones(3, 4))
    yield "SplitStats field shapes", lambda: SplitStats(
        alpha=ok.alpha[:2], par_frac=ok.par_frac, par_perp_ratio=ok.par_perp_ratio,
        rel_update=ok.rel_update, degenerate=ok.degenerate, par_sq=ok.par_sq,
        perp_sq=ok.perp_sq)


@pytest.mark.parametrize("name", [name for name, _ in _calls()])
def test_annotations_are_checked_when_shape_checking_is_on(name):
    call = dict(_calls())[name]
    if ENABLED:
        with pytest.raises(CHECK_ERRORS):
            call()
    else:  # TLD_SHAPECHECK=0: the package's own code runs, unchecked
        call()


def test_checker_reports_the_argument_and_the_shapes():
    if not ENABLED:
        pytest.skip("TLD_SHAPECHECK=0: nothing checks annotations")
    with pytest.raises(CHECK_ERRORS) as err:
        kernels.split_stats(torch.ones(3, 4), torch.ones(1, 4))
    text = str(err.value)
    assert "reference" in text and "batch" in text


def test_valid_calls_pass_the_checker():
    # broadcasting a [d] reference against [*batch, d] is decompose's documented contract
    d = decompose(torch.ones(2, 3, 4), torch.ones(4))
    assert d.par.shape == (2, 3, 4) and d.alpha.shape == (2, 3)
    assert torch.equal(d.par, torch.ones(2, 3, 4))


def test_only_the_legacy_beartype_leaves_functions_unchecked(tiny_model_dir):
    import beartype

    from tests._shapecheck import UNCHECKABLE

    tiny_model_dir("gpt2")  # builds through models.tiny (an os.PathLike[str] hint)
    names = sorted({getattr(f, "__qualname__", repr(f)) for f in UNCHECKABLE})
    if not ENABLED or tuple(int(x) for x in beartype.__version__.split(".")[:2]) >= (0, 15):
        assert names == [], f"beartype {beartype.__version__} left {names} unchecked"
    else:  # beartype 0.14 (TransformerLens 2.18's pin) cannot check os.PathLike[str] alone
        assert names, "models.tiny.build_tiny_hf_model has an os.PathLike[str] hint"
        other = [f for f in UNCHECKABLE if "PathLike[" not in str(getattr(f, "__annotations__", ""))]
        assert other == [], f"left unchecked without an os.PathLike[...] hint: {other}"
