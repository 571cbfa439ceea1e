"""Bad inputs to speculative decoding's state caches (:class:`StateCache` and the Kimi-K3 commit
over vLLM's own tensors): each is the package's error, naming the argument, row or layer, and
changes no state (compared byte for byte before and after)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from recoverssm_rs import BindingError, PlanError, _core
from recoverssm_rs.speculative.kimi_k3 import KimiK3Commit
from test_state_cache import conv_inputs, make_cache, snapshot, window

N, H, V, K, Q, HIST, D, R = 16, 2, 4, 4, 3, 3, 8, 4


def kimi_args(layers: int = 2, seed: int = 0) -> dict[str, Any]:
    """The tensors of ``layers`` Kimi-K3 KDA layers, each its own allocation, random contents."""
    g = torch.Generator().manual_seed(seed)

    def each(*shape: int) -> list[torch.Tensor]:
        return [torch.randn(*shape, generator=g) for _ in range(layers)]

    return dict(
        conv_states=each(N, D, HIST + Q - 1),
        states=each(N, H, V, K),
        corrections=each(R, H, Q, V),
        key_gates=each(R, H, Q, 2 * K),
        A_log=each(H),
        dt_bias=each(H, K),
        gate_lower_bound=[None] * layers,
        spec_query_len=Q,
    )


def kimi_state(a: dict[str, Any]) -> list[torch.Tensor]:
    return [t.clone() for t in (*a["conv_states"], *a["states"])]


def assert_kimi_unchanged(a: dict[str, Any], before: list[torch.Tensor]) -> None:
    for t, b in zip((*a["conv_states"], *a["states"]), before, strict=True):
        assert torch.equal(t, b)


BT = np.array([[5, 6, 7, 0], [9, 10, 11, 0]])


# ----------------------------------------------------------------------------------------------
# Kimi-K3: the plan


@pytest.mark.parametrize("computed", [2**63 - 1, 2**63 - 3])
def test_kimi_k3_token_positions_past_int64_are_a_plan_error(computed):
    """A number of computed tokens whose window ends past 2**63 - 1 was a Rust panic (an
    ``index out of bounds`` PanicException from the wrapped arithmetic)."""
    a = kimi_args()
    kc = KimiK3Commit(**a)
    before = kimi_state(a)
    with pytest.raises(PlanError) as info:
        kc.commit([3, 1], [2, 8], [0, 3, 6], block_table=BT, num_computed_tokens=[computed, 1], mamba_block_size=4)
    assert f"row 0 (request 0): num_computed_tokens {computed}" in str(info.value)
    assert_kimi_unchanged(a, before)


# ----------------------------------------------------------------------------------------------
# Kimi-K3: scalar arguments


@pytest.mark.parametrize("value", [3.0, "3", 2**70, True], ids=["float", "str", "huge", "bool"])
def test_kimi_k3_spec_query_len_of_the_wrong_kind_is_a_binding_error(value):
    """Was a TypeError / OverflowError from the extension's argument parsing (a bool was read as 1)."""
    a = kimi_args()
    a["spec_query_len"] = value
    with pytest.raises(BindingError, match="spec_query_len"):
        KimiK3Commit(**a)


@pytest.mark.parametrize("value", ["a", True], ids=["str", "bool"])
def test_kimi_k3_gate_lower_bound_of_the_wrong_kind_is_a_binding_error(value):
    a = kimi_args()
    a["gate_lower_bound"] = [value, value]
    with pytest.raises(BindingError, match=r"gate_lower_bound\[0\] must be a real number or None"):
        KimiK3Commit(**a)


@pytest.mark.parametrize("value", [4.0, "4", 2**64, True], ids=["float", "str", "huge", "bool"])
def test_kimi_k3_block_size_of_the_wrong_kind_is_a_plan_error(value):
    a = kimi_args()
    kc = KimiK3Commit(**a)
    before = kimi_state(a)
    with pytest.raises(PlanError, match="block_size"):
        kc.commit([3, 1], [2, 8], [0, 3, 6], block_table=BT, num_computed_tokens=[6, 1], mamba_block_size=value)
    assert_kimi_unchanged(a, before)


