"""The layout model: construction, derived values, and every rule with its message."""

import pytest
import recoverssm_rs as rs
from recoverssm_rs import Layout, LayoutError, StateSpec


def k3_states():
    return [
        StateSpec("conv", (12288, 10), "bfloat16", "persistent", "conv", "DS"),
        StateSpec("recurrent", (32, 128, 128), "float32", "persistent", "temporal"),
        StateSpec("verify_corrections", (32, 8, 128), "float32", "workspace"),
        StateSpec("verify_keygate", (32, 8, 256), "bfloat16", "workspace"),
    ]


def test_version_comes_from_the_crate():
    import tomllib
    from pathlib import Path

    cargo = tomllib.loads((Path(__file__).parents[2] / "Cargo.toml").read_text())
    assert rs.__version__ == cargo["package"]["version"]


def test_recoverssm_layout_and_derived_values():
    layout = Layout("GDN_ATTN", k3_states(), num_spec=7)
    assert [s.role for s in layout.states] == ["persistent", "persistent", "workspace", "workspace"]
    assert layout.copyable_prefix_len == 2
    assert layout.persistent_bytes_per_block == 12288 * 10 * 2 + 32 * 128 * 128 * 4
    assert layout.workspace_bytes_per_request == 32 * 8 * 128 * 4 + 32 * 8 * 256 * 2
    assert [s.name for s in layout.persistent] == ["conv", "recurrent"]
    assert layout.state("conv").conv_layout == "DS"
    assert len(layout) == 4
    assert "GDN_ATTN" in repr(layout) and "StateSpec('conv', (12288, 10)" in repr(layout)
    assert layout == Layout("GDN_ATTN", k3_states(), num_spec=7)


def test_dtype_accepts_torch_dtype_objects():
    torch = pytest.importorskip("torch")
    s = StateSpec("t", (4, 4), torch.float16, "persistent", "temporal")
    assert s.dtype == "float16" and s.itemsize == 2 and s.nbytes == 32


def test_workspace_before_persistent_is_rejected_naming_the_state():
    states = k3_states()
    states[0], states[2] = states[2], states[0]
    with pytest.raises(LayoutError) as e:
        Layout("GDN_ATTN", states, num_spec=7)
    msg = str(e.value)
    assert "GDN_ATTN" in msg and "state 1 ('recurrent')" in msg and "copyable prefix" in msg
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda s: s.__setitem__(0, StateSpec("conv", (12288, 10, 2), "bf16", "persistent", "conv")),
            "state 0 ('conv'): a conv copy needs a 2-D",
        ),
        (
            lambda s: s.__setitem__(1, StateSpec("conv", (32, 128, 128), "fp32", "persistent", "temporal")),
            "state 1 ('conv'): the name is used",
        ),
        (
            lambda s: s.__setitem__(1, StateSpec("", (32, 128, 128), "fp32", "persistent", "temporal")),
            "state 1 has an empty name",
        ),
        (
            lambda s: s.__setitem__(2, StateSpec("w", (3,), "fp32", "workspace", "temporal")),
            "state 2 ('w'): a workspace state",
        ),
        (
            lambda s: s.__setitem__(1, StateSpec("r", (32, 128), "fp32", "persistent")),
            "state 1 ('r'): a persistent state needs a copy kind",
        ),
        (
            lambda s: s.__setitem__(1, StateSpec("r", (2**40, 2**40), "fp32", "persistent", "temporal")),
            "overflows 64 bits",
        ),
    ],
)
def test_layout_rules(mutate, expected):
    states = k3_states()
    mutate(states)
    with pytest.raises(LayoutError, match=None) as e:
        Layout("GDN_ATTN", states, num_spec=7)
    assert expected in str(e.value)
    assert str(e.value).startswith("GDN_ATTN")


def test_no_persistent_state():
    with pytest.raises(LayoutError, match="non-empty copyable prefix"):
        Layout("GDN_ATTN", [StateSpec("w", (3,), "fp32", "workspace")])
    with pytest.raises(LayoutError, match="no states"):
        Layout("GDN_ATTN", [])


def test_conv_window_must_outlive_the_speculative_shift():
    with pytest.raises(LayoutError, match=r"width 10 .*num_spec = 10"):
        Layout("GDN_ATTN", k3_states(), num_spec=10)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(shape=(4, 0), copy="temporal"), "dimension 1 of shape"),
        (dict(shape=(4, -2), copy="temporal"), "dimension 1 of shape"),
        (dict(dtype="complex64", copy="temporal"), "unknown dtype 'complex64'"),
        (dict(role="scratch"), "unknown state role 'scratch'"),
        (dict(copy="blob"), "unknown copy kind 'blob'"),
        (dict(copy="conv", conv_layout="XY"), "unknown conv layout 'XY'"),
        (dict(copy="temporal", conv_layout="SD"), "conv copies only"),
    ],
)
def test_state_spec_rules(kwargs, expected):
    args = dict(name="s", shape=(4, 4), dtype="float32", role="persistent") | kwargs
    with pytest.raises(LayoutError) as e:
        StateSpec(**args)
    assert expected in str(e.value) and "state 's'" in str(e.value)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn", "int8", "uint8"])
def test_known_dtypes(dtype):
    assert StateSpec("s", (2, 3), dtype, "persistent", "conv").dtype == dtype


def test_to_dict_round_trip():
    layout = Layout("GDN_ATTN", k3_states(), num_spec=7)
    d = layout.to_dict()
    rebuilt = Layout(
        d["backend"],
        [StateSpec(s["name"], s["shape"], s["dtype"], s["role"], s["copy"], s["conv_layout"]) for s in d["states"]],
        num_spec=d["num_spec"],
    )
    assert rebuilt == layout
