"""The one base of every error the package raises (:class:`TLDirectionalError`)."""

from __future__ import annotations


class TLDirectionalError(Exception):
    """Base of every tl-directional error: ``except tld.TLDirectionalError`` catches them all.

    Each error also keeps the built-in class users caught before (``ValueError`` for bad
    arguments and bad files, ``TypeError`` for an unsupported model type, ``RuntimeError`` for a
    state that forbids the call), so ``except ValueError`` still works.
    """


__all__ = ["TLDirectionalError"]
