"""The paper this project tests, as versioned: its repository, its LaTeX folder, the commits whose
text the pages quote, and the one way a page cites them.

The paper's LaTeX lives in ``Shwai-He/Transformer-Geometry`` under
``_overleaf_/ARR_May_Revision_Overleaf/``, and its text differs between commits (protocol
sec. 12 tabulates how each claim reads in each). The quote convention, which
``tests/studies/test_paper_quotes.py`` checks on every docs page: a sentence or table row that
quotes the paper (it names one of the paper's files, or puts words in double quotes and
attributes them to the paper / the revision) carries the commit it quotes, written
``@`<hex>``` after the file (``cite`` below writes it) or ``commit `<hex>```, 7 or more hex digits.
"""

from __future__ import annotations

REPO = "Shwai-He/Transformer-Geometry"
FOLDER = "_overleaf_/ARR_May_Revision_Overleaf/"

#: the stored commits whose text the pages quote (short -> full); 8e5278e's README in the folder
#: calls it the camera-ready upload. No order between them is claimed.
VERSIONS = {
    "28ae91f": "28ae91f7aa569adb7ad67aa20f7aac6e75bfc618",
    "8e5278e": "8e5278e743edc879d4842c3c3bb8b86f6281bcca",
    "739519c": "739519c7a5c4fa29b3c851f2d12ea5cb748974ae",
    "b6d7a16": "b6d7a162eac52e53aa68d6d2aeef0d6156b291fa",
}

EXPERIMENTS = "sections/experiments.tex"
APPENDIX = "sections/appendix.tex"
ABSTRACT = "sections/abstract.tex"
SWEEP_CSV = "figs/para_ablation_corrected/ppl_component_scaling_corrected_sources.csv"

#: every version: the sentences all four read alike (the V-Para drop, the perpendicular asymmetry,
#: the training trajectory, hard diagonal the worst row)
EVERY = tuple(VERSIONS)
#: The versions each rule's verdict addresses (protocol sec. 12, "Which version each verdict
#: addresses", and the sections that state a rule beside its quote); the lead table of
#: docs/results.md and the closing table (docs/results/claims_table.md) both read them here. Keyed
#: by the protocol's rule id; ``acc<=1.5@0`` / ``acc<=1.5@0.5`` / ``acc>=3 vpara`` /
#: ``acc>=3 hard`` are sec. 9.4's accuracy rules (9.7 keeps them). A rule the protocol does not pin
#: to a version (the seed's own terms, or a reading of no sentence) is absent.
ADDRESSES: dict[str, tuple[str, ...]] = {
    "A1": ("28ae91f",), "A2": ("28ae91f",), "B": EVERY, "C1": EVERY, "C2": EVERY,
    "D": ("28ae91f", "8e5278e"), "3 amended": ("28ae91f", "739519c", "b6d7a16"),
    "A1p": ("28ae91f",), "A1h": ("28ae91f",), "A3h": ("8e5278e", "739519c", "b6d7a16"),
    "A3r": ("8e5278e", "739519c", "b6d7a16"),
    "acc<=1.5@0": ("8e5278e", "739519c", "b6d7a16"), "acc<=1.5@0.5": ("739519c", "b6d7a16"),
    "acc>=3 vpara": EVERY, "acc>=3 hard": ("28ae91f",),
    "4": EVERY, "V1 (sec. 15)": ("739519c",),
    "M1": ("739519c",), "M2": ("739519c",), "M3": ("28ae91f",),
    "W1": ("739519c",), "W2": ("739519c",),
    "R1u": ("739519c",), "R1g": ("739519c",), "R2u": ("739519c",), "R2g": ("739519c",),
    "L1": ("28ae91f", "739519c", "b6d7a16"), "L2": EVERY, "L3": EVERY, "L4": ("739519c",),
    "strength (sec. 16.3)": ("8e5278e",), "V1 (sec. 16.5)": ("739519c",),
}


def cite(path: str, *commits: str) -> str:
    """``"`path`@`c1` / `c2`"``: a file of the paper at the commits whose text reads as quoted.

    Raises:
        KeyError: a commit that is not one of :data:`VERSIONS` (quote only what was read).
    """
    unknown = [c for c in commits if c not in VERSIONS]
    if unknown or not commits:
        raise KeyError(f"commits={commits!r}: cite one or more of {sorted(VERSIONS)} (the versions read)")
    return f"`{path}`@" + " / ".join(f"`{c}`" for c in commits)
