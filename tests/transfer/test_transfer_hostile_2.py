"""The host tier refuses a key that does not equal itself: a NaN (float, numpy, complex, Decimal),
or a tuple or frozenset holding one, could be put but never found or dropped by the same key built
again; every call naming one is a PlanError naming the key, and nothing changes. ``load_states``
refuses a ``pin_memory`` that is not a bool (PlanError naming it) before it reads the file."""

from __future__ import annotations

import decimal
import re

import numpy as np
import pytest
from recoverssm_rs.errors import PlanError
from recoverssm_rs.transfer import HostCache, HostOffload, load_states, save_states
from test_transfer_cache import _blocks, _pool, _same


class _Never:
    """Hashable, but equal to nothing (itself included)."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return False

    def __repr__(self) -> str:
        return "Never()"


NAN_KEYS = {
    "float": (lambda: float("nan"), "nan"),
    "numpy": (lambda: np.float64("nan"), "nan"),
    "complex": (lambda: complex("nan"), "nan"),
    "decimal": (lambda: decimal.Decimal("NaN"), "Decimal('NaN')"),
    "tuple": (lambda: ("req", float("nan")), "('req', nan)"),
    "nested": (lambda: ("req", (1, float("nan"))), "('req', (1, nan))"),
    "frozenset": (lambda: frozenset({1, float("nan")}), "frozenset"),
    "never-equal": (lambda: _Never(), "Never()"),
}


@pytest.mark.parametrize("make", [v[0] for v in NAN_KEYS.values()], ids=list(NAN_KEYS))
def test_a_key_that_does_not_equal_itself_is_refused_and_changes_nothing(make):
    lay, states, pool = _pool()
    cache = HostCache(pool, 10**9)
    cache.put("a", [1])
    want = _blocks(states, [1])
    key = make()
    shown = re.escape(repr(key)[:40])
    before = (len(cache), cache.used_bytes, cache.hits, cache.misses)
    with pytest.raises(PlanError, match=f"key {shown}.*equal to itself"):
        cache.put(key, [2])
    assert (len(cache), cache.used_bytes, cache.hits, cache.misses) == before
    # Every other entry point refuses it the same way, the same object included.
    for call in (cache.get, cache.drop, lambda k: cache.restore(k, [3]), lambda k: cache.prefetch(k, [3])):
        with pytest.raises(PlanError, match=f"key {shown}"):
            call(key)
    assert key not in cache
    assert (len(cache), cache.used_bytes, cache.hits, cache.misses) == before
    assert cache.restore("a", [4]) and _same(states, [4], want)


@pytest.mark.parametrize("key", ["a", 0, -1, 2.5, float("inf"), ("req", 7, (1.5, "x")), frozenset({1, 2}), None, b"k"])
def test_keys_that_equal_themselves_are_found_again_when_built_again(key):
    lay, states, pool = _pool()
    cache = HostCache(pool, 10**9)
    cache.put(key, [1])
    again = type(key)(key) if isinstance(key, (str, int, float, tuple, frozenset, bytes)) else key
    assert again in cache and cache.restore(again, [5])
    cache.drop(again)
    assert len(cache) == 0


# ---- load_states' pin_memory --------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", 1, 0, None, 1.0, np.bool_(True)], ids=repr)
def test_load_states_refuses_a_pin_memory_that_is_not_a_bool(tmp_path, value):
    lay, _, pool = _pool()
    path = tmp_path / "s.safetensors"
    save_states(HostOffload(pool).offload([1, 2]), path)
    kind = (
        type(value).__name__
        if type(value).__module__ == "builtins"
        else f"{type(value).__module__}.{type(value).__name__}"
    )
    with pytest.raises(PlanError, match=f"pin_memory must be a bool, got {kind}"):
        load_states(path, lay, pin_memory=value)
    # Checked before the file is read: a missing file is not what is reported.
    with pytest.raises(PlanError, match="pin_memory must be a bool"):
        load_states(tmp_path / "missing.safetensors", lay, pin_memory=value)
    loaded = load_states(path, lay, pin_memory=False)
    assert loaded.num_requests == 2
