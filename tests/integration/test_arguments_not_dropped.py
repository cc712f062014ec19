"""Issue 47: arguments that were dropped without a word now stop the run with one ``error:``
line naming the argument and the fix (through the real CLI entry point), each of which exited 0
before: an empty ``--layers`` (an unset shell variable) edited every layer, a compression spec with
both a sparsity and an N:M pattern pruned N:M and ignored the sparsity, and ``--random`` beside
only unscaled spaces dropped the random rows."""

from __future__ import annotations

import pytest

from tests.integration.test_cli_rough_edges import _one_error_line
from tests.integration.test_habits import _cli
from tl_directional.compression.specs import parse_spec
from tl_directional.evaluate.sweeps.edit_spec import layer_sets

TEXT = " ".join(f"In the beginning word {i} was spoken and the people heard it." for i in range(20))


@pytest.mark.parametrize("text", ["", "  ", "0-1;", ";all"])
def test_an_empty_layer_set_is_refused(text):
    with pytest.raises(ValueError, match="empty"):
        layer_sets(text, 4)
    assert layer_sets("all", 4) == [None] and layer_sets("0-1;-1", 4) == [[0, 1], [3]]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("wanda:sparsity=0.3,nm=2:4", "gives both 'sparsity=0.3' and 'nm=2:4'"),
        ("magnitude:nm=2:4,s=30%", "gives both 's=30%' and 'nm=2:4'"),
        ("wanda_perp:sparsity=0.3,nm=2:4", "gives both"),
        ("rtn:bits=4,bits=8", "sets bits twice ('bits=4' and 'bits=8')"),
        ("magnitude:s=0.3,sparsity=0.5", "sets sparsity twice"),
    ],
)
def test_conflicting_spec_keys_are_refused(spec, needle):
    with pytest.raises(ValueError) as info:
        parse_spec(spec)
    assert str(info.value).startswith(f"spec {spec!r}") and needle in str(info.value)
    assert parse_spec("wanda:nm=2:4") == ("wanda", {"n_m": (2, 4)})


def test_cli_refuses_each_dropped_argument(tiny_model_dir, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    model = tiny_model_dir("gpt2")
    rc, err = _cli("sweep", "--model", model, "--text", text, "--space", "value", "--layers", "",
                   "--out", tmp_path / "a", "--quiet")
    _one_error_line(rc, err, "--layers '' is empty", "'all'")
    rc, err = _cli("sweep", "--model", model, "--text", text, "--space", "hard-diag", "--random", "uniform:0",
                   "--out", tmp_path / "b", "--quiet")
    _one_error_line(rc, err, "--random", "'hard-diag'", "--space value")
    rc, err = _cli("compress", "--model", model, "--spec", "wanda:sparsity=0.3,nm=2:4", "--out", tmp_path / "c")
    _one_error_line(rc, err, "gives both 'sparsity=0.3' and 'nm=2:4'")
    assert not any((tmp_path / d).exists() for d in "abc")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (("profile", "--seq-len", "1"), ("--seq-len 1 leaves 0 text token(s)", "--seq-len 3 or more")),
        (("profile", "--drop-cosine", "--max-sequences", "1", "--seq-len", "2"), ("--seq-len 2 leaves 1",)),
        (("sweep", "--seq-len", "1"), ("--seq-len 3 or more",)),
        (("sweep", "--space", "value", "--random", "uniform:99999999999999999999999"),
         ("seed 99999999999999999999999 is out of range", "[0, 2**63 - 1]")),
    ],
)
def test_internal_messages_no_longer_leak(tiny_model_dir, tmp_path, argv, fragments):
    """Each used to print an internal message (``range() arg 3 must not be zero``, ``max() arg is
    an empty sequence``, ``Overflow when unpacking long long``) instead of naming the argument."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    rc, err = _cli(*argv, "--model", tiny_model_dir("gpt2"), "--text", text, "--out", tmp_path / "o", "--quiet")
    _one_error_line(rc, err, *fragments)
