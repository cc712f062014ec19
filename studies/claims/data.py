"""The claims study's committed data: where it lives (``docs/results/data/``), its CSV form, and
the checked reader and atomic writer of one run's files.

Files of a run ``<stem>`` (``claims_<model>``, ``amend_<model>``, ``atlas_<model>``):
``<stem>.records.csv`` (text, window, setting, tokens, nll, base_nll, kl, agree: sums over the
window's predicted tokens), ``<stem>.profile.csv`` (per-head value-space means and per-layer
residual energy ratios, BOS excluded) and ``<stem>.manifest.json`` (command, commit, model source
file / quantisation / sha256, texts and their sha256, settings, per-file sha256).
"""

from __future__ import annotations

import io

from studies import common

ROOT = common.ROOT
DATA = ROOT / "docs" / "results" / "data"
PAGES = ROOT / "docs" / "results"


class DataError(RuntimeError):
    """A committed data file is missing, corrupt, or from another model."""


def csv_bytes(df) -> bytes:
    """``df`` as CSV bytes, the form every study's data file is committed in (10 significant digits)."""
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.10g", lineterminator="\n")
    return buf.getvalue().encode()


def write_data(stem, rec, prof, manifest):
    """Write a run's records and profile tables and its manifest (the manifest last) under :data:`DATA`."""
    files = {f"{stem}.records.csv": csv_bytes(rec), f"{stem}.profile.csv": csv_bytes(prof)}
    common.write_data(DATA, files, manifest, f"{stem}.manifest.json")
    print(f"wrote {DATA / stem}.* ({len(rec)} records)", flush=True)


def load_data(stem: str):
    """``(manifest, records, profile)`` of run ``stem``, every file checked against the manifest's
    sha256; raises :class:`DataError` for a missing or edited file, another model's data or a dirty run."""
    import pandas as pd

    mpath = DATA / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, str(mpath.relative_to(ROOT)), DataError)
    frames = {}
    for name, want in manifest.get("files", {}).items():
        p = DATA / name
        b = common.checked_bytes(p, want, str(p.relative_to(ROOT)), mpath.name, DataError)
        frames[name.split(".")[-2]] = pd.read_csv(io.BytesIO(b))
    m = manifest["model"]
    from tl_directional.model.load.catalog import REAL_MODELS

    if m["name"] in REAL_MODELS and REAL_MODELS[m["name"]].source_sha256 != m["source_sha256"]:
        raise DataError(
            f"{mpath.relative_to(ROOT)}: model source sha256 {m['source_sha256'][:12]} is not the "
            f"catalogue's {m['name']} ({REAL_MODELS[m['name']].source_sha256[:12]}): data from another model"
        )
    if any("+dirty" in t.get("commit", "") for t in manifest["texts"].values()) or "+dirty" in manifest["commit"]:
        raise DataError(
            f"{mpath.relative_to(ROOT)}: made from a dirty tree ({manifest['commit']}); rerun from a clean one"
        )
    return manifest, frames["records"], frames["profile"]
