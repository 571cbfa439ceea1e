"""validate_copy_funcs: the vLLM start-up check with the copyable-prefix contract restored."""

import enum
from dataclasses import dataclass, field

import pytest
from recoverssm_rs import LayoutError, layouts, validate_copy_funcs


class Backend(enum.Enum):
    GDN_ATTN = "gdn_attention"
    MAMBA2 = "mamba2"
    MAMBA1 = "mamba1"
    SHORT_CONV = "short_conv"
    LINEAR = "linear_attention"


@dataclass(frozen=True)
class MambaSpec:  # the fields vLLM's MambaSpec carries
    shapes: tuple
    dtypes: tuple
    mamba_type: Backend
    block_size: int = 16
    num_speculative_blocks: int = 3
    mamba_cache_mode: str = "align"
    page_size_padded: int | None = field(default=None)


def get_conv_copy_spec(*args):  # stand-ins for vLLM's copy-spec functions, recognised by name
    raise AssertionError("never called")


def get_temporal_copy_spec(*args):
    raise AssertionError("never called")


def spec_of(layout, backend=Backend.GDN_ATTN, **kw):
    return MambaSpec(tuple(s.shape for s in layout.states), tuple(s.dtype for s in layout.states), backend, **kw)


K3 = layouts.preset("kimi-k3-like-recoverssm")


def test_recoverssm_four_states_two_copy_funcs_is_accepted():
    groups = {spec_of(K3): ["layer.0", "layer.1"]}  # vLLM's mamba_groups: spec -> layer names
    funcs = {Backend.GDN_ATTN: (get_conv_copy_spec, get_temporal_copy_spec)}
    assert validate_copy_funcs(groups, funcs) == {"GDN_ATTN": 2}


@pytest.mark.parametrize(
    "name, backend",
    [
        ("qwen3-next-80b-a3b", Backend.GDN_ATTN),
        ("kimi-linear-48b-a3b", Backend.GDN_ATTN),
        ("nemotron-h-8b", Backend.MAMBA2),
    ],
)
def test_equal_length_cases_for_presets(name, backend):
    layout = layouts.preset(name, num_spec=3)
    funcs = {backend: [s.copy for s in layout.states]}
    assert validate_copy_funcs([spec_of(layout, backend)], funcs) == {backend.name: len(layout)}


@pytest.mark.parametrize(
    "layout, backend",
    [
        (layouts.mamba1(intermediate_size=1024, state_size=16, conv_kernel=4), Backend.MAMBA1),
        (layouts.short_conv(intermediate_size=1024, conv_kernel=3, num_spec=2), Backend.SHORT_CONV),
        (layouts.linear_attention(num_heads=8, head_dim=64), Backend.LINEAR),
        (
            layouts.gdn(num_k_heads=4, num_v_heads=8, head_k_dim=64, head_v_dim=64, conv_kernel_size=4, num_spec=2),
            Backend.GDN_ATTN,
        ),
    ],
)
def test_equal_length_cases_for_every_family(layout, backend):
    funcs = {backend.name: [s.copy for s in layout.states]}
    assert validate_copy_funcs([spec_of(layout, backend)], funcs) == {backend.name: len(layout)}


def test_missing_backend_entry():
    with pytest.raises(LayoutError, match="missing state copy funcs for GDN_ATTN"):
        validate_copy_funcs([spec_of(K3)], {Backend.MAMBA2: ["conv", "temporal"]})


def test_empty_sequence():
    with pytest.raises(LayoutError) as e:
        validate_copy_funcs([spec_of(K3)], {"GDN_ATTN": []})
    assert "GDN_ATTN declares 4 states, but provides 0 state copy funcs" in str(e.value)
    assert "expected a non-empty copyable prefix" in str(e.value)


def test_more_copy_funcs_than_states():
    with pytest.raises(LayoutError) as e:
        validate_copy_funcs([spec_of(K3)], {"GDN_ATTN": ["conv", "temporal"] * 3})
    assert "declares 4 states, but provides 6" in str(e.value)
    assert "expected a non-empty copyable prefix" in str(e.value)


def test_non_prefix_layout_is_caught_by_the_copy_kind():
    # Workspace first: the conv copy function would land on a 3-D verify-record tensor.
    shapes = tuple(s.shape for s in K3.states)
    reordered = MambaSpec(shapes[2:] + shapes[:2], ("float32", "bfloat16", "bfloat16", "float32"), Backend.GDN_ATTN)
    with pytest.raises(LayoutError) as e:
        validate_copy_funcs([reordered], {"GDN_ATTN": [get_conv_copy_spec, get_temporal_copy_spec]})
    msg = str(e.value)
    assert "GDN_ATTN" in msg and "state 0 (32, 8, 128) float32" in msg and "3-D" in msg


def test_unknown_copy_function():
    def copy_everything():
        pass

    with pytest.raises(LayoutError, match="unrecognised copy function 'copy_everything'"):
        validate_copy_funcs([spec_of(K3)], {"GDN_ATTN": ["conv", copy_everything]})


@pytest.mark.parametrize(
    "field_, value, phrase",
    [
        ("block_size", 32, "block size"),
        ("num_speculative_blocks", 1, "number of speculative blocks"),
        ("mamba_cache_mode", "all", "cache mode"),
    ],
)
def test_groups_must_agree(field_, value, phrase):
    m2 = layouts.preset("nemotron-h-8b", num_spec=3)
    a = spec_of(K3)
    b = spec_of(m2, Backend.MAMBA2, **{field_: value})
    funcs = {"GDN_ATTN": ["conv", "temporal"], "MAMBA2": ["conv", "temporal"]}
    assert validate_copy_funcs([a, spec_of(m2, Backend.MAMBA2)], funcs) == {"GDN_ATTN": 2, "MAMBA2": 2}
    with pytest.raises(LayoutError) as e:
        validate_copy_funcs([a, b], funcs)
    assert phrase in str(e.value) and "MAMBA2" in str(e.value)


def test_plain_dicts_are_accepted():
    group = {"backend": "GDN_ATTN", "shapes": [s.shape for s in K3.states]}
    assert validate_copy_funcs([group], {"GDN_ATTN": ["conv", "temporal"]}) == {"GDN_ATTN": 2}
    with pytest.raises(LayoutError, match="needs a backend"):
        validate_copy_funcs([{"shapes": []}], {})
