"""The wrong kind of object at every public entry point: ``None``, a string, a dict, an
``object()``, a float, a ragged nested list, a 0-d array or a huge int in place of each argument
raises the package's own error (or is accepted where it is a valid value), never Python's
``TypeError`` / ``AttributeError`` / ``ValueError`` / ``KeyError``, and a refused step writes
nothing."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import recoverssm_rs as rs  # noqa: E402
from recoverssm_rs import layouts  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from recoverssm_rs.transfer import (  # noqa: E402
    HostCache,
    HostOffload,
    LayoutFingerprint,
    LocalTransfer,
    StatePool,
    check_sources,
    load_states,
    plan_transfer,
    save_states,
)
from recoverssm_rs.vllm import (  # noqa: E402
    PostProcessInputs,
    PreCopyInputs,
    VllmMambaStep,
    align_post_process,
    align_pre_copy,
    copy_kind,
    mamba_groups,
    plan,
)
from support.vllm_trace import GroupCfg, Side, Sim  # noqa: E402

HOSTILE: dict[str, Any] = {
    "None": None,
    "str": "abc",
    "dict": {"a": 1},
    "object": object(),
    "float": 1.5,
    "nested": [[1, [2]], [3]],
    "0-d array": np.array(3),
    "huge int": 2**70,
}
LAYOUT = rs.Layout(
    "X",
    [
        rs.StateSpec("c", (3, 4), "float32", copy="conv", conv_layout="SD"),
        rs.StateSpec("t", (4,), "float32", copy="temporal"),
    ],
    num_spec=2,
)
RECOVER = layouts.kda(num_heads=2, head_dim=4, conv_kernel_size=4, recover_ssm=True, num_spec=2)
TABLE = np.arange(1, 11, dtype=np.int64).reshape(2, 5)
V = np.array


def _states() -> list[list[Any]]:
    return [[torch.arange(16 * 12, dtype=torch.float32).reshape(16, 3, 4), torch.ones(16, 4)]]


#: The transfer tiers' layout (one GDN rank) and its pools' states.
TLAYOUT = layouts.gdn(num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, conv_kernel_size=4, tp_size=1)


def _pool_states() -> list[list[Any]]:
    g = torch.Generator().manual_seed(0)
    return [[torch.randn((6, *s.shape), generator=g).to(torch.bfloat16) for s in TLAYOUT.persistent] for _ in range(2)]


TPOOL = StatePool(TLAYOUT, _pool_states())
TFP = TPOOL.fingerprint
SAVED = HostOffload(TPOOL).offload([1])
SAVED_DIR = Path(tempfile.mkdtemp(prefix="hostile-"))
SAVED_FILE = SAVED_DIR / "saved.safetensors"
save_states(SAVED, SAVED_FILE)


def _in_saved_dir(path: Any) -> Any:
    """A string path is made relative to a scratch directory (a hostile string is a valid path)."""
    return SAVED_DIR / path if isinstance(path, str) else path


class _Target:
    """A fresh object per hostile call (a refused call must leave its states unchanged)."""

    def __init__(self) -> None:
        self.states = _states()
        self.planner = rs.Planner(LAYOUT, self.states, block_size=4)
        self.step = VllmMambaStep([(0, LAYOUT, _states())], block_size=4, num_spec_blocks=2, max_num_reqs=4)
        self.cache = rs.StateCache(RECOVER, num_layers=1, num_blocks=8, max_requests=2)
        self.src_states, self.dst_states = _pool_states(), _pool_states()
        self.src, self.dst = StatePool(TLAYOUT, self.src_states), StatePool(TLAYOUT, self.dst_states)
        self.host = HostCache(self.dst, 10**6)
        self.host.put("a", [1])
        self.sglang = _sglang_pool()

    def tensors(self) -> list[Any]:
        step = [t for layer in self.step.planner.states[0] for t in layer]
        pools = [t for states in (self.src_states, self.dst_states) for layer in states for t in layer]
        sglang = [
            *self.sglang.conv,
            self.sglang.temporal,
            self.sglang.intermediate_ssm,
            *self.sglang.intermediate_conv_window,
        ]
        return [t for layer in self.states for t in layer] + step + list(self.cache.buffers().values()) + pools + sglang


def _kv_config() -> Any:
    spec = SimpleNamespace(mamba_type="X", shapes=[(3, 4), (4,)], dtypes=["float32", "float32"])
    return SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["l0"], kv_cache_spec=spec)])


def _preprocess_args() -> dict[str, Any]:
    """One request ``a`` of a step's vLLM objects (read by attribute)."""
    return dict(
        scheduler_output=SimpleNamespace(
            scheduled_cached_reqs=SimpleNamespace(),
            finished_req_ids=set(),
            num_scheduled_tokens={"a": 4},
            scheduled_spec_decode_tokens={},
        ),
        input_batch=SimpleNamespace(
            req_ids=["a"], num_accepted_tokens_cpu=np.ones(4, np.int64), block_table=[SimpleNamespace(np=TABLE)]
        ),
        requests={"a": SimpleNamespace(num_computed_tokens=0)},
    )


