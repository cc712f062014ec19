"""Fixtures of the studies' tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def restore_grad_mode():
    """Autograd's mode as it was before the test: the studies' mains turn it off for the whole
    process (they are command-line programs); run in-process by a test, that must not leak into
    the rest of the suite. A test file asks for it with
    ``pytestmark = pytest.mark.usefixtures("restore_grad_mode")``."""
    was = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(was)
