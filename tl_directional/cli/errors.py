"""The CLI's one error path: a user's mistake is printed as one ``error: ...`` line on
stderr and the command exits with status 2 (TLD_TRACEBACK=1 re-raises instead).

Every command, ``train`` and ``experiment`` (:mod:`tl_directional.cli.train`) included,
reports through :func:`report_user_error`."""

from __future__ import annotations

import os
import sys

from ..core.errors import TLDirectionalError


class UsageError(TLDirectionalError):
    """A mistake in the command's arguments or inputs: printed as one ``error:`` line, exit 2."""


#: Exceptions that mean the user's input was wrong (the library raises ValueError / TypeError
#: with the argument, the value and the fix; OSError covers missing files and hub look-ups).
USER_ERRORS = (UsageError, ValueError, TypeError, OSError, NotImplementedError)


def report_user_error(exc: BaseException) -> int:
    """Print ``error: <message>`` (one line) on stderr; returns the exit status 2.

    The one home of the CLI's error format: every command, ``compress`` and
    ``compress-check`` included, ends up here. TLD_TRACEBACK=1 re-raises instead."""
    if os.environ.get("TLD_TRACEBACK"):
        raise exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, UsageError) and exc.filename and str(exc.filename) not in message:
        message = f"{exc.filename}: {message}"
    print(f"error: {message}", file=sys.stderr)
    return 2