def test_kimi_k3_a_positive_gate_lower_bound_is_refused():
    """The gate ``lower_bound * sigmoid(..)`` is a log-decay: a positive bound made every decay a
    growth (the states blew up silently)."""
    a = kimi_args()
    a["gate_lower_bound"] = [5.0, 5.0]
    with pytest.raises(BindingError, match="layer 0: gate_lower_bound must be finite and <= 0"):
        KimiK3Commit(**a)
    a["gate_lower_bound"] = [-5.0, -5.0]
    KimiK3Commit(**a)


# ----------------------------------------------------------------------------------------------
# Kimi-K3: tensors


def test_kimi_k3_layers_writing_shared_memory_are_refused():
    """One state tensor given for two layers folded the records twice into it; an expanded state
    wrote every block; a state overlapping a layer's records changed them before they were read."""
    a = kimi_args()
    s = a["states"][0]
    a["states"] = [s, s]
    with pytest.raises(BindingError, match="layer 0: state and layer 1: state share memory"):
        KimiK3Commit(**a)
    a = kimi_args()
    a["states"] = [torch.zeros(1, H, V, K).expand(N, H, V, K)] + a["states"][1:]
    with pytest.raises(BindingError, match="layer 0: state: its elements overlap"):
        KimiK3Commit(**a)
    a = kimi_args()
    buf = torch.zeros(N * H * V * K + R * H * Q * V)
    a["states"][1] = buf[: N * H * V * K].view(N, H, V, K)
    a["corrections"][1] = buf[-R * H * Q * V - 8 : -8].view(R, H, Q, V)
    with pytest.raises(BindingError, match="layer 1: state and layer 1: correction share memory"):
        KimiK3Commit(**a)


def test_kimi_k3_vllm_pages_interleaving_conv_and_state_are_accepted():
    """vLLM's layout: per block one page holding the layer's conv state, then its state."""
    a = kimi_args(layers=1)
    conv_elems, state_elems = D * (HIST + Q - 1), H * V * K
    pages = torch.zeros(N, conv_elems + state_elems)
    a["conv_states"] = [pages[:, :conv_elems].view(N, D, HIST + Q - 1)]
    a["states"] = [pages[:, conv_elems:].view(N, H, V, K)]
    a["states"][0].copy_(torch.randn(N, H, V, K))
    kc = KimiK3Commit(**a)
    p = kc.commit([2], [3], [0, 3])
    assert p[4] == [3]


def test_kimi_k3_numpy_arrays_are_refused():
    """The core takes numpy arrays, the fold indexes torch tensors: was an AttributeError at commit."""
    a = kimi_args()
    a["states"] = [t.numpy() for t in a["states"]]
    with pytest.raises(BindingError, match="layer 0: state: the commit folds torch tensors, got ndarray"):
        KimiK3Commit(**a)


def test_kimi_k3_lists_given_as_iterators_or_not_lists():
    """A generator was read by the core and then found empty (an IndexError at commit); ``None``
    or a bare bound was a TypeError from ``list()``."""
    a = kimi_args()
    b = {k: list(v) if isinstance(v, list) else v for k, v in kimi_args().items()}
    gen = dict(a, **{k: (t for t in a[k]) for k in ("conv_states", "states", "corrections", "key_gates")})
    want = KimiK3Commit(**b).commit([2, 1], [3, 4], [0, 3, 6])
    assert KimiK3Commit(**gen).commit([2, 1], [3, 4], [0, 3, 6]) == want
    for s, t in zip(a["states"], b["states"], strict=True):
        assert torch.equal(s, t)
    with pytest.raises(BindingError, match="conv"):
        KimiK3Commit(**dict(kimi_args(), conv_states=None))
    with pytest.raises(BindingError, match="gate_lower_bound"):
        KimiK3Commit(**dict(kimi_args(), gate_lower_bound=-5.0))


