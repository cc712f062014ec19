"""The one base of every error the package raises (:class:`TLDirectionalError`)."""

from __future__ import annotations


class TLDirectionalError(Exception):
    """Base of every tl-directional error: ``except tld.TLDirectionalError`` catches them all.

    Each error also keeps the built-in class users caught before (``ValueError`` for bad
    arguments and bad files, ``TypeError`` for an unsupported model type, ``RuntimeError`` for a
    state that forbids the call), so ``except ValueError`` still works.
    """


class RenamedArgumentError(TLDirectionalError, TypeError):
    """A keyword argument under a name it no longer has: the message names the new name. (The
    old name is refused, not silently taken: 0.1.0 keeps no aliases.)"""


def renamed_argument(function: str, old: str, new: str) -> RenamedArgumentError:
    """The :class:`RenamedArgumentError` for ``function(old=...)``, whose keyword is now ``new``."""
    return RenamedArgumentError(f"{function}() has no argument {old!r}; it is called {new!r} now: pass "
                                f"{new}=... instead of {old}=...")


__all__ = ["RenamedArgumentError", "TLDirectionalError", "renamed_argument"]
