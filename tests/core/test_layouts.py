"""Layout calculators: the formulas of docs/design.md section 4 on the presets, and their errors."""

import inspect

import pytest
from recoverssm_rs import LayoutError, layouts


def shapes(layout):
    return [s.shape for s in layout.states]


def test_qwen3_next_gdn_formulas():
    for tp in (1, 2, 4):
        for nspec in (0, 3):
            l = layouts.preset("qwen3-next-80b-a3b", tp_size=tp, num_spec=nspec)
            # conv dim = (2 nk hk + nv hv) / tp, width = K - 1 + nspec, SD = (width, dim)
            assert l.states[0].shape == (3 + nspec, (2 * 16 * 128 + 32 * 128) // tp)
            # temporal (nv / tp, hv, hk)
            assert l.states[1].shape == (32 // tp, 128, 128)
            assert l.backend == "GDN_ATTN" and l.copyable_prefix_len == 2


def test_kimi_linear_kda_formulas():
    l = layouts.preset("kimi-linear-48b-a3b", tp_size=2, conv_layout="DS")
    assert l.states[0].shape == ((32 * 128 + 2 * 32 * 128) // 2, 3)
    assert l.states[1].shape == (16, 128, 128) and l.states[1].dtype == "float32"


def test_kimi_k3_like_recoverssm_layout():
    l = layouts.preset("kimi-k3-like-recoverssm")
    q = 7 + 1
    assert [s.role for s in l.states] == ["persistent", "persistent", "workspace", "workspace"]
    assert shapes(l) == [(12288, 3 + 7), (32, 128, 128), (32, q, 128), (32, q, 256)]
    assert [s.dtype for s in l.states] == ["bfloat16", "float32", "float32", "bfloat16"]
    assert l.workspace_bytes_per_request == 32 * q * 128 * 4 + 32 * q * 256 * 2


def test_gdn_recoverssm_records():
    l = layouts.gdn(
        num_k_heads=16,
        num_v_heads=32,
        head_k_dim=128,
        head_v_dim=128,
        conv_kernel_size=4,
        num_spec=3,
        recover_ssm=True,
        tp_size=2,
    )
    assert shapes(l)[2:] == [(16, 4, 128), (16, 4, 129)]


def test_nemotron_h_mamba2_formulas_and_replay_rings():
    l = layouts.preset("nemotron-h-8b", tp_size=2, num_spec=2)
    # n_groups 8 divisible by 2: g' = 8; dim = (8192 + 2 * 8 * 128) / 2
    assert l.states[0].shape == (3 + 2, (8192 + 2 * 8 * 128) // 2)
    assert l.states[1].shape == (64, 64, 128)
    r = layouts.preset("nemotron-h-8b", tp_size=2, logical_window=16)
    assert shapes(r)[2:] == [(64, 16, 64), (64, 16), (4, 16, 128)]
    assert [s.role for s in r.states[2:]] == ["workspace"] * 3 and r.copyable_prefix_len == 2
    # vLLM's ring dtypes: x and B in the activation (model) dtype, dt in fp32.
    r = layouts.preset("nemotron-h-8b", logical_window=16, ssm_dtype="float16")
    assert [s.dtype for s in r.states[2:]] == ["bfloat16", "float32", "bfloat16"]
    # FlashInfer keeps the live window and the verify window together: W + 1 + num_spec.
    f = layouts.preset("nemotron-h-8b", tp_size=2, num_spec=3, logical_window=16, mamba_backend="flashinfer")
    assert shapes(f)[2:] == [(64, 20, 64), (64, 20), (4, 20, 128)]


def test_mamba2_group_replication():
    # g = 1 < tp = 4: g' = 1 + (4 - 1) = 4
    l = layouts.mamba2(
        intermediate_size=4096, n_groups=1, num_heads=64, head_dim=64, state_size=128, conv_kernel=4, tp_size=4
    )
    assert l.states[0].shape == (3, (4096 + 2 * 4 * 128) // 4)


def test_other_families():
    assert shapes(
        layouts.mamba1(intermediate_size=4096, state_size=16, conv_kernel=4, tp_size=2, conv_layout="DS")
    ) == [(2048, 3), (2048, 16)]
    assert shapes(layouts.short_conv(intermediate_size=2048, conv_kernel=3, num_spec=1)) == [(3, 2048)]
    assert shapes(layouts.linear_attention(num_heads=64, head_dim=96, tp_size=8)) == [(8, 96, 96)]


@pytest.mark.parametrize(
    "call, phrase",
    [
        (lambda: layouts.preset("qwen3-next-80b-a3b", tp_size=3), "not divisible by tp_size = 3"),
        (lambda: layouts.linear_attention(num_heads=6, head_dim=64, tp_size=4), "num_heads = 6"),
        (
            lambda: layouts.mamba2(
                intermediate_size=4096, n_groups=6, num_heads=64, head_dim=64, state_size=128, conv_kernel=4, tp_size=4
            ),
            "n_groups = 6",
        ),
        (lambda: layouts.mamba1(intermediate_size=64, state_size=16, conv_kernel=4, num_spec=1), "Mamba1"),
        (lambda: layouts.short_conv(intermediate_size=64, conv_kernel=1), "short_conv: conv_kernel must be >= 2"),
        (lambda: layouts.short_conv(intermediate_size=63, conv_kernel=4, tp_size=2), "intermediate_size = 63"),
        (
            lambda: layouts.gdn(num_k_heads=4, num_v_heads=8, head_k_dim=64, head_v_dim=64, conv_kernel_size=1),
            "gdn: conv_kernel_size must be >= 2",
        ),
        (
            lambda: layouts.preset("nemotron-h-8b", logical_window=16, mamba_backend="cuda"),
            "unknown mamba_backend 'cuda'",
        ),
        (
            lambda: layouts.gdn(
                num_k_heads=4, num_v_heads=8, head_k_dim=64, head_v_dim=64, conv_kernel_size=4, conv_layout="XS"
            ),
            "unknown conv layout",
        ),
        (lambda: layouts.kda(num_heads=4, head_dim=64, conv_kernel_size=4, tp_size=0), "tp_size"),
    ],
)
def test_calculator_errors(call, phrase):
    with pytest.raises(LayoutError) as e:
        call()
    assert phrase in str(e.value)


def test_unknown_preset():
    with pytest.raises(LayoutError, match="unknown preset 'nope'"):
        layouts.preset("nope")


GRID = {
    "mamba2": [
        dict(intermediate_size=4096, n_groups=g, num_heads=64, head_dim=64, state_size=128, conv_kernel=4)
        for g in (1, 2, 3, 4, 6, 8)
    ],
    "kda": [
        dict(num_heads=h, head_dim=64, num_k_heads=k, head_k_dim=kd)
        for h in (8, 32)
        for k in (1, 2, 3, 8)
        for kd in (64, 96)
    ],
    "gdn": [
        dict(num_k_heads=k, num_v_heads=v, head_k_dim=64, head_v_dim=64, conv_kernel_size=4)
        for k in (1, 2, 3, 16)
        for v in (4, 6, 32)
    ],
    "mamba1": [dict(intermediate_size=i, state_size=16, conv_kernel=4) for i in (96, 4096)],
    "short_conv": [dict(intermediate_size=i, conv_kernel=3) for i in (96, 2048)],
    "linear_attention": [dict(num_heads=h, head_dim=64) for h in (6, 8)],
}


@pytest.mark.parametrize("family", sorted(GRID))
def test_every_layout_a_calculator_accepts_can_be_transferred(family):
    """What a calculator accepts, a transfer accepts on every rank (its fingerprint): the two
    apply one split of the groups and heads, so a layout is never refused only at transfer time."""
    from recoverssm_rs.transfer import LayoutFingerprint

    accepted = refused = 0
    for params in GRID[family]:
        for tp in (1, 2, 3, 4, 8):
            try:
                lay = layouts.FAMILIES[family](**params, tp_size=tp)
            except LayoutError as e:
                assert "tp_size" in str(e), (params, tp, str(e))
                refused += 1
                continue
            for rank in range(tp):
                LayoutFingerprint(lay, tp_rank=rank)
            accepted += 1
    assert accepted and refused, (accepted, refused)


@pytest.mark.parametrize(
    "family, params, tp, phrase",
    [
        ("mamba2", dict(GRID["mamba2"][2]), 4, "mamba2: n_groups = 3 cannot be split over tp_size = 4"),
        ("mamba2", dict(GRID["mamba2"][4]), 8, "mamba2: n_groups = 6 cannot be split over tp_size = 8"),
        (
            "kda",
            dict(num_heads=8, head_dim=64, num_k_heads=3),
            2,
            "kda: num_k_heads = 3 is not divisible by tp_size = 2",
        ),
        (
            "kda",
            dict(num_heads=8, head_dim=64, num_k_heads=2),
            4,
            "kda: num_k_heads = 2 is not divisible by tp_size = 4",
        ),
    ],
)
def test_a_split_no_rank_can_hold_is_refused_naming_the_parameter(family, params, tp, phrase):
    with pytest.raises(LayoutError) as e:
        layouts.FAMILIES[family](**params, tp_size=tp)
    assert phrase in str(e.value)


@pytest.mark.parametrize("name", sorted(layouts.PRESETS))
def test_an_unknown_preset_override_is_the_packages_error_naming_it(name):
    """``preset(name, tp=2)`` (a misspelt ``tp_size``) is a LayoutError naming the override and
    listing the calculator's parameters, as the docstring says, not Python's TypeError."""
    p = layouts.PRESETS[name]
    params = list(inspect.signature(layouts.FAMILIES[p.family]).parameters)
    with pytest.raises(LayoutError) as e:
        layouts.preset(name, tp=2)
    message = str(e.value)
    assert message.startswith(f"preset {name!r}: unknown override 'tp';")
    assert message.endswith(f"the {p.family} calculator takes: {', '.join(params)}")
    with pytest.raises(LayoutError, match="unknown overrides 'tp', 'spec'"):
        p.layout(tp=2, spec=1)
    # A known override still overrides.
    assert layouts.preset(name, tp_size=2) == p.layout(tp_size=2) != layouts.preset(name)
