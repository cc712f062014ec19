"""The one check of a ``components`` argument (which updates of a block to split).

A *component* is one update added to the residual stream: ``"attn"`` (the attention
output), ``"mlp"`` (the MLP output), ``"block"`` (their sum, in sequential blocks) and,
in value space, ``"value"`` (each head's aggregate against the token's own value,
METHOD sec. 3). Which residual components a model defines comes from its resolved
sites (``ModelSites.components``; a post-LN encoder has no ``"block"``).

This module is pure (no torch, no TransformerLens) so that every layer can import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: Every component name the package knows, residual ones first.
RESIDUAL_COMPONENTS = ("attn", "mlp", "block")
ALL_COMPONENTS = RESIDUAL_COMPONENTS + ("value",)


def check_components(
    components: str | Iterable[str] | None,
    available: Sequence[str],
    *,
    allowed: Sequence[str] = ALL_COMPONENTS,
    default: Sequence[str] | None = None,
    argument: str = "components",
    arch: str | None = None,
    dedupe: bool = False,
) -> tuple[str, ...]:
    """``components`` as a non-empty tuple of names, each in ``allowed`` and defined by the model.

    Args:
        components: one name, several, or None (then ``default``, else ``available``).
        available: the names the model defines (e.g. ``sites.components + ("value",)``).
        allowed: the names this caller accepts at all (a subset of :data:`ALL_COMPONENTS`).
        argument: the argument's name in error messages (``"units"`` for the deprecated alias).
        arch: the model's architecture, named when a component is not defined for it.
        dedupe: drop repeated names (first occurrence kept).

    Raises:
        ValueError: naming the argument, the offending entry and the valid choices.
    """
    if components is None:
        return tuple(available if default is None else default)
    if isinstance(components, str):
        components = (components,)
    components = tuple(components)
    if dedupe:
        components = tuple(dict.fromkeys(components))
    if not components:
        raise ValueError(f"{argument} is empty; choose from {tuple(allowed)}")
    for c in components:
        if c not in allowed:
            raise ValueError(f"{argument} has unknown entry {c!r}; choose from {tuple(allowed)}")
        if c not in available:
            where = f"this {arch} model" if arch else "this model"
            raise ValueError(f"{argument} has {c!r}, which is not defined for {where}; "
                             f"available: {tuple(available)}")
    return components


__all__ = ["ALL_COMPONENTS", "RESIDUAL_COMPONENTS", "check_components"]
