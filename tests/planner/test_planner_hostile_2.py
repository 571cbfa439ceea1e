"""The planner's published-block calls under hostile scalars: a ``group`` or ``block`` that is
negative, past 64 bits or not an integer is refused with the package's error naming it (was
PyO3's bare ``OverflowError`` or ``TypeError``), and nothing is published."""

from __future__ import annotations

import numpy as np
import pytest
from recoverssm_rs import Layout, PlanError, Planner, StateSpec

NB = 10


def _planner():
    layout = Layout(
        "X",
        [
            StateSpec("conv", (3, 4), "float32", copy="conv", conv_layout="SD"),
            StateSpec("temporal", (2, 2), "float32", copy="temporal"),
        ],
        num_spec=1,
    )
    rng = np.random.default_rng(0)
    states = [[rng.standard_normal((NB, 3, 4)).astype(np.float32), rng.standard_normal((NB, 2, 2)).astype(np.float32)]]
    return Planner(layout, states)


# (value, what the message says of it)
BAD_GROUPS = {
    "negative": (-1, "group = -1 must be >= 0"),
    "past 64 bits": (2**64, "group = 18446744073709551616 is too large"),
    "float": (0.0, "group must be a host integer"),
    "bool": (True, "group must be a host integer"),  # not read as group 1
    "str": ("0", "group must be a host integer"),
}
CALLS = {
    "publish": lambda p, g: p.publish([1], group=g),
    "retract": lambda p, g: p.retract([1], group=g),
    "published": lambda p, g: p.published(g),
    "holders": lambda p, g: p.holders(1, group=g),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("bad", list(BAD_GROUPS))
def test_a_bad_group_is_refused_naming_it(call, bad):
    p = _planner()
    p.publish([2])
    value, message = BAD_GROUPS[bad]
    with pytest.raises(PlanError, match="^" + message):
        CALLS[call](p, value)
    assert p.published() == [2] and p.holders(2) == 1 and p.holders(1) == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (-1, "block = -1 must be >= 0"),
        (2**64, "block = 18446744073709551616 is too large"),
        (1.0, "block must be a host integer"),
        (True, "block must be a host integer"),  # not read as block 1
    ],
)
def test_a_bad_block_of_holders_is_refused_naming_it(bad, message):
    p = _planner()
    p.publish([1])
    with pytest.raises(PlanError, match="^" + message):
        p.holders(bad)
    assert p.holders(1) == 1


@pytest.mark.parametrize("value", [np.int64(1), np.int32(1), np.uint16(1), np.array(1)], ids=repr)
def test_a_numpy_integer_is_a_host_integer(value):
    """numpy's integer scalars (and 0-d integer arrays) are host integers, as the errors say: numpy
    2 gives its scalars a ``device`` attribute, which the conversion once took for a tensor's and
    refused every numpy integer for."""
    p = _planner()
    p.publish([value])
    assert p.published() == [1] and p.holders(value, group=np.int64(0)) == 1
    with pytest.raises(PlanError, match="^block must be a host integer"):
        p.holders(np.bool_(True))  # numpy's bool is not read as block 1
