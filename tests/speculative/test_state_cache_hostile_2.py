"""Bad inputs to speculative decoding's state caches (:class:`StateCache` and the Kimi-K3 commit
over vLLM's own tensors): each is the package's error, naming the argument, row or layer, and
changes no state (compared byte for byte before and after)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from recoverssm_rs import BindingError, PlanError
from recoverssm_rs.speculative.kimi_k3 import KimiK3Commit

N, H, V, K, Q, HIST, D, R = 16, 2, 4, 4, 3, 3, 8, 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def kimi_args(layers: int = 2, seed: int = 0) -> dict[str, Any]:
    """The tensors of ``layers`` Kimi-K3 KDA layers, each its own allocation, random contents."""
    g = torch.Generator().manual_seed(seed)

    def each(*shape: int) -> list[torch.Tensor]:
        return [torch.randn(*shape, generator=g) for _ in range(layers)]

    return dict(
        conv_states=each(N, D, HIST + Q - 1),
        states=each(N, H, V, K),
        corrections=each(R, H, Q, V),
        key_gates=each(R, H, Q, 2 * K),
        A_log=each(H),
        dt_bias=each(H, K),
        gate_lower_bound=[None] * layers,
        spec_query_len=Q,
    )


def kimi_state(a: dict[str, Any]) -> list[torch.Tensor]:
    return [t.clone() for t in (*a["conv_states"], *a["states"])]


def assert_kimi_unchanged(a: dict[str, Any], before: list[torch.Tensor]) -> None:
    for t, b in zip((*a["conv_states"], *a["states"]), before, strict=True):
        assert torch.equal(t, b)


BT = np.array([[5, 6, 7, 0], [9, 10, 11, 0]])


# ----------------------------------------------------------------------------------------------
# Kimi-K3: the plan


@pytest.mark.parametrize("computed", [2**63 - 1, 2**63 - 3])
def test_kimi_k3_token_positions_past_int64_are_a_plan_error(computed):
    """A number of computed tokens whose window ends past 2**63 - 1 was a Rust panic (an
    ``index out of bounds`` PanicException from the wrapped arithmetic)."""
    a = kimi_args()
    kc = KimiK3Commit(**a)
    before = kimi_state(a)
    with pytest.raises(PlanError) as info:
        kc.commit([3, 1], [2, 8], [0, 3, 6], block_table=BT, num_computed_tokens=[computed, 1], mamba_block_size=4)
    assert f"row 0 (request 0): num_computed_tokens {computed}" in str(info.value)
    assert_kimi_unchanged(a, before)


# ----------------------------------------------------------------------------------------------
# Kimi-K3: scalar arguments


def test_kimi_k3_a_positive_gate_lower_bound_is_refused():
    """The gate ``lower_bound * sigmoid(..)`` is a log-decay: a positive bound made every decay a
    growth (the states blew up silently)."""
    a = kimi_args()
    a["gate_lower_bound"] = [5.0, 5.0]
    with pytest.raises(BindingError, match="layer 0: gate_lower_bound must be finite and <= 0"):
        KimiK3Commit(**a)
    a["gate_lower_bound"] = [-5.0, -5.0]
    KimiK3Commit(**a)


# ----------------------------------------------------------------------------------------------
# Kimi-K3: tensors


# ----------------------------------------------------------------------------------------------
# StateCache


def assert_unchanged(cache, before) -> None:
    for name, buf in cache.buffers().items():
        assert torch.equal(buf, before[name]), f"{name} changed"
