"""Claim 3 of the seed (compression ranking): the protocol's grid and the committed data's layout,
checked reader, writer and the merge of a run split over processes.

The protocol (statistic, bootstrap, symmetric verdict rule) is sec. 6 of
``docs/results/protocol.md``; it was written before these runs. Two steps:

    # measure: per-(setting, text, window) records of every compression setting of the grid;
    # refuses a dirty tl_directional/ or studies/; rewrites the data files after each setting
    python -m studies run compression --model default --windows 32
    python -m studies run compression --model smollm2-135m --windows 12

    # a run split over two processes (another part of the grid each, --grid ... --tag b):
    python -m studies run compression merge --into compression_smollm2-135m --from compression_smollm2-135m_b

    # build every compression claims page from docs/results/data/compression_*.* alone;
    # --check compares with the pages on disk and fails on any difference (the suite runs it)
    python -m studies build [--check]

Data files (``docs/results/data/compression_<model>.*``): ``records.csv`` (setting, text, window,
tokens, nll, base_nll and, per unit attn / mlp / block, sums over layers and tokens of the
local-error statistics of ``tl_directional.compression.geometry``), ``layers.csv`` (the same per
attention layer) and ``manifest.json`` (command, commit, model source file / quantisation /
sha256, "dequantised", texts and their sha256, the grid, per-file sha256). A page is a pure
function of those files.

The compression itself is the library's (``tl_directional.compression.compressors.compress`` on spec strings,
``tl_directional.compression.compression_geometry`` in local mode), as in
``studies/compression_study/``.
"""


from __future__ import annotations

import io
import sys

from studies import common
from studies.claims import data as D
from studies.claims import run as claims_run

ROOT = common.ROOT
DataError = D.DataError
DATA = ROOT / "docs" / "results" / "data"
PAGES = ROOT / "docs" / "results"
TEXTS = claims_run.TEXTS
#: source file and quantisation per catalogue model; the default model is bundled float32
SOURCES = {
    "smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1", True),
    "default": ("tl_directional/data/default_model/model.safetensors (bundled)", "none (float32 as trained)", False),
}
#: the protocol's grid (sec. 6), in the protocol's order
GRID = (
    "rtn:bits=8",
    "rtn:bits=6",
    "rtn:bits=5",
    "rtn:bits=4",
    "rtn:bits=4,group=32,sym=1",
    "rtn:bits=4,group=128,sym=0",
    "rtn:bits=3",
    "rtn:bits=3,group=32,sym=0",
    "rtn:bits=2,group=32,sym=0",
    "awq:bits=4,group=32",
    "awq:bits=3,group=32",
    "magnitude:sparsity=0.2",
    "magnitude:sparsity=0.4",
    "magnitude:sparsity=0.6",
    "magnitude:nm=2:4",
    "wanda:sparsity=0.3",
    "wanda:sparsity=0.5",
    "wanda:sparsity=0.7",
    "wanda:nm=4:8",
    "wanda:nm=2:4",
    "svd:rank=0.75",
    "svd:rank=0.5",
    "svd:rank=0.25",
)
#: the order a run measures them in: families and strengths interleaved, so that a run stopped
#: early still spans the range of damage
RUN_ORDER = (
    "rtn:bits=4",
    "wanda:sparsity=0.5",
    "svd:rank=0.5",
    "awq:bits=4,group=32",
    "magnitude:sparsity=0.4",
    "rtn:bits=3",
    "wanda:nm=2:4",
    "rtn:bits=8",
    "magnitude:sparsity=0.6",
    "svd:rank=0.75",
    "wanda:sparsity=0.3",
    "rtn:bits=4,group=128,sym=0",
    "awq:bits=3,group=32",
    "magnitude:nm=2:4",
    "rtn:bits=2,group=32,sym=0",
    "wanda:nm=4:8",
    "rtn:bits=6",
    "svd:rank=0.25",
    "magnitude:sparsity=0.2",
    "rtn:bits=3,group=32,sym=0",
    "wanda:sparsity=0.7",
    "rtn:bits=4,group=32,sym=1",
    "rtn:bits=5",
)
assert sorted(RUN_ORDER) == sorted(GRID)
CALIB_START, CALIB_PER_TEXT = 64, 4  # calibration windows 64-67 of each text
UNITS = ("attn", "mlp", "block")
#: sums kept per unit (names of tl_directional.compression.accumulate.STAT_NAMES)
KEEP = ("n", "t_err_par", "t_err_perp", "t_cos", "t_rel_mse", "u_sq", "e_sq", "e_par_sq", "e_perp_sq")
LAYER_KEEP = ("n", "t_err_par", "t_err_perp", "t_cos", "t_rel_mse")

def default_sha256() -> str | None:
    """sha256 of the bundled default model's weights (``None`` when it is not installed)."""
    from tl_directional.model.load import bundled_model_dir

    d = bundled_model_dir()
    return common.sha256_bytes((d / "model.safetensors").read_bytes()) if d is not None else None


