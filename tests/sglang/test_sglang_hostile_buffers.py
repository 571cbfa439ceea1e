"""The SGLang pool's core calls under hostile buffers: every tensor a caller hands in or a callback
returns that the core (or a kernel it launches) writes or reads through its address -- HiCache's
buffer (``alloc``), a load's host copies, the error word, the slot kernel's records and the copy's
constants (``upload``) -- is checked before use: on the pool's device, of the dtype and size the
call needs, apart from the pool's tensors, and held by its storage (not freed or shrunk by
``untyped_storage().resize_()``). A refusal is a ``PlanError`` (``BindingError`` for an upload
changed since it was checked) naming the operation and the object, with nothing run, staged or
written. The pool's own tensors are read once from the arguments (what is described is what is
guarded). Writes through a bad host buffer were heap corruption, so those cases run apart (forked
from the zygote of ``support.isolated``)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import _core  # noqa: E402
from recoverssm_rs.errors import BindingError, PlanError  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from support import isolated  # noqa: E402
from support.device_fakes import FakeCuda  # noqa: E402

LAYERS, SLOTS = 2, 8
TESTS = str(Path(__file__).resolve().parents[1])


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(LAYERS, SLOTS, 6, 3, generator=g)], torch.randn(LAYERS, SLOTS, 2, 4, 4, generator=g)


def _device_pool(seed=0):
    conv, temporal = _tensors(seed)
    return SglangMambaPool([FakeCuda(conv[0])], FakeCuda(temporal)), [*conv, temporal]


def _host_copies(states, ids):
    *conv, temporal = states
    return [c[:, ids].clone() for c in conv], temporal[:, ids].clone()


def never(*_):
    pytest.fail("a refused call ran, staged or launched something")


def _freed(t):
    t.untyped_storage().resize_(0)
    return t


def _shrunk(t):
    t.untyped_storage().resize_(8)
    return t


def _on_device(raw):
    """``raw`` as a (fake) device tensor whose storage can be resized."""
    return FakeCuda(torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone())


def _unchanged(before, states):
    return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, states, strict=True))


# ---- HiCache's buffer on the host: written by the core itself -------------------------------------


@pytest.mark.parametrize("how", ["freed", "shrunk"])
def test_a_host_buffer_whose_storage_was_freed_or_shrunk_is_refused_not_written(how):
    """``alloc`` returning a tensor whose storage no longer holds its bytes passed the dtype, shape
    and stride checks, and the core wrote the whole buffer there: a null write (freed) or a heap
    overrun (shrunk). Now a ``PlanError`` naming ``get_cpu_copy``, the alloc and the storage."""
    code = textwrap.dedent(
        f"""
        import torch
        from recoverssm_rs.errors import PlanError
        from recoverssm_rs.sglang import SglangMambaPool
        p = SglangMambaPool([torch.randn(2, 8, 6, 3)], torch.randn(2, 8, 2, 4, 4))
        before = [p.conv[0].clone(), p.temporal.clone()]
        def alloc(n):
            t = torch.empty(n, dtype=torch.int32)
            t.untyped_storage().resize_({0 if how == "freed" else 8})
            return t
        try:
            p.tensors.host_copy("get_cpu_copy", [1, 2], alloc=alloc)
            print("accepted")
        except PlanError as e:
            print("refused:", e)
        print("unchanged:", torch.equal(before[0], p.conv[0]) and torch.equal(before[1], p.temporal))
        """
    )
    run = isolated.shared().run(code, timeout=120)
    assert run.returncode == 0 and not run.timed_out, run.describe(2000)
    assert re.search(r"refused: get_cpu_copy: alloc\(\d+\) returned: its storage (holds|was freed)", run.stdout), (
        run.stdout
    )
    assert "unchanged: True" in run.stdout, run.stdout


def test_a_host_buffer_of_the_pool_s_own_memory_is_refused():
    """``alloc`` returning a view of a pool tensor made the gather write the pool's own memory
    (its slots overwritten by the copy, read and written at once)."""
    conv, temporal = _tensors(1)
    p = SglangMambaPool(conv, temporal)
    before = [conv[0].clone(), temporal.clone()]
    with pytest.raises(PlanError, match=r"^get_cpu_copy: alloc\(\d+\) returned memory of the pool's temporal"):
        p.tensors.host_copy("get_cpu_copy", [1, 2], alloc=lambda n: temporal.view(-1).view(torch.int32)[:n])
    assert _unchanged(before, [*conv, temporal])


# ---- HiCache's buffer on CUDA: written by the staged copy and the slot kernel ---------------------


BAD_BUFFERS = {
    "host tensor": (lambda n, s: torch.empty(n, dtype=torch.int32), r"int32 \[\d+\] .*on cpu"),
    "other device": (lambda n, s: FakeCuda(torch.empty(n, dtype=torch.int32), 1), r"on cuda:1"),
    "int64": (lambda n, s: FakeCuda(torch.empty(n, dtype=torch.int64)), r"int64 \[\d+\]"),
    "short": (lambda n, s: FakeCuda(torch.empty(n - 1, dtype=torch.int32)), r"int32 \[\d+\]"),
    "strided": (lambda n, s: FakeCuda(torch.empty(2 * n, dtype=torch.int32)[::2]), r"byte strides \[8\]"),
    "freed": (lambda n, s: FakeCuda(_freed(torch.empty(n, dtype=torch.int32))), r"storage was freed"),
    "shrunk": (lambda n, s: FakeCuda(_shrunk(torch.empty(n, dtype=torch.int32))), r"storage holds 8 bytes"),
    "pool memory": (lambda n, s: FakeCuda(s[-1].view(-1).view(torch.int32)[:n]), r"memory of the pool's temporal"),
    "not a tensor": (lambda n, s: None, r"expected a CUDA tensor"),
}


@pytest.mark.parametrize("op", ["get_cpu_copy", "load_cpu_copy"])
@pytest.mark.parametrize("case", BAD_BUFFERS, ids=list(BAD_BUFFERS))
def test_a_bad_cuda_buffer_is_refused_before_anything_is_staged_or_launched(fake_ops, recorder, op, case):
    """On CUDA the buffer ``alloc`` returned was not checked at all: its address went to the staged
    copy and the kernel, which write every byte of the call there."""
    dev, states = _device_pool(2)
    before = [t.clone() for t in states]
    make, what = BAD_BUFFERS[case]
    asked = []

    def alloc(n):
        asked.append(n)
        return make(n, states)

    copies = _host_copies(states, [1, 2]) if op == "load_cpu_copy" else None
    ids = [3, 4] if copies else [1, 2]
    with pytest.raises(PlanError, match=rf"^{op}: alloc\(\d+\) returned.*{what}"):
        dev.tensors.host_copy(op, ids, alloc=alloc, run=never, err=dev.slot_error.alloc(), mamba_cache_cpu=copies)
    assert len(asked) == 1 and not recorder.calls and fake_ops.staged == 0
    assert _unchanged(before, states)


@pytest.mark.parametrize("case", ["other device", "freed"])
def test_a_bad_error_word_is_refused_by_host_copy_and_slot_launch(fake_ops, recorder, case):
    """The slot kernel writes its error word: one on another device than the pool, or whose storage
    was freed, was handed to the launch."""
    dev, states = _device_pool(3)
    before = [t.clone() for t in states]
    word = torch.zeros(3, dtype=torch.int32)
    err = FakeCuda(word, 1) if case == "other device" else FakeCuda(_freed(word))
    what = r"err is on cuda:1, the pool on cuda:0" if case == "other device" else r"err: .*storage was freed"
    with pytest.raises(PlanError, match=rf"^get_cpu_copy: {what}"):
        dev.tensors.host_copy(
            "get_cpu_copy", [1, 2], alloc=lambda n: FakeCuda(torch.zeros(n, dtype=torch.int32)), run=never, err=err
        )
    slots = FakeCuda(torch.tensor([1, 2]))
    with pytest.raises(PlanError, match=rf"^clear_slots: {what}"):
        dev.tensors.slot_launch(never, False, dev.upload, slots=slots, err=err)
    assert not recorder.calls and _unchanged(before, states)


# ---- A load's host copies: read by the core ------------------------------------------------------


@pytest.mark.parametrize("device", ["host", "cuda"])
@pytest.mark.parametrize("how", ["freed", "shrunk"])
def test_a_host_copy_whose_storage_was_freed_or_shrunk_is_refused_not_read(device, how):
    """A load read each host copy through its address whatever its storage held: a shrunk one was
    read past its end (heap memory loaded into the pool), a freed one was refused as a byte-count
    mismatch. Now a ``PlanError`` naming the state and its storage; nothing read or written."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {TESTS!r})
        import torch
        from recoverssm_rs.errors import PlanError
        from recoverssm_rs.sglang import SglangMambaPool
        from recoverssm_rs.cuda import module, ops
        from support.device_fakes import FakeCuda, FakeOps
        ops.cuda_ops = FakeOps()
        ran = []
        module.launch = lambda *a: ran.append(a)
        conv, temporal = torch.randn(2, 8, 6, 3), torch.randn(2, 8, 2, 4, 4)
        wrap = FakeCuda if {device == "cuda"!r} else (lambda t: t)
        p = SglangMambaPool([wrap(conv)], wrap(temporal))
        before = [conv.clone(), temporal.clone()]
        host = ([conv[:, [1, 2]].clone()], temporal[:, [1, 2]].clone())
        host[1].untyped_storage().resize_({0 if how == "freed" else 8})
        try:
            p.load_cpu_copy(host, [3, 4])
            print("accepted")
        except PlanError as e:
            print("refused:", e)
        print("unchanged:", torch.equal(before[0], conv) and torch.equal(before[1], temporal) and not ran)
        """
    )
    run = isolated.shared().run(code, timeout=120)
    assert run.returncode == 0 and not run.timed_out, run.describe(2000)
    what = "was freed" if how == "freed" else "holds 8 bytes"
    assert f"refused: load_cpu_copy: temporal (host copy): its storage {what}" in run.stdout, run.stdout
    assert "unchanged: True" in run.stdout, run.stdout


# ---- What upload returned: read by every later launch --------------------------------------------


BAD_UPLOADS = {
    "host tensor": lambda raw: torch.frombuffer(bytearray(raw), dtype=torch.uint8),
    "short": lambda raw: FakeCuda(torch.frombuffer(bytearray(raw[:-8]), dtype=torch.uint8)),
    "int32": lambda raw: FakeCuda(torch.frombuffer(bytearray(raw), dtype=torch.int32)),
    "freed": lambda raw: FakeCuda(_freed(_on_device(raw).t)),
}


@pytest.mark.parametrize("case", BAD_UPLOADS, ids=list(BAD_UPLOADS))
def test_slot_records_uploaded_wrong_are_refused(fake_ops, recorder, case):
    """The slot kernel reads ``num_meta`` records from the address of what ``upload`` returned
    (and writes where they point): that was never checked, so a short, host or freed buffer gave
    the kernel records read past its end."""
    dev, states = _device_pool(4)
    before = [t.clone() for t in states]
    slots = FakeCuda(torch.tensor([1, 2]))
    with pytest.raises(PlanError, match=r"^clear_slots: upload returned"):
        dev.tensors.slot_launch(never, False, BAD_UPLOADS[case], slots=slots, err=dev.slot_error.alloc())
    assert not recorder.calls and _unchanged(before, states)


def test_slot_records_freed_after_the_upload_are_refused_at_the_next_launch(fake_ops, recorder):
    """The records are uploaded once and read by every later launch: a buffer whose storage was
    freed since (the caller kept it) is refused by name before the launch."""
    dev, states = _device_pool(5)
    kept = []

    def upload(raw):
        kept.append(_on_device(raw))
        return kept[-1]

    launched = []
    slots = FakeCuda(torch.tensor([1, 2]))
    dev.tensors.slot_launch(launched.append, False, upload, slots=slots, err=dev.slot_error.alloc())
    assert len(launched) == 1 and launched[0] is not None
    kept[0].t.untyped_storage().resize_(0)
    with pytest.raises(BindingError, match=r"^clear_slots: the slot records upload returned: its storage was freed"):
        dev.tensors.slot_launch(never, False, upload, slots=slots, err=dev.slot_error.alloc())
    assert len(launched) == 1


def test_copy_constants_freed_after_the_upload_are_refused_at_the_next_launch(fake_ops, recorder, strided_fakes):
    """``copy_from``'s constants (slot ids and ones, read as the launch's block table) are
    uploaded once: freed since, they are refused by name before the launch."""
    dev, states = _device_pool(6)
    kept, launched = [], []

    def upload(raw):
        kept.append(_on_device(raw))
        return kept[-1]

    def runner(name):
        dev.planner.launch_runner(name)  # the planner's device path, made on first use
        return lambda kl, n: launched.append(n)

    ids = FakeCuda(torch.tensor([1], dtype=torch.int32)), FakeCuda(torch.tensor([2], dtype=torch.int32))
    dev.tensors.copy_launch(dev.planner.core, runner, upload, *ids)
    assert launched == [1]
    kept[0].t.untyped_storage().resize_(0)
    with pytest.raises(BindingError, match=r"^copy_from: the constants upload returned: its storage was freed"):
        dev.tensors.copy_launch(dev.planner.core, runner, upload, *ids)
    assert launched == [1]
    other, _ = _device_pool(7)
    with pytest.raises(PlanError, match=r"^copy_from: upload returned: its storage was freed"):
        other.tensors.copy_launch(
            other.planner.core,
            lambda name: (other.planner.launch_runner(name), never)[1],
            lambda raw: FakeCuda(_freed(_on_device(raw).t)),
            *ids,
        )


def test_records_or_an_error_word_in_the_pool_s_memory_are_refused(fake_ops, recorder):
    """Records uploaded into a pool tensor's memory would be rewritten by the pool's own writes
    (the next launch then writing where they point), and an error word there written over a
    state: both are refused by the pool tensor's name."""
    dev, states = _device_pool(12)
    before = [t.clone() for t in states]
    slots = FakeCuda(torch.tensor([1, 2]))

    def into_the_pool(raw):
        flat = states[-1].view(-1).view(torch.uint8)[: len(raw)]
        flat.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        return FakeCuda(flat)

    with pytest.raises(PlanError, match=r"^clear_slots: upload returned memory of the pool's temporal"):
        dev.tensors.slot_launch(never, False, into_the_pool, slots=slots, err=dev.slot_error.alloc())
    word = FakeCuda(states[0].view(-1).view(torch.int32)[:3])
    with pytest.raises(PlanError, match=r"^clear_slots: err is memory of the pool's conv\[0\]"):
        dev.tensors.slot_launch(never, False, dev.upload, slots=slots, err=word)
    with pytest.raises(PlanError, match=r"^get_cpu_copy: err is memory of the pool's conv\[0\]"):
        dev.tensors.host_copy(
            "get_cpu_copy", [1, 2], alloc=lambda n: FakeCuda(torch.zeros(n, dtype=torch.int32)), run=never, err=word
        )
    assert not recorder.calls
    assert _unchanged(before[:1], states[:1]), "the conv tensor, which the refused calls left alone"


