"""The type checker the suite's jaxtyping import hook applies (see tests/conftest.py).

beartype with the PEP 484 numeric tower on: an ``int`` is accepted where ``float`` is
annotated (PEP 484's rule, which beartype leaves off by default)."""

from beartype import BeartypeConf, beartype

typechecker = beartype(conf=BeartypeConf(is_pep484_tower=True))
