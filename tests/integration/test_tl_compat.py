"""The one private TransformerLens interface the package writes to: TL 4's ``_hook_registry``
(tl_directional.model.tl_compat). If a TransformerLens release changes it, these tests fail with a
message naming the installed version; the package itself raises HookRegistryChangedError
instead of adding hook points that nothing fires."""

from __future__ import annotations

from types import MappingProxyType

import pytest
import torch

from tl_directional.model.handle import add_hook_point, remove_hook_point
from tl_directional.model.split_hooks import attach_split_hook_points, split_hook_points
from tl_directional.model.tl_compat import (
    SUPPORTED_TRANSFORMER_LENS,
    HookRegistryChangedError,
    check_hook_registry,
    transformer_lens_version,
)

TOKENS = torch.tensor([[0, 5, 9, 13, 22, 7]])


@pytest.mark.bridge
def test_private_hook_registry_has_the_shape_the_package_writes(tiny_model):
    from transformer_lens.hook_points import HookPoint

    where = (f"TransformerLens {transformer_lens_version()}: the private TransformerBridge._hook_registry "
             "that tl_directional.model.lanes.bridge writes nested hook points into")
    model = tiny_model("gpt2", fresh=True)
    try:
        registry = check_hook_registry(model)
    except HookRegistryChangedError as exc:
        pytest.fail(f"{where} changed shape: {exc}")
    assert "blocks.0.hook_attn_out" in registry, f"{where} no longer holds the TL hook names"
    name = "blocks.0.hook_attn_out.hook_probe"
    hp = HookPoint()
    add_hook_point(model, name, hp)
    try:
        assert model.hook_dict.get(name) is hp, f"{where}: an entry is not served by hook_dict"
        seen = []
        model.run_with_hooks(TOKENS, fwd_hooks=[(name, lambda t, hook: seen.append(hook.name))])
        assert seen == [], f"{where}: a hook on a point nothing calls ran"
        # the split's points are called by the package; they must fire and be cached like TL's own
        with split_hook_points(model, components=("attn",), layers=[0]):
            par = "blocks.0.hook_attn_out.hook_par"
            model.run_with_hooks(TOKENS, fwd_hooks=[(par, lambda t, hook: seen.append(hook.name))])
            assert seen == [par], f"{where}: run_with_hooks did not fire a registered point"
            _, cache = model.run_with_cache(TOKENS, names_filter=[par])
            assert list(cache.keys()) == [par], f"{where}: run_with_cache did not cache a registered point"
    finally:
        remove_hook_point(model, name)
    assert name not in model.hook_dict and name not in registry, f"{where}: removing an entry left it served"


@pytest.mark.bridge
def test_a_changed_registry_fails_loudly_naming_the_version(tiny_model, monkeypatch):
    version = transformer_lens_version()
    model = tiny_model("gpt2", fresh=True)
    registry = model._hook_registry
    monkeypatch.setattr(model, "_hook_registry", MappingProxyType(dict(registry)))
    with pytest.raises(HookRegistryChangedError, match=rf"^TransformerLens {version}: .*_hook_registry is a mappingproxy"):
        attach_split_hook_points(model, components=("attn",), layers=[0])
    monkeypatch.setattr(model, "_hook_registry", {**registry, "blocks.0.bogus": object()})
    with pytest.raises(HookRegistryChangedError, match=r"not name -> HookPoint \(e\.g\. 'blocks\.0\.bogus'\)"):
        attach_split_hook_points(model, components=("attn",), layers=[0])
    monkeypatch.setattr(model, "_hook_registry", registry)
    frozen = dict(model.hook_dict)  # a hook_dict that no longer follows the registry
    monkeypatch.setattr(type(model), "hook_dict", property(lambda self: dict(frozen)))
    with pytest.raises(HookRegistryChangedError, match=r"took '.*hook_par' but hook_dict does not serve it") as info:
        attach_split_hook_points(model, components=("attn",), layers=[0])
    msg = str(info.value)
    assert f"supported range: transformer-lens{SUPPORTED_TRANSFORMER_LENS}" in msg and "pip install" in msg
    monkeypatch.undo()
    assert not any(n.endswith(("hook_par", "hook_perp")) for n in model.hook_dict)  # nothing half-added


def test_supported_range_is_the_declared_one():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11 has no tomllib")
    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"transformer-lens{SUPPORTED_TRANSFORMER_LENS}" in deps
    assert f"transformer-lens{SUPPORTED_TRANSFORMER_LENS}" in (root / "docs" / "install.md").read_text()