def test_kimi_k3_meta_index_vectors_are_a_plan_error():
    """Was a NotImplementedError from copying a meta tensor to the host."""
    a = kimi_args()
    kc = KimiK3Commit(**a)
    before = kimi_state(a)
    with pytest.raises(PlanError, match="num_accepted_tokens"):
        kc.commit(torch.tensor([2, 1], device="meta"), [3, 4], [0, 3, 6])
    assert_kimi_unchanged(a, before)


# ----------------------------------------------------------------------------------------------
# StateCache


def assert_unchanged(cache, before) -> None:
    for name, buf in cache.buffers().items():
        assert torch.equal(buf, before[name]), f"{name} changed"


@pytest.mark.parametrize("which", ["x", "weight"])
def test_conv_verify_inputs_on_another_device_are_a_plan_error(which):
    """Was a RuntimeError from ``torch.cat`` deep in the conv."""
    cache = make_cache(("kda", "DS", "bfloat16"), num_layers=1)
    x, w = conv_inputs(cache, 2, torch.Generator().manual_seed(1))
    args = {"x": x, "weight": w}
    args[which] = args[which].to("meta")
    before = snapshot(cache)
    with pytest.raises(PlanError, match=f"{which}: expected a tensor on cpu, got one on meta"):
        cache.conv_verify(0, [1, 2], args["x"], args["weight"])
    assert_unchanged(cache, before)


def test_verify_query_lens_on_meta_is_a_plan_error():
    """Was a NotImplementedError from copying the meta tensor."""
    cache = make_cache(("gdn", "SD", "float32"), num_layers=1)
    inputs = window(cache, 2, torch.Generator().manual_seed(2))
    before = snapshot(cache)
    with pytest.raises(PlanError, match="query_lens"):
        cache.verify(0, [1, 2], *inputs, query_lens=torch.tensor([2, 2], device="meta"))
    assert_unchanged(cache, before)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda cp, lay: _core.CommitPlanner(lay, True), "num_blocks"),
        (lambda cp, lay: _core.CommitPlanner("GDN", 8), "layout"),
        (lambda cp, lay: cp.check_state_blocks([1, 2], -1), "max_requests"),
        (lambda cp, lay: cp.check_state_blocks([1, 2], "8"), "max_requests"),
        (lambda cp, lay: cp.check_state_blocks([1, 2], True), "max_requests"),
        (lambda cp, lay: _core.check_index("layer", 0, -1), "len"),
        (lambda cp, lay: _core.check_commit_counts("cpu", torch.tensor([1]), -1), "min_len"),
        (lambda cp, lay: _core.commit_grid(b"", 1.5), "threads"),
    ],
    ids=[
        "planner-bool-blocks",
        "planner-layout",
        "max-neg",
        "max-str",
        "max-bool",
        "len-neg",
        "min-len-neg",
        "threads",
    ],
)
def test_commit_binding_integers_of_the_wrong_kind_are_the_packages_errors(call, name):
    """Were TypeError / OverflowError from the extension's argument parsing, or a bool read as 1."""
    cache = make_cache(("gdn", "SD", "float32"), num_layers=1)
    with pytest.raises((BindingError, PlanError), match=name):
        call(cache.commit_planner, cache.layout)


@pytest.mark.parametrize("buffer", ["conv", "recurrent"])
def test_copy_blocks_after_a_pool_buffer_was_repointed_is_refused(buffer):
    """The copy planner's per-layer views kept the old memory: a copy after ``set_`` reported its
    copies and wrote memory the cache no longer reads."""
    cache = make_cache(("kda", "DS", "bfloat16"), num_layers=2)
    t = cache.buffers()[buffer]
    t.set_(torch.zeros_like(t))
    before = snapshot(cache)
    with pytest.raises(BindingError, match=f"StateCache {buffer} buffer"):
        cache.copy_blocks([1], [5])
    assert_unchanged(cache, before)


def test_commit_meta_of_a_freed_buffer_is_refused():
    """Was a RuntimeError from indexing the freed buffer."""
    cache = make_cache(("gdn", "SD", "float32"), num_layers=2)
    cache.buffers()["corrections"].untyped_storage().resize_(0)
    with pytest.raises(BindingError, match="StateCache corrections buffer"):
        cache.commit_meta()
