"""Shared pytest fixtures: tiny seeded models on whichever TransformerLens lane is installed.

Fixtures (all session-scoped, all offline):

* ``lane`` -> ``"bridge"`` (TransformerLens >= 4) or ``"legacy"`` (HookedTransformer).
* ``tiny_model_dir(family)`` -> ``Path`` of a seeded HF model directory built once per family
  (``"gpt2"``, ``"llama"``, ``"neox"``, ``"bert"``) with the default tiny shape
  (2 layers, d_model 32, 4 heads, n_ctx 128, vocab 512, seed 0).
* ``tiny_model(family, fresh=False)`` -> that directory loaded as a TransformerLens model in eval
  mode. Cached per session and shared between tests: do not change its weights or leave hooks
  on it; pass ``fresh=True`` for a private copy you may mutate. Legacy-lane ``"bert"`` is a
  ``HookedEncoder``.
* ``load_tiny`` -> the same factory as ``tiny_model`` (alias).
* ``tiny_hf_model(family)`` -> the plain ``transformers`` model of the same directory (eager
  attention, eval mode), the reference for equivalence checks.
"""

from __future__ import annotations

import os

# Before anything imports transformers / huggingface_hub: tests never touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# Runtime shape checking, on unless TLD_SHAPECHECK=0: jaxtyping's import hook decorates every
# function and dataclass of the package with beartype (tests/_shapecheck.py), so each annotation,
# e.g. ``Float[Tensor, "batch pos d_model"]``, is checked on every call (shapes bound per call).
# It must be installed before anything imports tl_directional (the imports below do);
# tests/unit/test_shapecheck.py fails if it is not in force.
import tests._shapecheck  # noqa: E402

if tests._shapecheck.ENABLED:
    tests._shapecheck.install()

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tl_directional.model.families.hf import FAMILIES
from tl_directional.model.load import build_tiny_hf_model, load_hf_model, load_model, tl_lane

# The suite's folders, each also a marker (pyproject.toml) put on every test in it, so a run can
# pick by need: ``pytest tests/unit`` (or ``-m unit``; about 30 s), ``-m "not real and not browser"``.
TIERS = {
    "unit": "pure math and plumbing: builds no TransformerLens model",
    "integration": "tiny seeded models, the bulk of the suite",
    "studies": "the studies/ package: result pages rebuilt byte for byte, study smoke runs on tiny models",
    "real": "the real pretrained models SmolLM2-135M / Gemma-3-270M, after make models; skipped without them",
    "browser": "headless Chromium; skipped without it",
}
TESTS = Path(__file__).resolve().parent


def _tier(path: Path) -> str:
    """The folder under tests/ that holds ``path``; a test file anywhere else is a usage error."""
    try:
        rel = path.resolve().relative_to(TESTS)
    except ValueError:  # a test collected from outside tests/ (a file passed by path)
        raise pytest.UsageError(f"test file {path} is outside tests/; the suite's tests live in "
                                + ", ".join(f"tests/{t}/" for t in TIERS)) from None
    if len(rel.parts) < 2 or rel.parts[0] not in TIERS:
        raise pytest.UsageError(
            f"test file tests/{rel.as_posix()} is outside the suite's folders; move it into one of "
            + ", ".join(f"tests/{t}/ ({why})" for t, why in TIERS.items()))
    return rel.parts[0]


# Tests that compare float results with another implementation (TransformerLens, plain torch,
# another process), whose tolerances depend on how the CPU's kernels round: marked ``parity``, and
# run a second time under AVX2 kernels by ``make test-kernels`` (CI), so a tolerance that holds
# on one instruction set only fails on every machine, not just on the other kind.
PARITY = ("real/", "integration/test_attribution.py", "integration/test_hf_edits.py",
          "integration/test_lens.py", "integration/test_lm_eval_cli.py",
          "integration/test_patching.py", "integration/test_path_patching.py",
          "integration/test_cache_stacks.py", "integration/test_steering.py",
          "integration/test_directions.py", "integration/test_references.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Folders as markers: every test gets the marker of its folder (``unit``, ``integration``,
    ``real``, ``browser``), and the float-parity files the marker ``parity`` (:data:`PARITY`).
    Lanes as markers: a test marked ``bridge`` (or ``legacy``) is skipped, with the reason, on
    the other TransformerLens lane, so no test body asks which lane it is on to skip itself."""
    installed = tl_lane()
    for item in items:
        item.add_marker(getattr(pytest.mark, _tier(Path(str(item.path)))))
        if Path(str(item.path)).resolve().relative_to(TESTS).as_posix().startswith(PARITY):
            item.add_marker(pytest.mark.parity)
        for name in ("bridge", "legacy"):
            if name != installed and item.get_closest_marker(name) is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs the {name} lane; {installed!r} is installed"))


@pytest.fixture(autouse=True)
def _grad_mode_left_on() -> Any:
    """Every test must leave autograd on for the tests after it (a guard that does not depend on
    which test file runs last)."""
    yield
    assert torch.is_grad_enabled(), "this test disabled autograd globally (use torch.no_grad() as a context)"


@pytest.fixture(scope="session")
def lane() -> str:
    """The installed TransformerLens lane: ``"bridge"`` or ``"legacy"``."""
    return tl_lane()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory ``family -> Path`` of a seeded tiny HF model directory (built once per family)."""
    built: dict[str, Path] = {}

    def _get(family: str) -> Path:
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}.")
        if family not in built:
            built[family] = build_tiny_hf_model(
                family, tmp_path_factory.mktemp(f"tiny-{family}"), seed=0
            )
        return built[family]

    return _get


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Callable[[str], Path]) -> Callable[..., Any]:
    """Factory ``(family, fresh=False) -> TransformerLens model`` (eval mode, cached per session).

    The cached instance is shared: treat it as read-only. ``fresh=True`` loads a new instance.
    """
    loaded: dict[str, Any] = {}

    def _get(family: str, fresh: bool = False) -> Any:
        if fresh:
            return load_model(tiny_model_dir(family)).eval()
        if family not in loaded:
            loaded[family] = load_model(tiny_model_dir(family)).eval()
        return loaded[family]

    return _get


@pytest.fixture(scope="session")
def float64_model(tiny_model_dir: Callable[[str], Path]) -> Callable[[str], Any]:
    """Factory ``family -> TransformerLens model in float64`` (eval mode, cached per session; treat
    it as read-only): for tests whose claim is equality, compared far below float32's round-off."""
    loaded: dict[str, Any] = {}

    def _get(family: str) -> Any:
        if family not in loaded:
            loaded[family] = load_model(tiny_model_dir(family), dtype=torch.float64).eval()
        return loaded[family]

    return _get


@pytest.fixture(scope="session")
def load_tiny(tiny_model: Callable[..., Any]) -> Callable[..., Any]:
    """Alias of :func:`tiny_model`."""
    return tiny_model


@pytest.fixture(scope="session")
def tiny_hf_model(tiny_model_dir: Callable[[str], Path]) -> Callable[[str], Any]:
    """Factory ``family -> transformers model`` of the same directory (eager attention, eval)."""
    loaded: dict[str, Any] = {}

    def _get(family: str) -> Any:
        if family not in loaded:
            loaded[family] = load_hf_model(tiny_model_dir(family))
        return loaded[family]

    return _get
