"""find_safe_scale and random per-layer scales: a random setting is refused with an error that
names the argument and the fix, and the documented fix (a callable along the draw's amplitude,
``s_par_L = 1 + (s - 1) * (draw_L - 1)``) evaluates the draw itself at ``s = 2``, equal to the
sweep's damage of that random setting."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.sweeps.random_draws import RandomScaleError

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
]


def test_a_random_setting_is_refused_with_the_fix(tiny_model):
    model = tiny_model("gpt2")
    drawn = tld.random_setting("value-exclusive", int(model.cfg.n_layers), "uniform", seed=1)
    with pytest.raises(
        RandomScaleError, match=r"edit_factory=.*random=uniform,seed=1.*sweep\(model, inputs"
    ):
        tld.find_safe_scale(model, TEXTS, drawn)
    assert isinstance(RandomScaleError("x"), ValueError)
    with pytest.raises(
        TypeError,
        match=r"pass its space name, edit_factory='resid-mlp', with layer_groups=\[\[1\]\]",
    ):
        tld.find_safe_scale(model, TEXTS, tld.Setting("resid-mlp", 0.0, layers=(1,)))


def test_the_documented_amplitude_search_evaluates_the_draw_at_two(tiny_model):
    model = tiny_model("gpt2")
    n = int(model.cfg.n_layers)
    drawn = tld.random_setting("value-exclusive", n, "uniform", seed=1)
    draw = torch.tensor(drawn.layer_s_par, dtype=torch.float64)

    def along_draw(s_par=1.0, s_perp=1.0, layers=None):
        return tld.Setting("value-exclusive", layers=layers and tuple(layers)).edits(
            s_par=1 + (s_par - 1) * (draw - 1), s_perp=s_perp
        )

    (res,) = tld.find_safe_scale(
        model, TEXTS, along_draw, budget=10.0, bounds=(0.0, 3.0), grid_points=7, refine_steps=0
    )
    ev = res.evaluations.set_index("scale")["cost"]
    assert ev.loc[1.0] == pytest.approx(0.0, abs=1e-6)  # s = 1: unedited (bit-exact no-op scales)
    row = tld.sweep(model, TEXTS, [drawn], progress=False).set_index("label").loc[drawn.label]
    assert ev.loc[2.0] == pytest.approx(float(row["delta_loss"]), rel=1e-5, abs=1e-7)
    assert res.interval[0] <= 1.0 <= res.interval[1]