def expected_source_sha(name: str) -> str | None:
    """The source sha256 a run of catalogue model ``name`` must name (``None``: not checkable here)."""
    if name == "default":
        return default_sha256()
    from tl_directional.model.load.catalog import REAL_MODELS

    return REAL_MODELS[name].source_sha256 if name in REAL_MODELS else None


def write_data(stem, rec, lay, manifest):
    """Write a run's records and per-layer tables and its manifest (last) under :data:`DATA`."""
    manifest["files"] = {}
    files = {f"{stem}.records.csv": D.csv_bytes(rec), f"{stem}.layers.csv": D.csv_bytes(lay)}
    common.write_data(DATA, files, manifest, f"{stem}.manifest.json")


def load_data(stem: str):
    """``(manifest, records, layers)`` of run ``stem``, checked against its manifest; raises
    :class:`DataError` for a missing, edited, dirty or other model's file."""
    import pandas as pd

    mpath = DATA / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, str(mpath.relative_to(ROOT)), DataError)
    frames = {}
    for name in (f"{stem}.records.csv", f"{stem}.layers.csv"):
        p = DATA / name
        want = manifest.get("files", {}).get(name)
        if want is None:
            raise DataError(f"{mpath.relative_to(ROOT)}: does not name {name}; rerun")
        b = common.checked_bytes(p, want, str(p.relative_to(ROOT)), mpath.name, DataError)
        try:
            frames[name.split(".")[-2]] = pd.read_csv(io.BytesIO(b))
        except ValueError as e:
            raise DataError(f"{p.relative_to(ROOT)}: cannot parse ({e})") from None
    m = manifest["model"]
    exp = expected_source_sha(m["name"])
    if exp is not None and exp != m["source_sha256"]:
        raise DataError(f"{mpath.relative_to(ROOT)}: model source sha256 {str(m['source_sha256'])[:12]} is not "
                        f"the installed {m['name']}'s ({exp[:12]}): data from another model")
    if "+dirty" in manifest["commit"] or any("+dirty" in r["commit"] for r in manifest.get("runs", [])):
        raise DataError(f"{mpath.relative_to(ROOT)}: made from a dirty tree ({manifest['commit']}); rerun from a "
                        "clean one")
    rec = frames["records"]
    need = {"setting", "text", "window", "tokens", "nll", "base_nll"} | {f"{u}_{k}" for u in UNITS for k in KEEP}
    if need - set(rec.columns):
        raise DataError(f"{(DATA / f'{stem}.records.csv').relative_to(ROOT)}: columns missing: "
                        + ", ".join(sorted(need - set(rec.columns))))
    return manifest, rec, frames["layers"]



def merge(into: str, other: str) -> int:
    """Join a second run of the same model, windows and texts (another part of the grid, run as a
    separate process with ``--tag``) into ``into``'s data files; the manifest lists each run with
    its commit, command and settings, and the second run's files are removed."""
    import numpy as np
    import pandas as pd

    try:
        ma, ra, la = load_data(into)
        mb, rb, lb = load_data(other)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key in ("windows", "seq_len", "texts", "grid", "calibration", "geometry"):
        if ma[key] != mb[key]:
            print(f"error: {into} and {other} differ in {key}", file=sys.stderr)
            return 2
    if ma["model"] != mb["model"]:
        print(f"error: {into} and {other} hold different models", file=sys.stderr)
        return 2
    if {s["spec"] for s in ma["settings"]} & {s["spec"] for s in mb["settings"]}:
        print(f"error: {into} and {other} share settings", file=sys.stderr)
        return 2
    ka = ra.drop_duplicates(["text", "window"]).set_index(["text", "window"])[["tokens", "base_nll"]]
    kb = rb.drop_duplicates(["text", "window"]).set_index(["text", "window"])[["tokens", "base_nll"]]
    if not (ka.index.equals(kb.index) and np.array_equal(ka.to_numpy(), kb.loc[ka.index].to_numpy())):
        print(f"error: {into} and {other} were measured on other windows (dense NLL differs)", file=sys.stderr)
        return 2
    runs = ma.get("runs") or [{k: ma[k] for k in ("command", "commit", "date", "machine")}
                              | {"settings": [s["spec"] for s in ma["settings"]], "seconds": ma.get("seconds")}]
    runs = runs + [{k: mb[k] for k in ("command", "commit", "date", "machine")}
                   | {"settings": [s["spec"] for s in mb["settings"]], "seconds": mb.get("seconds")}]
    man = dict(ma)
    man["runs"] = runs
    man["settings"] = ma["settings"] + mb["settings"]
    man["complete"] = {s["spec"] for s in man["settings"]} == set(man["grid"])
    man["seconds"] = max(r.get("seconds") or 0 for r in runs)
    man["merged"] = f"python -m studies run compression merge --into {into} --from {other}"
    write_data(into, pd.concat([ra, rb], ignore_index=True), pd.concat([la, lb], ignore_index=True), man)
    for p in DATA.glob(f"{other}.*"):
        p.unlink()
    print(f"merged {other} into {into} ({len(man['settings'])} settings)")
    return 0