# ---- The kernels' index vectors: read on the device -----------------------------------------------


def _spec_device_pool(seed=0):
    """``_device_pool``'s pool with verify scratch (4 rows, a draft of 3)."""
    conv, temporal = _tensors(seed)
    g = torch.Generator().manual_seed(seed + 100)
    ssm, window = torch.randn(LAYERS, 4, 3, 2, 4, 4, generator=g), torch.randn(LAYERS, 4, 3, 6, 3, generator=g)
    pool = SglangMambaPool(
        [FakeCuda(conv[0])],
        FakeCuda(temporal),
        intermediate_ssm=FakeCuda(ssm),
        intermediate_conv_window=[FakeCuda(window)],
    )
    return pool, [*conv, temporal]


def _freed_ids(values, dtype=torch.int64):
    return FakeCuda(_freed(torch.tensor(values, dtype=dtype)))


SLOT_VECTORS = {
    "clear indices": (False, dict(slots=_freed_ids), "clear_slots: indices"),
    "commit state_indices": (True, dict(slots=_freed_ids), "commit_after_verify: state_indices"),
    "commit steps": (True, dict(steps=_freed_ids), "commit_after_verify: last_correct_step_indices"),
    "commit rows": (True, dict(rows=_freed_ids), "commit_after_verify: src_indices"),
    "commit track slots": (True, dict(track_slots=_freed_ids), "commit_after_verify: track_indices"),
    "commit track steps": (True, dict(track_steps=_freed_ids), "commit_after_verify: steps_to_track"),
}


