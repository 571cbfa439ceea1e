"""vLLM's state-copy functions are recognised by what they do, not by their names: vLLM 0.33.0's own
``get_conv_copy_spec`` / ``get_temporal_copy_spec`` / ``get_full_copy_spec`` (from the downloaded
wheel) in both conv layouts, the same functions renamed or wrapped, and functions that are neither."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recoverssm_rs import LayoutError  # noqa: E402
from recoverssm_rs.contract import copy_func_name  # noqa: E402
from recoverssm_rs.vllm import copy_kind  # noqa: E402
from support import vllm_oracle  # noqa: E402


@pytest.fixture(scope="module")
def oracle():
    return vllm_oracle.load_or_skip(vllm_oracle.load, f"vLLM {vllm_oracle.VERSION}")


def _renamed(f, name):
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_vllms_copy_functions_are_recognised_by_what_they_do(oracle, layout):
    vllm_oracle.set_conv_layout(oracle, layout)
    try:
        calc = oracle.lmu.MambaStateCopyFuncCalculator
        conv, temporal = calc.mamba1_state_copy_func()
        assert [copy_kind(f) for f in (conv, temporal)] == ["conv", "temporal"]
        # The names say the opposite of what the functions do: what they do decides.
        assert copy_kind(_renamed(conv, "get_temporal_copy_spec")) == "conv"
        assert copy_kind(_renamed(temporal, "conv_state_copy")) == "temporal"
        assert copy_kind(functools.partial(temporal)) == "temporal"
        (linear,) = calc.linear_attention_state_copy_func()
        assert copy_kind(linear) == "temporal"
    finally:
        vllm_oracle.set_conv_layout(oracle, "SD")


def test_names_go_to_the_cores_table_and_strangers_are_refused():
    assert copy_kind("get_conv_copy_spec") == "conv" and copy_kind("temporal") == "temporal"
    with pytest.raises(LayoutError, match='"my_convolution_helper" is neither a conv nor a temporal copy'):
        copy_kind("my_convolution_helper")  # no substring match

    def get_conv_copy_spec(state, block_ids, cur, accepted):  # the name of vLLM's, another behaviour
        return None

    # Not a copy-spec function (it returns no spec): its name is all there is to go by.
    assert copy_func_name(get_conv_copy_spec) == "get_conv_copy_spec"
    with pytest.raises(LayoutError, match="neither a conv nor a temporal"):
        copy_kind(lambda *a: None)
