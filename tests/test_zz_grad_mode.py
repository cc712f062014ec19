"""Guard: no test module may leave autograd switched off for the tests after it."""

import torch


def test_grad_mode_is_on_after_every_other_module():
    assert torch.is_grad_enabled(), "a test module disabled autograd globally (use a fixture or torch.no_grad())"