@pytest.mark.parametrize("case", SLOT_VECTORS, ids=list(SLOT_VECTORS))
def test_a_freed_index_vector_is_refused_before_the_slot_kernel_reads_it(fake_ops, recorder, case):
    """The slot kernel reads its index vectors at their addresses: one whose storage was freed
    (a null address on a GPU: an illegal access that ends the process's CUDA context) was
    launched."""
    commit, freed, what = SLOT_VECTORS[case]
    dev, states = _spec_device_pool(10)
    before = [t.clone() for t in states]
    vectors = dict(slots=[1, 2], steps=[0, 1], rows=[0, 1], track_slots=[3, 4], track_steps=[0, 0])
    if not commit:
        vectors = dict(slots=[1, 2])
    given = {k: freed[k](v) if k in freed else FakeCuda(torch.tensor(v)) for k, v in vectors.items()}
    with pytest.raises(PlanError, match=rf"^{what}: its storage was freed"):
        dev.tensors.slot_launch(never, commit, dev.upload, **given, err=dev.slot_error.alloc())
    assert not recorder.calls and _unchanged(before, states)


@pytest.mark.parametrize("arg", ["src_indices", "dst_indices"])
def test_a_freed_copy_vector_is_refused_before_the_copy_kernel_reads_it(fake_ops, recorder, strided_fakes, arg):
    """``copy_from`` on CUDA: the copy kernel reads the slot ids at their addresses."""
    dev, states = _device_pool(11)
    launched = []

    def runner(name):
        dev.planner.launch_runner(name)
        return lambda kl, n: launched.append(n)

    ids = {"src_indices": [1], "dst_indices": [2]}
    given = [
        _freed_ids(v, torch.int32) if k == arg else FakeCuda(torch.tensor(v, dtype=torch.int32)) for k, v in ids.items()
    ]
    with pytest.raises(PlanError, match=rf"^copy_from: {arg}: its storage was freed"):
        dev.tensors.copy_launch(dev.planner.core, runner, dev.upload, *given)
    assert not launched


