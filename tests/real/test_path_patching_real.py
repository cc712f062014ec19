"""Directional path patching on the real SmolLM2-135M (grouped-query attention: 9 query heads
read 3 key/value heads) and Gemma-3-270M (grouped-query, sandwich norms), the two models whose
key/value path patching TransformerLens refuses (TL #980): every downstream reader at once equals
activation patching of the sender's ``hook_z`` written by hand here, key/value receivers come per
key/value head, and with frozen norm statistics the parallel and perpendicular paths' changes to a
receiver's input add up to the full path's change. Skipped without the models (``make models``)."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.model.load import catalog, load_model

REAL = ("smollm2-135m", "gemma-3-270m")
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


@pytest.fixture(scope="module", params=REAL)
def real(request):
    name = request.param
    if not catalog.is_installed(name):
        pytest.skip(f"{name}: package not installed; install with `{catalog.REAL_MODELS[name].install}`")
    model = load_model(name).eval()
    clean, corrupt = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    assert clean.shape == corrupt.shape, "the pair must tokenise to equal lengths"
    mary, john = (int(model.to_single_token(t)) for t in (" Mary", " John"))

    def metric(logits):
        return logits[:, -1, mary] - logits[:, -1, john]

    return name, model, clean, corrupt, metric


def test_every_reader_at_once_is_activation_patching_of_the_head(real):
    name, model, clean, corrupt, metric = real
    layer, head = 2, 0
    res = tld.path_patch(model, clean, corrupt, metric, sender=("head", layer, head), joint=True,
                         receivers=["q", "k", "v", "mlp", "logits"], parts=("full",))
    hook = f"blocks.{layer}.attn.hook_z"
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
        z_clean = cache[hook]  # the bridge's hook_z is an alias: read it by the name asked for
        del cache
        base = metric(model(corrupt)).double()

        def put(z, hook):  # noqa: ARG001 - TransformerLens's hook signature
            z[:, :, head] = z_clean[:, :, head]
            return z

        patched = metric(model.run_with_hooks(corrupt, fwd_hooks=[(hook, put)])).double()
    got = torch.as_tensor(res.values["joint"]["full"]).double().reshape(-1)
    torch.testing.assert_close(got, patched - base, atol=2e-4, rtol=1e-4)


def test_key_value_receivers_per_kv_head_and_parts_add_up_with_frozen_norms(real):
    name, model, clean, corrupt, metric = real
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    assert n_kv < model.cfg.n_heads, f"{name} should be a grouped-query model"
    res, inputs = tld.path_patch(model, clean, corrupt, metric, sender=("attn", 1), receivers=["k", "v"],
                                 layers=[3], freeze_norm=True, return_inputs=True)
    for kind in ("k", "v"):
        full = torch.as_tensor(res.values[kind]["full"])
        assert full.shape[-1] == n_kv and torch.isfinite(full[:, 3]).all()
    changes = {}
    for (part, rec), change in inputs.items():
        changes.setdefault(rec, {})[part] = change.double()
    assert changes
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupt, names_filter=["blocks.3.attn.hook_k", "blocks.3.attn.hook_v"])
    for rec, c in changes.items():
        # each change is a float32 difference of two receiver inputs (patched minus unpatched), so
        # its round-off scales with the input's size, not the change's: bound it by the round-off
        # of the unpatched input, d_model terms through every block up to the receiver's
        unpatched = cache[f"blocks.{rec.layer}.attn.hook_{rec.kind}"][:, :, rec.head]
        limit = roundoff_tolerance(torch.float32, float(unpatched.abs().max()),
                                   model.cfg.d_model * (rec.layer + 1))
        gap = float((c["par"] + c["perp"] - c["full"]).abs().max())
        assert float(c["full"].abs().max()) > 100 * limit and gap <= limit, (rec, gap, limit)
