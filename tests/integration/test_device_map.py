"""Models placed by TransformerLens with a ``device_map`` (accelerate dispatch), the way a model
too large for one device is loaded (docs/performance.md, "Models that do not fit one device").

Only one device exists here, so the map sends every module to the CPU (transformers then loads
without accelerate's dispatch hooks): what is tested is the loading path and that profile and
sweep give the tables of the plainly loaded model; a real split needs several GPUs.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.sweeps import grid, sweep

# device_map placement is the bridge's (legacy HookedTransformer splits with n_devices, which
# needs several GPUs)
pytestmark = pytest.mark.bridge

TEXTS = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]


@pytest.fixture(scope="module")
def dispatched(tiny_model_dir):
    from transformer_lens.model_bridge import TransformerBridge

    path = tiny_model_dir("gpt2")
    # one entry per top-level module, as device_map="auto" would write it for several devices
    device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.h.0": "cpu",
                  "transformer.h.1": "cpu", "transformer.ln_f": "cpu", "lm_head": "cpu"}
    model = TransformerBridge.boot_transformers(str(path), device_map=device_map).eval()
    assert int(model.cfg.n_devices) == 1 and str(model.cfg.device) == "cpu"
    return model


def test_profile_and_sweep_through_a_device_map_equal_the_plain_model(dispatched, tiny_model):
    plain = tiny_model("gpt2")
    a = tld.profile(plain, TEXTS, verify=True, progress=False)
    b = tld.profile(dispatched, TEXTS, verify=True, progress=False)
    num = a.residual.select_dtypes("number").columns
    pd.testing.assert_frame_equal(a.residual[num], b.residual[num], rtol=1e-6, atol=1e-7)
    settings = grid("value", s_par=(0.0, 2.0), layers=[[1]])
    cols = ["loss", "delta_loss", "kl", "top1_agree"]
    s_plain = sweep(plain, TEXTS, settings, progress=False)
    s_disp = sweep(dispatched, TEXTS, settings, progress=False, shared_prefix=True)
    pd.testing.assert_frame_equal(s_plain[cols], s_disp[cols], rtol=1e-5, atol=1e-6)


def test_n_devices_without_gpus_is_refused_by_transformer_lens(tiny_model_dir):
    from transformer_lens.model_bridge import TransformerBridge

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs: n_devices=2 would load")
    with pytest.raises(ValueError, match="n_devices=2"):
        TransformerBridge.boot_transformers(str(tiny_model_dir("gpt2")), n_devices=2)