# ---- The constructor: each argument read once ----------------------------------------------------


def test_the_pool_s_tensors_are_read_once_from_an_iterator():
    """``conv`` was iterated twice (described, then guarded): a generator left the guard without
    the conv tensors and their objects missing (a Rust panic in ``layer_groups``)."""
    conv, temporal = _tensors(8)
    p = _core.SglangPool(conv=(c for c in conv), temporal=temporal)
    assert p.state_tensors()[0] is conv[0]
    assert len(p.layer_groups()[0][1]) == LAYERS
    conv[0].set_(torch.zeros_like(conv[0]))
    with pytest.raises(BindingError, match=r"^conv\[0\]"):
        p.check()


def test_the_pool_guards_the_tensors_it_describes():
    """A sequence that yields other tensors when iterated again had its first tensors described
    (and written) and the second guarded: a re-pointed conv tensor then passed the guard."""
    conv, temporal = _tensors(9)

    class Flaky(list):
        calls = 0

        def __iter__(self):
            Flaky.calls += 1
            return iter(conv if Flaky.calls == 1 else [torch.randn(LAYERS, SLOTS, 6, 3)])

    p = _core.SglangPool(conv=Flaky(), temporal=temporal)
    assert p.state_tensors()[0] is conv[0]
    conv[0].set_(torch.zeros_like(conv[0]))
    with pytest.raises(BindingError, match=r"^conv\[0\]"):
        p.clear_slots([1])


