"""Argument errors say what was wrong with the value given: an explicit ``None`` is a wrong value (not a
missing argument), a value's kind is named as it is (numpy's bool is not Python's), and an integer
out of range is shown (or, past what Python prints in decimal, its size) with the bound it crosses."""

from __future__ import annotations

import numpy as np
import pytest
from recoverssm_rs import LayoutError, StateSpec, layouts

MAMBA2 = dict(intermediate_size=4096, n_groups=8, num_heads=64, head_dim=64, state_size=128, conv_kernel=4)
KDA = dict(num_heads=32, head_dim=128)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: layouts.mamba2(**MAMBA2, tp_size=None), "tp_size"),
        (lambda: layouts.kda(**KDA, num_spec=None), "num_spec"),
        (lambda: layouts.linear_attention(num_heads=None, head_dim=64), "num_heads"),
        (
            lambda: layouts.gdn(num_k_heads=4, num_v_heads=8, head_k_dim=64, head_v_dim=None, conv_kernel_size=4),
            "head_v_dim",
        ),
        (lambda: layouts.mamba1(intermediate_size=64, state_size=16, conv_kernel=4, conv_layout=None), "conv_layout"),
    ],
)
def test_an_explicit_none_is_a_wrong_value_not_a_missing_argument(call, name):
    with pytest.raises(LayoutError) as e:
        call()
    message = str(e.value)
    assert message.startswith(f"{name} must be a ") and message.endswith("got NoneType"), message
    assert "missing" not in message


@pytest.mark.parametrize(
    "value, shown",
    [
        (np.bool_(True), f"got numpy.bool {np.bool_(True)!r}"),
        (True, "got bool True"),
        (np.float32(2), f"got numpy.float32 {np.float32(2)!r}"),
        (2.0, "got float 2.0"),
        (np.array([2]), "got numpy.ndarray"),  # a 1-D array is not a (0-d) integer
        ("2", "got str"),
    ],
    ids=repr,
)
def test_a_value_of_the_wrong_kind_is_named_as_what_it_is(value, shown):
    with pytest.raises(LayoutError) as e:
        layouts.kda(**KDA, tp_size=value)
    assert str(e.value) == f"tp_size must be a host integer (a Python or numpy int), {shown}"
    with pytest.raises(LayoutError) as e:
        StateSpec("x", [4, value], "float32")
    assert str(e.value) == f"state 'x': shape[1] must be a host integer (a Python or numpy int), {shown}"


def test_a_numpy_bool_where_a_bool_belongs_is_named_numpys():
    with pytest.raises(LayoutError, match="^recover_ssm must be a bool, got numpy.bool$"):
        layouts.kda(**KDA, recover_ssm=np.bool_(True))


def test_an_int_array_of_another_dtype_is_named_with_its_dtype():
    with pytest.raises(LayoutError) as e:
        StateSpec("x", np.array([4, 2], np.float32), "float32")
    assert str(e.value).endswith("got numpy.ndarray of float32")
    with pytest.raises(LayoutError) as e:
        StateSpec("x", [[4, 2], [1]], "float32")  # ragged: no element is at fault
    assert str(e.value).endswith("list of ints), got list")


@pytest.mark.parametrize("value", [2**63, 2**64, 2**70, 2**200, -(2**63) - 1, -(10**40)], ids=str)
def test_a_shape_entry_past_int64_is_shown_with_its_value(value):
    with pytest.raises(LayoutError) as e:
        StateSpec("x", [4, value], "float32")
    bound = f"must be >= {-(2**63)}" if value < 0 else f"is too large (at most {2**63 - 1})"
    assert str(e.value) == f"state 'x': shape[1] = {value} {bound}"


@pytest.mark.parametrize("value", [2**64, 2**127, 2**128, 2**200, -(2**130)], ids=str)
def test_an_integer_argument_out_of_range_is_shown_with_its_value(value):
    with pytest.raises(LayoutError) as e:
        layouts.kda(**KDA, tp_size=value)
    bound = "must be >= 0" if value < 0 else f"is too large (at most {2**64 - 1})"
    assert str(e.value) == f"tp_size = {value} {bound}"


def test_an_integer_too_long_to_print_is_shown_by_its_size():
    value = 10**5000  # past Python's limit on printing an int in decimal
    with pytest.raises(LayoutError) as e:
        layouts.kda(**KDA, tp_size=value)
    assert str(e.value) == f"tp_size is an integer of {value.bit_length()} bits, too large (at most {2**64 - 1})"
    with pytest.raises(LayoutError) as e:
        StateSpec("x", [-value], "float32")
    assert (
        str(e.value)
        == f"state 'x': shape[0] is a negative integer of {value.bit_length()} bits; it must be >= {-(2**63)}"
    )
