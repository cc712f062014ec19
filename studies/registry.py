"""The registry of studies: each study registers its run entry point with :func:`study`.

A study is one sub-package of ``studies/`` (``run.py`` measuring, ``stats.py`` statistics,
``page.py`` rendering, ``cli.py`` its command line); its ``cli.main`` is decorated::

    @study("depth", "Depth profile: the parallel share per layer (protocol sec. 7)",
           data="depth_<model>.*", pages="depth_<model>.md")
    def main(argv: list[str] | None = None) -> int:
        ...

``python -m studies list`` prints the registered studies, ``python -m studies run NAME ARGS``
calls ``main(ARGS)`` (:mod:`studies.cli`), and every page a study's data builds is written by the
one page writer, :mod:`studies.pages` (``python -m studies build``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Main = Callable[[list[str] | None], int]


@dataclass(frozen=True)
class Study:
    """One registered study: its ``name`` (``python -m studies run NAME``), a one-line
    ``summary``, the data files its runs write under ``docs/results/data/`` and the pages built
    from them (both as name patterns, for ``list``), and its ``main(argv) -> exit status``."""

    name: str
    summary: str
    data: str
    pages: str
    main: Main


#: name -> study, in registration order
STUDIES: dict[str, Study] = {}


def study(name: str, summary: str, *, data: str = "", pages: str = "") -> Callable[[Main], Main]:
    """Register the decorated ``main(argv) -> int`` as study ``name``; returns it unchanged.
    Raises ``ValueError`` when ``name`` is taken (each study has one entry point)."""

    def register(main: Main) -> Main:
        if name in STUDIES:
            raise ValueError(f"study {name!r} is registered twice ({STUDIES[name].main.__module__} and "
                             f"{main.__module__}); give the new one another name")
        STUDIES[name] = Study(name, summary, data, pages, main)
        return main

    return register
