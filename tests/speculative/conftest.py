"""The speculative tests' shared fixture: tiny tensors, one torch thread (extra threads only spin on
a loaded 2-core machine)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    try:
        import torch
    except ImportError:  # a test that needs torch skips itself
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
