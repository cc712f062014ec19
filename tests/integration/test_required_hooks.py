"""``tld.required_hooks(model, components=...)``: the ``names_filter`` for ``run_with_cache`` that
caches exactly what ``Profile.from_cache`` reads, giving the profile of a full cache."""

from __future__ import annotations

import pandas as pd
import pytest

import tl_directional as tld

from ._families import ALL, EXTRA

TEXTS = ["In the beginning God created the heaven and the earth.",
         "And the earth was without form, and void; and darkness was upon the face of the deep."]
COMPONENTS = [None, ("attn",), ("mlp", "value"), ("value",)]


class _Recording(dict):
    """A cache that records which names are read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)


def _unique(cache) -> dict:
    """The cache's distinct tensors (a bridge caches one tensor under its TL alias and its
    canonical name; it is stored once)."""
    return {(t.data_ptr(), tuple(t.shape), t.dtype): t for t in (cache[k] for k in cache.keys())}


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _same_profile(a, b) -> None:
    for name in ("residual", "value"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)


@pytest.mark.parametrize("components", COMPONENTS, ids=lambda c: "all" if c is None else "+".join(c))
@pytest.mark.parametrize("family", ALL + EXTRA[:2])
def test_filtered_cache_gives_the_full_cache_profile(tiny_model, family, components):
    model = tiny_model(family)
    names = tld.required_hooks(model, components=components)
    assert len(names) == len(set(names)) and all(n in model.hook_dict for n in names)
    batch = tld.prepare_inputs(model, TEXTS)
    _, full = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    _, part = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask, names_filter=names)
    assert set(names) <= set(part.keys())  # (plus, on a bridge, the same tensors' canonical names)
    full_t, part_t = _unique(full), _unique(part)
    assert len(part_t) < len(full_t)  # fewer tensors cached
    recording = _Recording({k: part[k] for k in names})
    got = tld.Profile.from_cache(model, recording, attention_mask=batch.attention_mask, components=components)
    assert recording.read == set(names)  # exactly what from_cache reads: nothing missing, nothing extra
    _same_profile(got, tld.Profile.from_cache(model, full, attention_mask=batch.attention_mask,
                                              components=components))
    full_b, part_b = _nbytes(full_t), _nbytes(part_t)
    print(f"{family} {components}: {len(part_t)} of {len(full_t)} tensors, "
          f"{part_b / 1e3:.1f} of {full_b / 1e3:.1f} kB ({100 * (1 - part_b / full_b):.0f}% saved)")


def test_a_cache_filtered_for_other_components_names_the_helper(tiny_model):
    model = tiny_model("gpt2")
    batch = tld.prepare_inputs(model, TEXTS)
    _, cache = model.run_with_cache(batch.tokens, names_filter=tld.required_hooks(model, components=("attn",)))
    with pytest.raises(ValueError, match=r"cache has no 'blocks\.0\.attn\.hook_.*'; .*"
                                         r"names_filter=tl_directional\.required_hooks\(model, components=\.\.\.\)"):
        tld.Profile.from_cache(model, cache, components=("attn", "value"))


def test_bad_components_are_named(tiny_model):
    with pytest.raises(ValueError, match=r"components has unknown entry 'heads'"):
        tld.required_hooks(tiny_model("gpt2"), components=("heads",))
