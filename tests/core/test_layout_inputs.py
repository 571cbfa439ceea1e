"""Bad inputs to the layout model and the copy-function check: each is the package's error naming
the argument (and the backend, the state or the dimension) and its value."""

from __future__ import annotations

import pytest
from recoverssm_rs import LayoutError, StateSpec, _core, validate_copy_funcs


@pytest.mark.parametrize("name, kind", [(None, "NoneType"), (5, "int"), (b"conv", "bytes")], ids=repr)
def test_copy_func_kind_of_a_non_string_is_a_layout_error(name, kind):
    with pytest.raises(LayoutError, match=f"^copy function name must be a string, got {kind}$"):
        _core.copy_func_kind(name)
    assert _core.copy_func_kind("get_conv_copy_spec") == "conv"


def test_a_shape_of_two_dimensions_is_not_described_as_per_request():
    with pytest.raises(LayoutError) as e:
        StateSpec("x", [[1, 2]], "float32")
    assert str(e.value) == "state 'x': shape must be 1-D, got shape [1, 2]"


@pytest.mark.parametrize("field", ["dtypes", "shapes"])
def test_a_string_where_a_list_per_state_belongs_is_refused_naming_the_backend(field):
    """A string was read character by character: ``dtypes="float32"`` passed as seven dtypes."""
    group = dict(backend="GDN_ATTN", shapes=[[3, 4]], dtypes=["float32"])
    group[field] = "float32"
    with pytest.raises(LayoutError) as e:
        validate_copy_funcs([group], {"GDN_ATTN": ["conv"]})
    assert str(e.value) == f"GDN_ATTN: {field} must be a list, one entry per state, got the string 'float32'"


def test_a_bad_shape_entry_is_named_by_its_shape_and_dimension():
    group = dict(backend="GDN_ATTN", shapes=[[3, 4], [2, 2.5]])
    with pytest.raises(LayoutError, match=r"^GDN_ATTN: shapes\[1\]\[1\] must be a host integer .*got float 2.5$"):
        validate_copy_funcs([group], {"GDN_ATTN": ["conv"]})
    group = dict(backend="GDN_ATTN", shapes=[[3, 4], 7])
    with pytest.raises(
        LayoutError, match=r"^GDN_ATTN: shapes \(a list of shapes, each a sequence of integers\): TypeError"
    ):
        validate_copy_funcs([group], {"GDN_ATTN": ["conv"]})


def test_a_dtype_list_of_another_length_than_the_shapes_is_refused():
    """``dtypes`` names each state's dtype: one more or one fewer than the states is a group read
    wrongly (it was accepted, and a message named the wrong state's dtype or none)."""
    for dtypes in (["float32"], ["float32", "float32", "float32"]):
        group = dict(backend="GDN_ATTN", shapes=[[3, 4], [2, 2]], dtypes=dtypes)
        with pytest.raises(LayoutError, match=rf"^group 0 \(GDN_ATTN\): {len(dtypes)} dtypes for 2 states"):
            validate_copy_funcs([group], {"GDN_ATTN": ["conv", "temporal"]})


def test_a_block_size_of_zero_is_refused():
    group = dict(backend="GDN_ATTN", shapes=[[3, 4], [2, 2]], block_size=0)
    with pytest.raises(LayoutError, match=r"^group 0 \(GDN_ATTN\): block_size = 0: a block holds at least one token"):
        validate_copy_funcs([group], {"GDN_ATTN": ["conv", "temporal"]})
    group["block_size"] = 16
    assert validate_copy_funcs([group], {"GDN_ATTN": ["conv", "temporal"]}) == {"GDN_ATTN": 2}
