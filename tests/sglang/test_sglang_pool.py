"""recoverssm_rs.sglang on host tensors shaped like SGLang's ``MambaPool`` (no SGLang needed):
overlapping copies ordered as SGLang's gather-then-scatter reads them, refusals that write
nothing, the speculative commit's skipped rows and refusals, and ``install``."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool, install  # noqa: E402

LAYERS, SLOTS, ROWS, DRAFT = 2, 8, 4, 3


def _tensors(seed=0, conv_shape=(6, 3)):
    g = torch.Generator().manual_seed(seed)
    conv = [(torch.randn(LAYERS, SLOTS, *conv_shape, generator=g) * 3).bfloat16()]
    temporal = torch.randn(LAYERS, SLOTS, 2, 4, 4, generator=g)
    ssm = torch.randn(LAYERS, ROWS, DRAFT, 2, 4, 4, generator=g)
    window = [(torch.randn(LAYERS, ROWS, DRAFT, *conv_shape, generator=g) * 3).bfloat16()]
    return conv, temporal, ssm, window


def _pool(seed=0):
    conv, temporal, ssm, window = _tensors(seed)
    return SglangMambaPool(conv, temporal, intermediate_ssm=ssm, intermediate_conv_window=window)


def _snapshot(p):
    return [t.clone() for t in (*p.conv, p.temporal)]


def _unchanged(p, before):
    return all(torch.equal(a, b) for a, b in zip((*p.conv, p.temporal), before, strict=True))


def test_layout_is_one_view_per_layer():
    p = _pool()
    assert p.num_slots == SLOTS and p.num_layers == p.planner.num_layers == LAYERS and p.device == "cpu"
    (lay,) = p.layouts
    assert [(s.name, s.shape, s.dtype, s.copy) for s in lay.persistent] == [
        ("conv0", (6, 3), "bfloat16", "conv"),
        ("temporal", (2, 4, 4), "float32", "temporal"),
    ]
    assert "SglangMambaPool(slots=8, layers=2" in repr(p)


def test_overlapping_chain_reads_before_it_writes():
    p = _pool()
    want = _snapshot(p)
    src, dst = torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4])
    for t in want:
        t[:, dst] = t[:, src]  # SGLang's copy_from
    p.copy_from(src, dst)
    assert all(torch.equal(a, b) for a, b in zip((*p.conv, p.temporal), want, strict=True))


@pytest.mark.parametrize(
    ("src", "dst", "match"),
    [
        ([1, 2], [2, 1], "cycle"),
        ([1, 2], [3, 3], "same block|twice|both write"),
        ([1], [0], "dummy slot"),
        ([0], [1], "dummy slot"),
        ([1], [SLOTS], "outside"),
        ([1, 2], [3], "same length"),
    ],
)
def test_copy_refusals_write_nothing(src, dst, match):
    p = _pool()
    before = _snapshot(p)
    with pytest.raises(PlanError, match=match):
        p.copy_from(torch.tensor(src), torch.tensor(dst))
    assert _unchanged(p, before)


def test_clear_slots_zeroes_and_refuses_the_dummy_slot():
    p = _pool()
    p.clear_slots(torch.tensor([2, 5]))
    for t in (*p.conv, p.temporal):
        assert not t[:, [2, 5]].any() and t[:, 1].any()
    before = _snapshot(p)
    for bad in ([0], [SLOTS + 1]):
        with pytest.raises(PlanError):
            p.clear_slots(torch.tensor(bad))
        assert _unchanged(p, before)


def test_host_round_trip_and_mismatched_dtype_refused():
    p = _pool()
    conv_cpu, temporal_cpu = p.get_cpu_copy(torch.tensor([1, 3]))
    assert conv_cpu[0].shape == (LAYERS, 2, 6, 3) and temporal_cpu.shape == (LAYERS, 2, 2, 4, 4)
    p.load_cpu_copy((conv_cpu, temporal_cpu), torch.tensor([6, 7]))
    for t in (*p.conv, p.temporal):
        assert torch.equal(t[:, [6, 7]], t[:, [1, 3]])
    before = _snapshot(p)
    with pytest.raises(PlanError, match="temporal: the host copy is bfloat16"):
        p.load_cpu_copy((conv_cpu, temporal_cpu.bfloat16()), torch.tensor([4, 5]))
    with pytest.raises(PlanError, match=r"conv\[0\]"):
        p.load_cpu_copy(([conv_cpu[0][:, :1]], temporal_cpu), torch.tensor([4, 5]))
    assert _unchanged(p, before)
    p.load_cpu_copy((conv_cpu, temporal_cpu, None), torch.tensor([4, 5]))  # a historical 3-tuple
    assert torch.equal(p.temporal[:, [4, 5]], temporal_cpu)


def test_commit_takes_the_accepted_step_and_skips_padding():
    p = _pool()
    before = _snapshot(p)
    p.commit_after_verify(torch.tensor([3, -1, 5]), torch.tensor([2, 1, -1]), src_indices=torch.tensor([1, 0, 2]))
    assert torch.equal(p.temporal[:, 3], p.intermediate_ssm[:, 1, 2])
    assert torch.equal(p.conv[0][:, 3], p.intermediate_conv_window[0][:, 1, 2])
    for slot in (5, 1, 2, 4):
        assert torch.equal(p.temporal[:, slot], before[1][:, slot]), f"slot {slot} is untouched"


def test_commit_tracks_a_second_slot():
    p = _pool()
    p.commit_after_verify(torch.tensor([1, 2]), torch.tensor([0, 2]), torch.tensor([6, -1]), torch.tensor([1, 0]))
    assert torch.equal(p.temporal[:, 6], p.intermediate_ssm[:, 0, 1])
    assert torch.equal(p.temporal[:, 2], p.intermediate_ssm[:, 1, 2])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([1, 2], [DRAFT, 0]), r"last_correct_step_indices\[0\] = 3 is past the draft"),
        (([SLOTS, 2], [0, 0]), r"state_indices\[0\] = 8 is outside"),
        (([1, 1], [0, 0]), "two requests write one slot"),
        (([1, 2], [0]), "one length"),
        (([1], [0], [2], None), "commit_after_verify: track_indices given without steps_to_track"),
        (([1], [0], None, None, [ROWS]), r"src_indices\[0\] = 4: the scratch row is outside"),
    ],
)
def test_commit_refusals_write_nothing(args, match):
    p = _pool()
    before = _snapshot(p)
    tensors = [None if a is None else torch.tensor(a) for a in args]
    with pytest.raises(PlanError, match=match):
        p.commit_after_verify(*tensors)
    assert _unchanged(p, before)


def test_commit_needs_a_speculative_pool():
    conv, temporal, _, _ = _tensors()
    with pytest.raises(PlanError, match="not a speculative pool"):
        SglangMambaPool(conv, temporal).commit_after_verify(torch.tensor([1]), torch.tensor([0]))


def _fake_pool(**extra):
    conv, temporal, ssm, window = _tensors(conv_shape=(3, 6))
    cache = types.SimpleNamespace(conv=conv, temporal=temporal, intermediate_ssm=ssm, intermediate_conv_window=window)
    return types.SimpleNamespace(mamba_cache=cache, conv_slice_axis=1, **extra)


def test_install_routes_the_pool_and_reads_kimi_conv_layout():
    pool = _fake_pool()
    ops = install(pool)
    assert ops.conv_layout == "SD" and ops.layouts[0].persistent[0].conv_layout == "SD"
    assert pool.copy_from == ops.copy_from and pool.clear_slots == ops.clear_slots
    assert pool.get_cpu_copy == ops.get_cpu_copy and pool.load_cpu_copy == ops.load_cpu_copy


def test_install_leaves_pools_with_side_states_alone(caplog):
    pool = _fake_pool(_slot_siblings=[object()])
    install(pool)
    assert "copy_from" not in vars(pool)
    assert "slot siblings" in caplog.text


def test_the_adapter_never_imports_sglang():
    import subprocess
    import sys

    code = "import sys, recoverssm_rs.sglang; print(any(m == 'sglang' or m.startswith('sglang.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_pool_with_several_conv_tensors_is_not_a_transfer_pool():
    from recoverssm_rs import LayoutError, layouts

    conv = [torch.zeros(2, 5, 4, 3), torch.zeros(2, 5, 6, 3)]
    temporal = torch.zeros(2, 5, 2, 4, 4)
    pool = SglangMambaPool(conv, temporal)
    with pytest.raises(LayoutError, match="state_pool binds one conv tensor per layer; this pool has 2"):
        pool.state_pool(
            layouts.mamba2(intermediate_size=8, n_groups=1, num_heads=2, head_dim=4, state_size=4, conv_kernel=4)
        )
