"""Memory safety across the Python boundary: a plan or a launch writes only memory its bound tensors
still own. Each hostile case runs in its own process (a regression would write into freed memory
or hang, which must not take the test session down), forked from a process that has imported torch,
numpy and the package once (``support.isolated``), and asserts the package's own error, with no
byte changed anywhere it can see."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support import isolated

torch = pytest.importorskip("torch")

import recoverssm_rs as rs  # noqa: E402
from recoverssm_rs import layouts  # noqa: E402

PRELUDE = """
import gc, os, sys
import numpy as np, torch
import recoverssm_rs as rs
L = rs.Layout("X", [rs.StateSpec("t", (4, 16, 16), "float32", copy="temporal")])
def outcome(fn):
    try:
        fn()
    except rs.RecoverSSMError as e:
        print("ERR", type(e).__name__, str(e).splitlines()[0])
        return
    print("NOERR")
"""


def run(body: str, env: dict[str, str] | None = None, timeout: float = 120) -> list[str]:
    """The lines the case printed, run in a child forked from this worker's zygote (torch, numpy and
    the package already imported: see ``support.isolated``); with ``env``, in a fresh interpreter
    (glibc reads ``GLIBC_TUNABLES`` when a process starts)."""
    code = PRELUDE + textwrap.dedent(body)
    if env is not None:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()
    result = isolated.shared().run(code, timeout=timeout)
    assert result.returncode == 0 and not result.timed_out, result.describe()
    return result.stdout.strip().splitlines()


@pytest.mark.parametrize(
    "mutation",
    [
        "t.set_()",
        "t.resize_(64, 4, 16, 16)",
        "t.data = torch.zeros(16, 4, 16, 16)",
        "t.untyped_storage().resize_(0)",
    ],
)
def test_a_moved_or_freed_bound_tensor_is_refused(mutation):
    out = run(f"""
        t = torch.randn(16, 4, 16, 16)
        plan = rs.Planner(L, [[t]]).plan_copy(np.array([1, 2]), np.array([3, 4]))
        {mutation}
        victim = torch.arange((65536 - 256) // 4, dtype=torch.float32); ref = victim.clone()
        outcome(plan.execute)
        print("victim", int((victim != ref).sum()))
    """)
    assert out[0].startswith("ERR BindingError X: layer 0, state 0 ('t'):"), out
    assert "nothing was written" in out[0]
    assert out[1] == "victim 0"


def test_dropping_every_caller_reference_keeps_the_memory_alive():
    out = run("""
        t = torch.arange(16 * 4 * 16 * 16, dtype=torch.float32).reshape(16, 4, 16, 16)
        planner = rs.Planner(L, [[t]])
        plan = planner.plan_copy(np.array([1]), np.array([3]))
        try:
            planner.states.clear()
        except AttributeError:
            print("immutable")
        del t
        gc.collect()
        plan.execute()
        held = planner.states[0][0][0]
        print("copied", bool(torch.equal(held[3], held[1])))
    """)
    assert out == ["immutable", "copied True"]


def test_state_cache_buffers_are_guarded():
    out = run("""
        from recoverssm_rs import layouts
        lay = layouts.kda(num_heads=2, head_dim=8, num_spec=3, conv_kernel_size=4, recover_ssm=True)
        cache = rs.StateCache(lay, num_layers=2, num_blocks=16, max_requests=4)
        cache.buffers()["recurrent"].untyped_storage().resize_(0)
        conv = cache.buffers()["conv"].clone()
        outcome(lambda: cache.commit(np.array([1]), np.array([3])))
        outcome(lambda: cache.copy_blocks([3], [5]))
        print("conv unchanged", bool(torch.equal(conv, cache.buffers()["conv"])))
    """)
    assert out[0].startswith("ERR BindingError StateCache recurrent buffer: its storage was resized or freed"), out
    assert out[1].startswith("ERR BindingError"), out
    assert out[2] == "conv unchanged True"


def test_a_forked_child_executes_plans():
    # A wave of 2 MiB or more runs on the executor's thread pool; a child of fork() has none of
    # its threads and must not wait for them.
    out = run(
        """
        big = rs.Layout("X", [rs.StateSpec("t", (64, 64, 64), "float32", copy="temporal")])
        t = torch.randn(8, 64, 64, 64)  # 1 MiB per block: three blocks make a 3 MiB wave
        plan = rs.Planner(big, [[t]]).plan_copy(np.array([1, 2, 3]), np.array([4, 5, 6]))
        plan.execute()
        t[1:4].normal_()
        pid = os.fork()
        if pid == 0:
            plan.execute()
            os._exit(0 if torch.equal(t[4:7], t[1:4]) else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        import multiprocessing as mp
        def work(q):
            plan.execute()
            q.put(bool(torch.equal(t[4:7], t[1:4])))
        t[1:4].normal_()
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=work, args=(q,))
        p.start()
        print("mp", q.get(timeout=60))
        p.join(60)
        print("exit", p.exitcode)
    """,
        timeout=180,
    )
    assert out == ["child 0", "mp True", "exit 0"]


def test_tensors_autograd_tracks_are_refused_and_writes_bump_versions():
    lay = rs.Layout("X", [rs.StateSpec("t", (4, 8), "float32", copy="temporal")])
    leaf = torch.randn(8, 4, 8, requires_grad=True)
    with pytest.raises(rs.BindingError, match=r"layer 0, state 0 \('t'\): the tensor requires grad"):
        rs.Planner(lay, [[leaf]])
    # A state saved by autograd for another tensor's gradient: the plan's write must invalidate it
    # the way torch's own in-place write would.
    state = torch.randn(8, 4, 8)
    w = torch.randn(4, 8, requires_grad=True)
    y = (w * state[1]).sum()
    planner = rs.Planner(lay, [[state]])
    before = state._version
    planner.plan_copy(np.array([2]), np.array([1])).execute()
    assert state._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_read_only_and_non_dense_memory_is_refused(tmp_path):
    lay = rs.Layout("X", [rs.StateSpec("t", (4, 8), "float32", copy="temporal")])
    path = tmp_path / "states.bin"
    np.zeros((8, 4, 8), np.float32).tofile(path)
    ro = np.memmap(path, dtype=np.float32, mode="r", shape=(8, 4, 8))
    with pytest.raises(rs.BindingError, match="read-only"):
        rs.Planner(lay, [[ro]])
    with pytest.raises(rs.BindingError, match="torch.sparse_coo tensor cannot be used"):
        rs.Planner(lay, [[torch.zeros(8, 4, 8).to_sparse()]])


def test_state_cache_inputs_give_the_packages_errors():
    lay = layouts.kda(num_heads=2, head_dim=8, num_spec=3, conv_kernel_size=4, recover_ssm=True)
    with pytest.raises(rs.BindingError, match="num_blocks must be in 2 ..= 2\\*\\*31 - 1, got -3"):
        rs.StateCache(lay, num_layers=2, num_blocks=-3, max_requests=4)
    with pytest.raises(rs.BindingError, match="max_requests"):
        rs.StateCache(lay, num_layers=2, num_blocks=8, max_requests=0)
    cache = rs.StateCache(lay, num_layers=2, num_blocks=16, max_requests=4)
    for call in (lambda: cache.conv_state(2), lambda: cache.recurrent_state(-1), lambda: cache.workspace(9)):
        with pytest.raises(rs.PlanError, match="layer .* is out of range: there are 2"):
            call()
    with pytest.raises(rs.PlanError, match="block_size must be >= 1 \\(tokens per block\\), got -1"):
        cache.commit(
            np.array([1]), np.array([3]), seq_lens=np.array([3]), block_table=np.array([[4, 5]]), block_size=-1
        )
    conv = cache.conv_state(0)
    dim = conv.shape[2] if cache.conv_layout == "SD" else conv.shape[1]
    before = {k: v.clone() for k, v in cache.buffers().items()}
    with pytest.raises(rs.PlanError, match=r"x: expected shape \[B=1, Q=4, dim="):
        cache.conv_verify(0, np.array([3]), torch.zeros(1, 7, dim), torch.zeros(dim, 4))
    for k, v in cache.buffers().items():
        assert torch.equal(v, before[k]), k


def test_soak_bind_free_rebind_with_unmapped_frees():
    # Freed memory is returned to the OS at once (mmap for anything over 4 KiB), so a stray write
    # into a freed pool faults instead of passing silently.
    out = run(
        """
        gc.freeze()  # the imported modules' objects: each round's collection walks that round's only
        rng = np.random.default_rng(0)
        refused = 0
        for i in range(150):
            pools = [torch.randn(12, 4, 16, 16) for _ in range(2)]
            planner = rs.Planner(L, [[p] for p in pools])
            plan = planner.plan_copy(np.array([1, 2]), np.array([5, 6]))
            victim = int(rng.integers(0, 4))
            if victim == 0:
                pools[0].untyped_storage().resize_(0)
            elif victim == 1:
                pools[1].set_()
            try:
                plan.execute()
                assert victim >= 2 and all(torch.equal(p[5], p[1]) for p in pools)
            except rs.BindingError:
                refused += 1
                assert victim < 2
            del planner, plan, pools
            gc.collect()
        print("refused", refused)
    """,
        env={"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4096"},
        timeout=900,  # 150 rounds of allocate/bind/free, with room for a heavily loaded 2-core machine
    )
    refused = int(out[0].split()[1])
    assert 0 < refused < 150


def test_multi_group_plans_are_guarded_too():
    out = run("""
        from recoverssm_rs import Planner
        a, b = torch.randn(16, 4, 16, 16), torch.randn(16, 4, 16, 16)
        mg = Planner.from_groups([(L, [[a]]), (L, [[b]])], block_size=16)
        bt = np.array([[1, 2]])
        plan = mg.plan([bt, bt], np.array([0]), np.array([1]), np.array([1]), "post_process")
        b.set_()
        before = a.clone()
        outcome(plan.execute)
        print("group 0 unchanged", bool(torch.equal(a, before)))
    """)
    assert out[0].startswith("ERR BindingError group 1 (X): layer 0, state 0 ('t'):"), out
    assert out[1] == "group 0 unchanged True"


def test_tensors_over_pages_mapped_read_only_are_refused(tmp_path):
    # torch.from_numpy over a read-only memmap warns and still points at read-only pages: the first
    # copy into it would segfault. The process's memory map shows the pages read-only.
    path = tmp_path / "states.bin"
    np.zeros((8, 4, 16, 16), np.float32).tofile(path)
    out = run(f"""
        import warnings
        warnings.simplefilter("ignore")
        path = {str(path)!r}
        ro = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="r", shape=(8, 4, 16, 16)))
        outcome(lambda: rs.Planner(L, [[ro]]))
        outcome(lambda: rs.Planner(L, [[ro[2:]]]))
        rw = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="r+", shape=(8, 4, 16, 16)))
        rw[1] = 1.0
        rs.Planner(L, [[rw]]).plan_copy(np.array([1]), np.array([3])).execute()
        print("COPIED", float(rw[3].min()), float(rw[3].max()))
    """)
    assert out == [
        "ERR BindingError X: layer 0, state 0 ('t'): the tensor is read-only; state tensors must be writable",
        "ERR BindingError X: layer 0, state 0 ('t'): the tensor is read-only; state tensors must be writable",
        "COPIED 1.0 1.0",
    ]


def test_reset_blocks_of_a_freed_pool_is_refused():
    out = run("""
        from recoverssm_rs import layouts
        lay = layouts.kda(num_heads=2, head_dim=8, num_spec=3, conv_kernel_size=4, recover_ssm=True)
        cache = rs.StateCache(lay, num_layers=2, num_blocks=16, max_requests=4)
        cache.buffers()["conv"].fill_(1.0)
        cache.buffers()["recurrent"].untyped_storage().resize_(0)
        outcome(lambda: cache.reset_blocks([3, 5]))
        print("conv untouched", bool((cache.buffers()["conv"] == 1.0).all()))
    """)
    assert out[0].startswith("ERR BindingError StateCache recurrent buffer: its storage was resized or freed"), out
    assert out[1] == "conv untouched True"


def test_a_state_pool_over_read_only_pages_is_refused(tmp_path):
    # The transfer pool binds its tensors through the planner: pages the process maps read-only
    # are refused before a transfer could write into them.
    path = tmp_path / "pool.bin"
    np.zeros((8, 4, 16, 16), np.float32).tofile(path)
    out = run(f"""
        import warnings
        warnings.simplefilter("ignore")
        from recoverssm_rs import layouts
        from recoverssm_rs.transfer.pool import StatePool
        L = layouts.linear_attention(num_heads=4, head_dim=16)
        ro = torch.from_numpy(np.memmap({str(path)!r}, dtype=np.float32, mode="r", shape=(8, 4, 16, 16)))
        outcome(lambda: StatePool(L, [[ro]]))
        rw = torch.from_numpy(np.memmap({str(path)!r}, dtype=np.float32, mode="r+", shape=(8, 4, 16, 16)))
        print("pool blocks", StatePool(L, [[rw]]).num_blocks)
    """)
    assert out[0].startswith("ERR BindingError"), out
    assert "read-only" in out[0], out
    assert out[1] == "pool blocks 8", out
