"""Runtime shape checking of the suite: jaxtyping's import hook with beartype (tests/conftest.py).

On by default; ``TLD_SHAPECHECK=0`` turns it off (to time the suite without it, or to see
whether a failure comes from an annotation). When on, every function and dataclass of
``tl_directional`` is decorated at import, so each annotation, e.g.
``Float[Tensor, "batch pos d_model"]``, is checked on every call (shape names bound per call).

:data:`typechecker` is beartype with the PEP 484 numeric tower on: an ``int`` is accepted
where ``float`` is annotated (PEP 484's rule, which beartype leaves off by default)."""

import os

from beartype import BeartypeConf, beartype
from beartype.roar import BeartypeDecorHintException

ENABLED = os.environ.get("TLD_SHAPECHECK", "1") != "0"
"""Whether the suite runs with the import hook (anything but ``TLD_SHAPECHECK=0``)."""

_beartype = beartype(conf=BeartypeConf(is_pep484_tower=True))

UNCHECKABLE: list = []
"""Functions left unchecked because this beartype cannot check one of their hints (the legacy
lane's beartype 0.14, which TransformerLens 2.18 requires, rejects ``os.PathLike[str]``);
tests/unit/test_shapecheck.py requires it empty from beartype 0.15 on."""


def typechecker(func):
    """beartype with the numeric tower; a function whose hints this beartype cannot check at
    all is returned unchecked (and named in :data:`UNCHECKABLE`) instead of failing to import."""
    try:
        return _beartype(func)
    except BeartypeDecorHintException:
        UNCHECKABLE.append(func)
        return func


def install() -> None:
    """Install the hook over ``tl_directional``; must run before anything imports the package."""
    from jaxtyping import install_import_hook

    install_import_hook("tl_directional", "tests._shapecheck.typechecker")