def _runner() -> Side:
    """vLLM's runner-held objects for one GDN group (``support.vllm_trace``)."""
    sim = Sim([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", seed=0, num_blocks=16)
    return Side(sim, sim.make_states(), None)


RUNNER = _runner()
B, Q, DIM = 1, 3, RECOVER.states[0].shape[1]


# (entry, call(target, **kwargs), good kwargs)
ENTRIES: list[tuple[str, Callable[..., Any], dict[str, Any]]] = [
    (
        "StateSpec",
        lambda t, **k: rs.StateSpec(**k),
        dict(name="c", shape=(3, 4), dtype="float32", role="persistent", copy="conv", conv_layout="SD"),
    ),
    ("Layout", lambda t, **k: rs.Layout(**k), dict(backend="X", states=list(LAYOUT.states), num_spec=2)),
    ("Planner", lambda t, **k: rs.Planner(**k), dict(layout=LAYOUT, states=_states(), block_size=4)),
    ("Planner.from_groups", lambda t, **k: rs.Planner.from_groups(**k), dict(groups=[(LAYOUT, _states())])),
    (
        "Planner.plan_align",
        lambda t, **k: t.planner.plan_align(**k).execute(),
        dict(block_table=TABLE, src_col=V([0, 1]), dst_col=V([1, 2]), num_accepted=V([1, 2])),
    ),
    (
        "Planner.plan",
        lambda t, **k: t.planner.plan(**k).execute(),
        dict(block_tables=[TABLE], src_col=V([0, 1]), dst_col=V([1, 2]), num_accepted=V([1, 2])),
    ),
    ("Planner.plan_copy", lambda t, **k: t.planner.plan_copy(**k).execute(), dict(src_blocks=[1], dst_blocks=[2])),
    ("Layout.state", lambda t, **k: LAYOUT.state(**k), dict(name="c")),
    ("CopyPlan.tiles", lambda t, **k: t.planner.plan_copy([1], [2]).tiles(**k), dict(tile_bytes=4096)),
    ("validate_copy_funcs", lambda t, **k: rs.validate_copy_funcs(**k), dict(groups=[], copy_funcs={})),
    ("layouts.preset", lambda t, **k: layouts.preset(**k), dict(name="qwen3-next-80b-a3b")),
    (
        "layouts.mamba2",
        lambda t, **k: layouts.mamba2(**k),
        dict(intermediate_size=64, n_groups=1, num_heads=4, head_dim=16, state_size=8, conv_kernel=4, num_spec=1),
    ),
    (
        "layouts.gdn",
        lambda t, **k: layouts.gdn(**k),
        dict(num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, conv_kernel_size=4, tp_size=1),
    ),
    ("layouts.kda", lambda t, **k: layouts.kda(**k), dict(num_heads=2, head_dim=4, recover_ssm=True)),
    (
        "StateCache",
        lambda t, **k: rs.StateCache(**k),
        dict(layout=RECOVER, num_layers=1, num_blocks=8, max_requests=2, device="cpu"),
    ),
    (
        "StateCache.commit",
        lambda t, **k: t.cache.commit(**k),
        dict(num_accepted=V([1]), state_blocks=V([3]), query_lens=None),
    ),
    (
        "StateCache.conv_verify",
        lambda t, **k: t.cache.conv_verify(**k),
        dict(layer=0, state_blocks=[3], x=torch.zeros(B, Q, DIM), weight=torch.zeros(DIM, 4)),
    ),
    (
        "StateCache.verify",
        lambda t, **k: t.cache.verify(**k),
        dict(
            layer=0,
            state_blocks=[3],
            q_hat=torch.zeros(B, Q, 2, 4),
            k_hat=torch.zeros(B, Q, 2, 4),
            v=torch.zeros(B, Q, 2, 4),
            gate=torch.zeros(B, Q, 2, 4),
            beta=torch.zeros(B, Q, 2),
            query_lens=[3],
        ),
    ),
    ("StateCache.reset_blocks", lambda t, **k: t.cache.reset_blocks(**k), dict(blocks=[3])),
    ("StateCache.copy_blocks", lambda t, **k: t.cache.copy_blocks(**k), dict(src_blocks=[1], dst_blocks=[2])),
    ("StateCache.conv_state", lambda t, **k: t.cache.conv_state(**k), dict(layer=0)),
    (
        "VllmMambaStep",
        lambda t, **k: VllmMambaStep(**k),
        dict(groups=[(0, LAYOUT, _states())], block_size=4, num_spec_blocks=2, max_num_reqs=4, device_tables=False),
    ),
    (
        "VllmMambaStep.from_runner",
        lambda t, **k: VllmMambaStep.from_runner(**k),
        dict(
            kv_cache_config=RUNNER.kv_cache_config,
            forward_context=RUNNER.forward_context,
            copy_funcs=RUNNER.copy_funcs(None),
            max_num_reqs=4,
            conv_layout=None,
            device_tables=False,
        ),
    ),
    ("VllmMambaStep.release", lambda t, **k: t.step.release(**k), dict(req_ids=["a"])),
    (
        "VllmMambaStep.pre_copy",
        lambda t, **k: t.step.pre_copy(**k),
        dict(
            block_tables=[TABLE],
            slots=[0, 1],
            num_computed=V([0, 0]),
            num_scheduled=V([4, 4]),
            num_accepted=V([1, 1]),
            fresh=None,
            req_ids=None,
        ),
    ),
    (
        "VllmMambaStep.post_process",
        lambda t, **k: t.step.post_process(**k),
        dict(
            block_tables=[TABLE],
            state_col=V([0, 0]),
            num_computed=V([0, 0]),
            num_scheduled=V([4, 4]),
            num_draft=V([0, 0]),
            num_accepted=V([1, 1]),
            req_ids=None,
        ),
    ),
    ("VllmMambaStep.preprocess", lambda t, **k: t.step.preprocess(**k), _preprocess_args()),
    (
        "VllmMambaStep.postprocess",
        lambda t, **k: (t.step.preprocess(**_preprocess_args()), t.step.postprocess(**k)),
        dict(num_accepted=V([1])),
    ),
    ("mamba_groups", lambda t, **k: mamba_groups(**k), dict(kv_cache_config=_kv_config())),
    ("copy_kind", lambda t, **k: copy_kind(**k), dict(func="conv")),
    (
        "align_pre_copy",
        lambda t, block_size, num_spec_blocks, **k: align_pre_copy(
            PreCopyInputs(**k), block_size=block_size, num_spec_blocks=num_spec_blocks
        ),
        dict(
            tables=[TABLE],
            num_computed=V([0, 0]),
            num_scheduled=V([4, 4]),
            num_accepted=V([1, 1]),
            mamba_state_idx=V([-1, -1]),
            block_size=4,
            num_spec_blocks=2,
        ),
    ),
    (
        "align_post_process",
        lambda t, block_size, num_spec_blocks, **k: align_post_process(
            PostProcessInputs(**k), block_size=block_size, num_spec_blocks=num_spec_blocks
        ),
        dict(
            tables=[TABLE],
            state_col=V([0, 0]),
            num_computed=V([0, 0]),
            num_scheduled=V([4, 4]),
            num_draft=V([0, 0]),
            num_accepted=V([1, 1]),
            block_size=4,
            num_spec_blocks=2,
        ),
    ),
    # The transfer tiers.
    ("LayoutFingerprint", lambda t, **k: LayoutFingerprint(**k), dict(layout=TLAYOUT, tp_rank=0, block_size=16)),
    (
        "StatePool",
        lambda t, **k: StatePool(**k),
        dict(layout=TLAYOUT, states=_pool_states(), tp_rank=0, block_size=16),
    ),
    ("check_sources", lambda t, **k: check_sources(**k), dict(sources=[(0, TFP)])),
    (
        "plan_transfer",
        lambda t, **k: plan_transfer(**k),
        dict(
            source=TFP,
            source_pools=[TPOOL.geometry],
            destination=TFP,
            destination_pool=TPOOL.geometry,
            requests=[(1, 2)],
        ),
    ),
    ("LocalTransfer", lambda t, **k: LocalTransfer(**k), dict(sources=[TPOOL], destination=TPOOL)),
    ("LocalTransfer.run", lambda t, **k: LocalTransfer([t.src], t.dst).run(**k), dict(requests=[(1, 2)])),
    ("HostOffload", lambda t, **k: HostOffload(**k), dict(pool=TPOOL)),
    ("HostOffload.offload", lambda t, **k: HostOffload(t.src).offload(**k), dict(blocks=[1, 2])),
    ("HostOffload.offload_async", lambda t, **k: HostOffload(t.src).offload_async(**k), dict(blocks=[1, 2])),
    (
        "HostOffload.restore",
        lambda t, **k: HostOffload(t.dst).restore(**k),
        dict(states=SAVED, blocks=[3], handle=None),
    ),
    ("HostOffload.prefetch", lambda t, **k: HostOffload(t.dst).prefetch(**k), dict(states=SAVED, blocks=[3])),
    ("HostCache", lambda t, **k: HostCache(**k), dict(pool=TPOOL, capacity_bytes=10**6, disk_dir=None)),
    ("HostCache.put", lambda t, **k: t.host.put(**k), dict(key="b", blocks=[2])),
    ("HostCache.get", lambda t, **k: t.host.get(**k), dict(key="a")),
    ("HostCache.restore", lambda t, **k: t.host.restore(**k), dict(key="a", blocks=[3], handle=None)),
    ("HostCache.prefetch", lambda t, **k: t.host.prefetch(**k), dict(key="a", blocks=[3])),
    ("HostCache.drop", lambda t, **k: t.host.drop(**k), dict(key="a")),
    (
        "save_states",
        lambda t, path, **k: save_states(path=_in_saved_dir(path), **k),
        dict(states=SAVED, path="out.safetensors"),
    ),
    ("load_states", lambda t, **k: load_states(**k), dict(path=SAVED_FILE, layout=TLAYOUT)),
]


# ---- the SGLang pool adapter (recoverssm_rs.sglang) ---------------------------------------------
def _sglang_tensors() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return dict(
        conv=[torch.randn(2, 6, 4, 3, generator=g)],
        temporal=torch.randn(2, 6, 2, 3, 3, generator=g),
        intermediate_ssm=torch.randn(2, 4, 3, 2, 3, 3, generator=g),
        intermediate_conv_window=[torch.randn(2, 4, 3, 4, 3, generator=g)],
    )


def _sglang_pool() -> SglangMambaPool:
    return SglangMambaPool(**_sglang_tensors())


def _host_copy() -> Any:
    return _sglang_pool().get_cpu_copy([1, 2])


ENTRIES += [
    ("SglangMambaPool", lambda t, **k: SglangMambaPool(**k), dict(**_sglang_tensors(), conv_layout="DS")),
    ("SglangMambaPool.copy_from", lambda t, **k: t.sglang.copy_from(**k), dict(src_indices=[1, 2], dst_indices=[3, 4])),
    ("SglangMambaPool.fork", lambda t, **k: t.sglang.fork(**k), dict(src_indices=[1], dst_indices=[5])),
    ("SglangMambaPool.clear_slots", lambda t, **k: t.sglang.clear_slots(**k), dict(indices=torch.tensor([1, 3]))),
    ("SglangMambaPool.get_cpu_copy", lambda t, **k: t.sglang.get_cpu_copy(**k), dict(indices=V([2, 5]))),
    (
        "SglangMambaPool.load_cpu_copy",
        lambda t, **k: t.sglang.load_cpu_copy(**k),
        dict(mamba_cache_cpu=_host_copy(), indices=[4, 5]),
    ),
    (
        "SglangMambaPool.commit_after_verify",
        lambda t, **k: t.sglang.commit_after_verify(**k),
        dict(
            state_indices=torch.tensor([1, 2]),
            last_correct_step_indices=torch.tensor([0, 2]),
            track_indices=torch.tensor([3, -1]),
            steps_to_track=torch.tensor([1, -1]),
            src_indices=torch.tensor([1, 0]),
        ),
    ),
]
CASES = [(name, call, good, arg) for name, call, good in ENTRIES for arg in good]


def test_the_good_calls_pass():
    for _name, call, good in ENTRIES:
        call(_Target(), **good)


@pytest.mark.parametrize(("name", "call", "good", "arg"), CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_every_argument_refuses_the_wrong_kind(name, call, good, arg):
    foreign = _foreign_errors(name, arg, _Target, lambda target, kwargs: call(target, **kwargs), good)
    assert not foreign, f"{name} raised foreign errors:\n" + "\n".join(foreign)


def _foreign_errors(
    name: str, arg: str, make_target: Callable[[], Any], run: Callable[[Any, dict[str, Any]], Any], good: dict[str, Any]
) -> list[str]:
    """Runs ``run(target, good)`` with ``arg`` replaced by each hostile value on a fresh target: a
    refusal (the package's error) must leave every tensor of the target as it was; any other
    exception is returned as a foreign error."""
    foreign = []
    for label, value in HOSTILE.items():
        target = make_target()
        before = [t.clone() for t in target.tensors()]
        try:
            run(target, {**good, arg: value})
        except rs.RecoverSSMError:
            changed = [i for i, (a, b) in enumerate(zip(before, target.tensors())) if not torch.equal(a, b)]
            assert not changed, f"{name}({arg}={label}) was refused but wrote tensors {changed}"
        except Exception as e:  # noqa: BLE001 - the point of the test
            foreign.append(f"{arg}={label}: {type(e).__name__}: {e}")
    return foreign


@pytest.mark.parametrize("label", list(HOSTILE))
def test_a_step_that_is_not_a_half_steps_inputs_is_refused(label):
    planner = rs.Planner(LAYOUT, _states(), block_size=4)
    for call in (
        lambda s: align_pre_copy(s, block_size=4, num_spec_blocks=2),
        lambda s: align_post_process(s, block_size=4, num_spec_blocks=2),
        lambda s: plan(planner, s),
    ):
        with pytest.raises(rs.PlanError, match="^step: "):
            call(HOSTILE[label])


def test_wrong_kinds_are_named():
    with pytest.raises(rs.BindingError, match="layout must be a Layout, got str"):
        rs.Planner("X", _states())
    with pytest.raises(rs.BindingError, match=r"states\[0\] must be a list of tensors, got float"):
        rs.Planner(LAYOUT, [1.5])
    with pytest.raises(rs.LayoutError, match=r"X: states\[1\] must be a StateSpec, got dict"):
        rs.Layout("X", [LAYOUT.states[0], {}])
    with pytest.raises(rs.PlanError, match="input_batch.req_ids: TypeError"):
        VllmMambaStep([(0, LAYOUT, _states())], block_size=4, num_spec_blocks=2, max_num_reqs=4).preprocess(
            SimpleNamespace(
                scheduled_cached_reqs=None,
                finished_req_ids=(),
                num_scheduled_tokens={},
                scheduled_spec_decode_tokens={},
            ),
            SimpleNamespace(req_ids=None),
            {},
        )
    cache = rs.StateCache(RECOVER, num_layers=1, num_blocks=8, max_requests=2)
    with pytest.raises(rs.PlanError, match="state_blocks"):
        cache.commit(V([1]), None)


def test_the_step_needs_a_block_size():
    with pytest.raises(rs.PlanError, match="block_size is required"):
        VllmMambaStep([(0, LAYOUT, _states())], block_size=None, num_spec_blocks=2, max_num_reqs=4)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# vLLM's GPU-resident runner: ModelStateV2's entry points (states seen as CUDA tensors, launches
# through the host emulation of the kernel)
# ------------------------------------------------------------------------------------------------

I32 = torch.int32


class _V2Target:
    """A fresh one-group ``ModelStateV2`` per hostile call, slot 1 with 4 cached tokens, after one
    pre-copy (so a post-process is the step's own); its tensors: every bound state and the
    adapter's columns, counts and scratch."""

    def __init__(self) -> None:
        from support.vllm_trace import small_model_state

        self.ms, self.states = small_model_state(fake=True)
        self.table = torch.zeros(4, 6, dtype=I32)
        self.table[1, :4] = torch.tensor([1, 2, 3, 4], dtype=I32)
        self.ms.add_request(1, 4)
        self.ms.preprocess_state(
            torch.tensor([1], dtype=I32),
            torch.tensor([0, 4, 0, 0], dtype=I32),
            torch.tensor([0, 1], dtype=I32),
            [self.table],
        )

    def tensors(self) -> list[Any]:
        return [*self.states, self.ms._state, self.ms._acc, self.ms._scratch]


def _v2_runner_args() -> dict[str, Any]:
    from support.vllm_trace import small_model_state

    ms, _ = small_model_state(fake=True)
    return dict(planner=ms.planner, group_ids=[0], max_num_reqs=4, device="cpu")


def _v2_from_runner_args() -> dict[str, Any]:
    from support.vllm_trace import small_runner_objects

    cfg, ctx, funcs = small_runner_objects([torch.zeros(16, 5, 3), torch.zeros(16, 2, 2)])
    return dict(
        kv_cache_config=cfg, forward_context=ctx, copy_funcs=funcs, max_num_reqs=4, conv_layout=None, device="cpu"
    )


def _v2_entries() -> list[tuple[str, Callable[..., Any], dict[str, Any]]]:
    from recoverssm_rs.vllm.model_state import ModelStateV2

    def i32(*x: int) -> Any:
        return torch.tensor(x, dtype=I32)

    return [
        ("ModelStateV2", lambda t, **k: ModelStateV2(**k), _v2_runner_args()),
        ("ModelStateV2.from_runner", lambda t, **k: ModelStateV2.from_runner(**k), _v2_from_runner_args()),
        ("ModelStateV2.add_request", lambda t, **k: t.ms.add_request(**k), dict(slot=2, num_computed_tokens=8)),
        (
            "ModelStateV2.preprocess_state",
            lambda t, **k: t.ms.preprocess_state(**k),
            dict(
                idx_mapping=i32(1),
                num_computed_tokens=i32(0, 5, 0, 0),
                query_start_loc=i32(0, 3),
                block_tables=_OWN_TABLES,
            ),
        ),
        (
            "ModelStateV2.postprocess_state",
            lambda t, **k: t.ms.postprocess_state(**k),
            dict(idx_mapping=i32(1), num_sampled=i32(3), num_computed_tokens=i32(0, 7, 0, 0), block_tables=_OWN_TABLES),
        ),
    ]


#: Stands for the target's own block tables in the entries above.
_OWN_TABLES: Any = object()


@pytest.fixture
def _v2_device(monkeypatch):
    """The adapter's buffers on the host, seen as CUDA tensors by its launches; the launches run
    through the host emulation."""
    from recoverssm_rs.cuda.ops import CudaOps
    from support import device_fakes
    from support.device_fakes import FakeCuda

    device_fakes.install(monkeypatch)
    device_fakes.install(monkeypatch, ops=False, emulate=True)
    # a tensor is seen as a CUDA one; any other object reaches the package as given
    monkeypatch.setattr(
        CudaOps, "launch_arg", staticmethod(lambda t: FakeCuda(t) if isinstance(t, torch.Tensor) else t)
    )


def _v2_call(call: Callable[..., Any], target: _V2Target, kwargs: dict[str, Any]) -> Any:
    if kwargs.get("block_tables") is _OWN_TABLES:
        kwargs = {**kwargs, "block_tables": [target.table]}
    return call(target, **kwargs)


V2_NAMES = [
    "ModelStateV2",
    "ModelStateV2.from_runner",
    "ModelStateV2.add_request",
    "ModelStateV2.preprocess_state",
    "ModelStateV2.postprocess_state",
]


def test_the_good_v2_calls_pass(_v2_device):
    for name, call, good in _v2_entries():
        target = _V2Target()
        _v2_call(call, target, good)
        if "process_state" in name:
            assert target.ms.last_error().ok, name


@pytest.mark.parametrize("name", V2_NAMES)
def test_every_v2_argument_refuses_the_wrong_kind(_v2_device, name):
    entries = {n: (c, g) for n, c, g in _v2_entries()}
    call, good = entries[name]
    foreign = []
    for arg in good:
        foreign += _foreign_errors(name, arg, _V2Target, lambda target, kwargs: _v2_call(call, target, kwargs), good)
    assert not foreign, f"{name} raised foreign errors:\n" + "\n".join(foreign)


# ------------------------------------------------------------------------------------------------
# The NIXL tier (recoverssm_rs.transfer.nixl): NixlEndpoint's entry points. Skipped without NIXL,
# unless RECOVERSSM_REQUIRE_NIXL=1 (as CI sets it). Each target's endpoint runs no progress
# thread (a busy-polling thread per agent would take the cores from the rest of the run).
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _nixl_source():
    """One source rank for every NIXL target: an endpoint over its own pool, with NIXL's
    progress thread (UCX's connection set-up waits on the source's progress)."""
    from recoverssm_rs.transfer.nixl import NixlEndpoint
    from support.transfer_ref import nixl_or_skip

    nixl_or_skip()
    states = _pool_states()
    src = NixlEndpoint("hostile-source", StatePool(TLAYOUT, states))
    yield src, states
    del src


class _NixlTarget:
    """A fresh destination endpoint per hostile call (``connected``: to the module's source); its
    tensors: every state of the destination's pool and of the source's."""

    count = 0

    def __init__(self, source: Any, connected: bool) -> None:
        from recoverssm_rs.transfer.nixl import NixlEndpoint

        _NixlTarget.count += 1
        self.src, self.src_states = source
        self.states = _pool_states()
        self.dst = NixlEndpoint(
            f"hostile-dst-{_NixlTarget.count}", StatePool(TLAYOUT, self.states), progress_thread=False
        )
        if connected:
            self.dst.connect(self.src.info())

    def tensors(self) -> list[Any]:
        return [t for states in (self.states, self.src_states) for layer in states for t in layer]


#: Stand for the target's source handshake and its plan in the entries below.
_SOURCE_INFO: Any = object()
_OWN_PLAN: Any = object()


def _nixl_call(call: Callable[..., Any], target: _NixlTarget, kwargs: dict[str, Any]) -> Any:
    own = {_SOURCE_INFO: lambda: target.src.info(), _OWN_PLAN: lambda: target.dst.plan([(1, 2)])}
    kwargs = {k: own[v]() if any(v is o for o in own) else v for k, v in kwargs.items()}
    return call(target, **kwargs)


def _nixl_entries() -> list[tuple[str, bool, Callable[..., Any], dict[str, Any]]]:
    """(entry, whether the target is connected, call(target, **kwargs), good kwargs)."""
    from recoverssm_rs.transfer import nixl

    return [
        (
            "NixlEndpoint",
            False,
            lambda t, **k: nixl.NixlEndpoint(**k),
            dict(name="hostile-new", pool=TPOOL, backends=("UCX",), progress_thread=False, interfaces="lo"),
        ),
        ("net_devices", False, lambda t, **k: nixl.net_devices(**k), dict(interfaces=["lo"])),
        ("NixlEndpoint.connect", False, lambda t, **k: t.dst.connect(**k), dict(peer=_SOURCE_INFO)),
        ("NixlEndpoint.plan", True, lambda t, **k: t.dst.plan(**k), dict(requests=[(1, 2)])),
        (
            "NixlEndpoint.descriptors",
            True,
            lambda t, **k: t.dst.descriptors(**k),
            dict(plan=_OWN_PLAN, per_request=True),
        ),
        (
            "NixlEndpoint.pull",
            True,
            lambda t, **k: _pulled(t.dst.pull(**k)),
            dict(requests=[(1, 2), (3, 4)], timeout=30.0, per_request=True, restore_failed=True),
        ),
        ("NixlEndpoint.info", True, lambda t, **k: t.dst.info(**k), {}),
        ("NixlEndpoint.notifications", True, lambda t, **k: t.dst.notifications(**k), {}),
    ]


def _pulled(result: Any) -> Any:
    assert result.ok, result.failed  # an accepted pull moves every request
    return result


NIXL_NAMES = [
    "NixlEndpoint",
    "net_devices",
    "NixlEndpoint.connect",
    "NixlEndpoint.plan",
    "NixlEndpoint.descriptors",
    "NixlEndpoint.pull",
    "NixlEndpoint.info",
    "NixlEndpoint.notifications",
]


def test_the_good_nixl_calls_pass(_nixl_source):
    entries = _nixl_entries()
    assert [e[0] for e in entries] == NIXL_NAMES
    for name, connected, call, good in entries:
        target = _NixlTarget(_nixl_source, connected)
        before = [t.clone() for t in target.tensors()]
        _nixl_call(call, target, good)
        if name == "NixlEndpoint.pull":  # the pull wrote the destination's blocks 2 and 4
            assert any(not torch.equal(a, b) for a, b in zip(before, target.tensors())), name


@pytest.mark.parametrize("name", NIXL_NAMES)
def test_every_nixl_argument_refuses_the_wrong_kind(_nixl_source, name):
    entries = {n: (c, call, g) for n, c, call, g in _nixl_entries()}
    connected, call, good = entries[name]
    foreign = []
    for arg in good:
        foreign += _foreign_errors(
            name,
            arg,
            lambda: _NixlTarget(_nixl_source, connected),
            lambda target, kwargs: _nixl_call(call, target, kwargs),
            good,
        )
    assert not foreign, f"{name} raised foreign errors:\n" + "\n".join(foreign)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(timeout=float("nan")), r"timeout = NaN must be a number of seconds > 0"),
        (dict(timeout=0), r"timeout = 0 must be a number of seconds > 0"),
        (dict(timeout=-1.0), r"timeout = -1 must be"),
        (dict(timeout=True), r"timeout must be a number of seconds, got bool"),
        (dict(timeout=1e9), r"timeout = 1000000000 must be .* <= 604800 \(a week\)"),
        (dict(per_request="yes"), r"per_request must be a bool, got str"),
        (dict(restore_failed=1), r"restore_failed must be a bool, got int"),
    ],
)
def test_a_pull_with_a_bad_value_is_refused_before_anything_moves(_nixl_source, kwargs, match):
    target = _NixlTarget(_nixl_source, True)
    before = [t.clone() for t in target.tensors()]
    with pytest.raises(rs.PlanError, match=match):
        target.dst.pull([(1, 2)], **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(before, target.tensors()))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(name=""), r'name: agent name "" must be non-empty'),
        (dict(name="a\nb"), r"name: agent name .* control characters"),
        (dict(name=b"src"), r"name must be a string, got bytes"),
        (dict(backends=()), r"backends: give at least one NIXL backend"),
        (dict(backends=("UCX", "UCX")), r"backends\[1\] = \"UCX\" is named twice"),
        (dict(backends=("UCX", 3)), r"backends\[1\] must be a string, got int"),
        (dict(progress_thread=1), r"progress_thread must be a bool, got int"),
        (dict(interfaces=" , "), r"interfaces: give at least one interface"),
        (dict(interfaces=["lo", "all"]), r"'all' \(every interface\) cannot be listed with others"),
        (dict(interfaces=["lo,eth0"]), r"interfaces\[0\] = \"lo,eth0\" must be one interface"),
        (dict(interfaces=[1]), r"interfaces\[0\] must be a string, got int"),
    ],
)
def test_an_endpoint_with_a_bad_argument_is_refused_before_an_agent_exists(_nixl_source, monkeypatch, kwargs, match):
    from recoverssm_rs.transfer import nixl

    made = []
    monkeypatch.setattr(nixl, "import_nixl", lambda: made.append(1))  # reached only after the checks
    with pytest.raises(rs.BindingError, match=match):
        nixl.NixlEndpoint(**{"name": "hostile-bad", "pool": TPOOL, **kwargs})
    assert not made
