"""profile and compression_geometry under torchrun (gloo, world size 2) equal one process.

Each rank takes every second batch; streaming sums and histograms are all-reduced, so the
exact columns (counts, sums, means, stds, energy ratios) agree to rounding and the histogram
quantiles exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd

import tl_directional as tld
from tl_directional.compression import compression_geometry
from tl_directional.compression.compressors import prune_magnitude

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good.",
    "And God called the light Day, and the darkness he called Night.",
]

SCRIPT = textwrap.dedent("""
    import json, sys, torch.distributed as dist
    sys.path.insert(0, {root!r})
    import tl_directional as tld
    from tl_directional.compression.compressors import prune_magnitude
    from tl_directional.compression import compression_geometry
    dist.init_process_group("gloo")
    model = tld.load_model({path!r}).eval()
    texts = json.loads(open({texts!r}).read())
    prof = tld.profile(model, texts, batch_size=1, progress=False)
    geo = compression_geometry(model, prune_magnitude(model, 0.5).model, texts, batch_size=1)
    if dist.get_rank() == 0:
        prof.residual.to_parquet({out!r} + "/residual.parquet")
        prof.value.to_parquet({out!r} + "/value.parquet")
        geo.to_parquet({out!r} + "/geometry.parquet")
        json.dump(dict(tokens=prof.metadata["tokens_seen"], seqs=prof.metadata["sequences_seen"],
                       geo_tokens=geo.attrs["tokens"]), open({out!r} + "/meta.json", "w"))
    dist.barrier()
    dist.destroy_process_group()
""")


def _numeric_equal(a: pd.DataFrame, b: pd.DataFrame, name: str) -> None:
    num = a.select_dtypes("number").columns
    assert len(num) > 5
    for c in num:
        np.testing.assert_allclose(a[c].to_numpy(np.float64), b[c].to_numpy(np.float64),
                                   rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=f"{name}.{c}")


def test_profile_and_compression_geometry_equal_one_process_at_world_size_2(tiny_model,
                                                                            tiny_model_dir,
                                                                            tmp_path):
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps(TEXTS))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "ddp_profile.py"
    script.write_text(SCRIPT.format(root=root, path=str(tiny_model_dir("gpt2")), texts=str(texts),
                                    out=str(tmp_path)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(script)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    model = tiny_model("gpt2")
    prof = tld.profile(model, TEXTS, batch_size=1, progress=False)
    geo = compression_geometry(model, prune_magnitude(model, 0.5).model, TEXTS, batch_size=1)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta == {"tokens": prof.metadata["tokens_seen"], "seqs": len(TEXTS),
                    "geo_tokens": geo.attrs["tokens"]}
    _numeric_equal(pd.read_parquet(tmp_path / "residual.parquet"), prof.residual, "residual")
    _numeric_equal(pd.read_parquet(tmp_path / "value.parquet"), prof.value, "value")
    _numeric_equal(pd.read_parquet(tmp_path / "geometry.parquet"), geo, "geometry")