# ---- The shell's core calls: arguments of the wrong kind ------------------------------------------


def _host_pool():
    conv, temporal = _tensors(13)
    return SglangMambaPool(conv, temporal)


WRONG_KINDS = {
    "sglang_ids num_slots -1": (
        lambda p: _core.sglang_ids("clear_slots", "indices", [1], -1),
        r"^sglang_ids: num_slots = -1 must be >= 0",
    ),
    "sglang_ids num_slots True": (
        lambda p: _core.sglang_ids("clear_slots", "indices", [1], True),
        r"^sglang_ids: num_slots must be a host integer .*got bool True",
    ),
    "sglang_ids num_slots float": (
        lambda p: _core.sglang_ids("clear_slots", "indices", [1], 8.0),
        r"^sglang_ids: num_slots must be a host integer .*got float 8.0",
    ),
    "sglang_ids unique 1": (
        lambda p: _core.sglang_ids("clear_slots", "indices", [1], 8, 1),
        r"^sglang_ids: unique must be a bool, got int",
    ),
    "sglang_ids op None": (lambda p: _core.sglang_ids(None, "indices", [1]), r"^sglang_ids: op must be a string"),
    "sglang_ids arg 3": (lambda p: _core.sglang_ids("clear_slots", 3, [1]), r"^sglang_ids: arg must be a string"),
    "slot_launch commit 1": (
        lambda p: p.tensors.slot_launch(
            never, 1, never, slots=torch.tensor([1]), err=torch.zeros(3, dtype=torch.int32)
        ),
        r"^slot_launch: commit must be a bool, got int",
    ),
    "host_copy op None": (lambda p: p.tensors.host_copy(None, [1], alloc=never), r"^host_copy: op must be a string"),
}


