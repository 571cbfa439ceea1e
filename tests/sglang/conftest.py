"""Fixtures of the SGLang adapter's device tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def strided_fakes(monkeypatch):
    """FakeCuda tensors that can be viewed with other strides (as the adapter views its slot ids)."""
    from support.device_fakes import FakeCuda

    def as_strided(self, size, stride):
        return FakeCuda(self.t.as_strided(size, stride), self.device.index)

    monkeypatch.setattr(FakeCuda, "as_strided", as_strided, raising=False)
