"""The TransformerLens versions the package supports, and the one private interface it relies on.

:data:`SUPPORTED_TRANSFORMER_LENS` is the range ``pyproject.toml`` declares; the lanes are
tested on :data:`TESTED_TRANSFORMER_LENS`. On TransformerLens 4 (``TransformerBridge``) the
nested split hook points (:mod:`tl_directional.model.split_hooks`) are entries of the bridge's
private ``_hook_registry`` (there is no public call to add a hook point; see
:func:`tl_directional.model.handle.add_hook_point`). :func:`check_hook_registry` checks the shape
the package relies on (a dict of name -> ``HookPoint`` behind ``hook_dict``) and raises
:class:`HookRegistryChangedError` naming the installed version when it does not hold, so a
TransformerLens release that changes it fails loudly instead of leaving hook points that
nothing fires.
"""

from __future__ import annotations

from ..core.errors import TLDirectionalError

#: The TransformerLens range pyproject.toml declares (``transformer-lens>=2.18,<5``).
SUPPORTED_TRANSFORMER_LENS = ">=2.18,<5"
#: The versions CI runs the suite on: legacy lane (HookedTransformer) and bridge lane.
TESTED_TRANSFORMER_LENS = {"legacy": "2.18.0", "bridge": "4.3.0"}


class HookRegistryChangedError(TLDirectionalError, RuntimeError):
    """TransformerLens's private hook registry no longer has the shape this package writes to."""


def transformer_lens_version() -> str:
    """The installed ``transformer-lens`` version (``"unknown"`` without package metadata)."""
    try:
        from importlib.metadata import version

        return version("transformer-lens")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        return "unknown"


def registry_changed(what: str) -> HookRegistryChangedError:
    return HookRegistryChangedError(
        f"TransformerLens {transformer_lens_version()}: the TransformerBridge's private _hook_registry {what}; "
        f"tl_directional adds its nested hook points (blocks.L.hook_attn_out.hook_par, ...) there and was "
        f"tested on TransformerLens {TESTED_TRANSFORMER_LENS['bridge']} (bridge) and "
        f"{TESTED_TRANSFORMER_LENS['legacy']} (legacy); install a tested version "
        f"(pip install 'transformer-lens=={TESTED_TRANSFORMER_LENS['bridge']}') or a tl-directional release "
        f"that supports this one (supported range: transformer-lens{SUPPORTED_TRANSFORMER_LENS})")


def check_hook_registry(model) -> dict:
    """The bridge's ``_hook_registry`` after checking that it is what the package writes to: a
    ``dict`` of ``str`` -> ``transformer_lens.hook_points.HookPoint`` whose entries are what
    ``model.hook_dict`` returns under the same names. Raises :class:`HookRegistryChangedError`
    (naming the installed TransformerLens version) otherwise."""
    from transformer_lens.hook_points import HookPoint

    registry = getattr(model, "_hook_registry", None)
    if registry is None:
        raise registry_changed("is gone (the model has no _hook_registry attribute)")
    if type(registry) is not dict:
        raise registry_changed(f"is a {type(registry).__name__}, not a dict")
    bad = [k for k, v in registry.items() if not isinstance(k, str) or not isinstance(v, HookPoint)]
    if bad:
        raise registry_changed(f"holds entries that are not name -> HookPoint (e.g. {bad[0]!r})")
    hook_dict = model.hook_dict
    missing = [k for k, v in registry.items() if hook_dict.get(k) is not v]
    if missing:
        raise registry_changed(f"is no longer what hook_dict is built from (e.g. {missing[0]!r} is not served by hook_dict)")
    return registry


__all__ = ["HookRegistryChangedError", "SUPPORTED_TRANSFORMER_LENS", "TESTED_TRANSFORMER_LENS",
           "check_hook_registry", "transformer_lens_version"]