@pytest.mark.parametrize("case", WRONG_KINDS, ids=list(WRONG_KINDS))
def test_the_shell_s_core_calls_refuse_arguments_of_the_wrong_kind(case):
    """Arguments PyO3 converted escaped as ``TypeError`` / ``OverflowError`` naming nothing, and
    ``num_slots=True`` was read as a pool of one slot: each is now the package's error naming
    the call and the argument."""
    call, match = WRONG_KINDS[case]
    p = _host_pool()
    before = [t.clone() for t in (*p.conv, p.temporal)]
    with pytest.raises(PlanError, match=match):
        call(p)
    assert _unchanged(before, [*p.conv, p.temporal])


def test_state_tensors_of_different_slot_counts_are_refused():
    """Two conv tensors form two groups, which the planner let differ in their block counts: a
    pool whose second conv tensor had fewer slots than the first was accepted, with the slots of
    the larger one, and the slot kernel (``clear_slots``, the commit, HiCache's copies on CUDA)
    then moved the smaller tensor's slots past its end."""
    g = torch.Generator().manual_seed(14)
    conv = [torch.randn(LAYERS, SLOTS, 6, 3, generator=g), torch.randn(LAYERS, SLOTS - 2, 4, 3, generator=g)]
    temporal = torch.randn(LAYERS, SLOTS, 2, 4, 4, generator=g)
    with pytest.raises(
        BindingError, match=rf"^SglangMambaPool: conv\[1\] has {SLOTS - 2} slots, conv\[0\] has {SLOTS}"
    ):
        SglangMambaPool(conv, temporal)
    with pytest.raises(BindingError, match=rf"^SglangMambaPool: temporal has {SLOTS + 1} slots, conv\[0\] has {SLOTS}"):
        SglangMambaPool(conv[:1], torch.randn(LAYERS, SLOTS + 1, 2, 4, 4))
    empty = torch.empty(LAYERS, SLOTS - 2, 0, 3)  # an empty tensor holds no slot: any count
    assert SglangMambaPool([conv[0], empty], temporal).num_slots == SLOTS


def test_the_transfer_binds_the_conv_tensor_that_holds_bytes_as_bound():
    """``state_pool`` bound ``conv[0]`` whatever it held: after an empty first conv tensor (a
    pool whose only conv state is the second) the binding was refused for the empty one's shape
    (a ``BindingError`` from the layout check, naming ``conv0``'s shape ``[0, 3]``);
    and a pool tensor re-pointed since the pool was built was bound at its new memory, which the
    pool's own operations refuse. The transfer now binds the conv tensor that holds bytes, and a
    moved tensor is a ``BindingError`` naming it."""
    conv, temporal = _tensors(15)
    p = SglangMambaPool([torch.empty(LAYERS, SLOTS, 0, 3), conv[0]], temporal)
    layers = p.tensors.transfer_layers()
    assert [[t.data_ptr() for t in row] for row in layers] == [
        [conv[0][i].data_ptr(), temporal[i].data_ptr()] for i in range(LAYERS)
    ]
    temporal.set_(torch.zeros_like(temporal))
    with pytest.raises(BindingError, match=r"^temporal: the tensor no longer points"):
        p.tensors.transfer_layers()


def test_a_pool_tensor_whose_storage_is_gone_is_named_by_its_index():
    """SGLang's ``conv`` is a list of conv states, not of layers: a freed one is named ``conv[1]``
    (it read "layer 1: conv")."""
    g = torch.Generator().manual_seed(15)
    conv = [torch.randn(LAYERS, SLOTS, 6, 3, generator=g), torch.randn(LAYERS, SLOTS, 4, 3, generator=g)]
    temporal = torch.randn(LAYERS, SLOTS, 2, 4, 4, generator=g)
    conv[1].untyped_storage().resize_(0)
    with pytest.raises(BindingError, match=r"^conv\[1\]: its storage was freed"):
        SglangMambaPool(conv, temporal)
