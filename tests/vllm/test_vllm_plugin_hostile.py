"""The vLLM plugin (recoverssm_rs.vllm.plugin) under what a serving process can hand it: its switch
set to a value it does not know, a vLLM whose step module differs from 0.32 / 0.33's in ways the
signature check must catch at install time, and calls of the replaced functions as vLLM may make
them. vLLM's plugin loader calls ``register()`` unguarded in every process: whatever it cannot
serve must leave vLLM's code in place (counted, logged once), never raise."""

from __future__ import annotations

import logging
import sys
import types

import pytest
from recoverssm_rs.vllm import plugin

STEP_FUNCS = ("preprocess_mamba", "stage_postprocess_inputs_to_gpu", "postprocess_mamba_align_gpu")


@pytest.fixture
def stats(monkeypatch):
    fresh = plugin._Stats()
    monkeypatch.setattr(plugin, "_stats", fresh)
    return fresh


def _step_module(calls: list[tuple[str, tuple, dict]]) -> types.ModuleType:
    """A stand-in for ``vllm.v1.worker.mamba_utils``: functions with vLLM 0.33's parameters that
    record their calls."""
    m = types.ModuleType(plugin.MODULE)
    for name, params in plugin.PARAMS.items():
        src = f"def {name}({', '.join(params)}):\n    calls.append(({name!r}, ({', '.join(params)},), {{}}))\n"
        exec(src, {"calls": calls}, m.__dict__)
    return m


def _fake_vllm(monkeypatch, module: types.ModuleType, version: str = "0.33.0") -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = version
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, plugin.MODULE, module)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the V2 import hook, undone after


@pytest.mark.parametrize("value", ["disable", "disabled", "n", "nein", "0n"])
def test_unknown_switch_value_leaves_vllm_alone_and_names_it(monkeypatch, stats, caplog, value):
    """``RECOVERSSM_VLLM_PLUGIN`` set to a value that is neither on nor off (a typo of ``0``, a word
    it does not know) was read as on: the plugin replaced vLLM's step although the user tried to
    turn it off. Now nothing is replaced and one warning names the variable and the value."""
    calls: list = []
    module = _step_module(calls)
    originals = {n: getattr(module, n) for n in STEP_FUNCS}
    _fake_vllm(monkeypatch, module)
    monkeypatch.setenv(plugin.ENV_SWITCH, value)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.recoverssm_rs"):
        plugin.register()
    assert {n: getattr(module, n) for n in STEP_FUNCS} == originals
    s = plugin.plugin_stats()
    assert not s["active"] and s["replaced"] == []
    assert len(s["reasons"]) == 1 and plugin.ENV_SWITCH in s["reasons"][0] and repr(value) in s["reasons"][0]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and plugin.ENV_SWITCH in warned[0] and repr(value) in warned[0]


@pytest.mark.parametrize("value,on", [("", True), (" 1 ", True), ("TRUE", True), ("on", True), ("Off", False)])
def test_known_switch_values(monkeypatch, stats, value, on):
    module = _step_module([])
    _fake_vllm(monkeypatch, module)
    monkeypatch.setenv(plugin.ENV_SWITCH, value)
    plugin.register()
    s = plugin.plugin_stats()
    assert s["active"] is on and s["fallbacks"] == 0


@pytest.mark.parametrize("name", ["stage_postprocess_inputs_to_gpu", "postprocess_mamba_align_gpu"])
def test_a_step_function_whose_signature_cannot_be_read_is_left_at_install(monkeypatch, stats, name):
    """A vLLM whose post-process or staging is no longer a plain function (here: an object
    ``inspect.signature`` cannot read) failed the signature check and was then inspected anyway:
    ``register()`` raised TypeError into vLLM's plugin loader, which does not guard the call (the
    engine would not start). Now that function stays vLLM's (as one with another signature) and
    the rest is served."""
    calls: list = []
    module = _step_module(calls)
    odd = types.SimpleNamespace()
    setattr(module, name, odd)
    _fake_vllm(monkeypatch, module)
    plugin.register()  # must not raise
    assert getattr(module, name) is odd
    s = plugin.plugin_stats()
    assert s["active"] and "preprocess_mamba" in s["replaced"] and name not in s["replaced"]


def test_the_post_process_takes_vllms_arguments_by_position(stats):
    """The signature check accepts a post-process by its parameters' names and order, but the
    replacement took keywords only: a vLLM calling it by position (as it calls ``preprocess_mamba``)
    failed with TypeError inside the plugin at its first speculative step. Now each replacement
    takes vLLM's arguments as vLLM's function does (here: a runner never pre-copied, so vLLM's own
    function runs, with the arguments as given)."""
    calls: list = []
    module = _step_module(calls)
    assert "postprocess_mamba_align_gpu" in plugin.install(module, "0.33.0")
    params = plugin.PARAMS["postprocess_mamba_align_gpu"]
    args = tuple(types.SimpleNamespace(name=p) for p in params)
    module.postprocess_mamba_align_gpu(*args[:3], **dict(zip(params[3:], args[3:])))
    module.postprocess_mamba_align_gpu(*args)
    assert calls == [("postprocess_mamba_align_gpu", args, {})] * 2
    assert plugin.plugin_stats()["fallbacks"] == 2


def test_a_runner_vllm_frees_frees_its_states(stats):
    """vLLM drops a runner's mamba buffers when it re-initialises or frees its KV cache (a new
    engine in the same process, ``LLM`` shut down: vLLM's ``shutdown()`` frees the KV cache so that
    the memory is reclaimable). The plugin held each runner's step, keyed by vLLM's buffer object, in
    a dict of its own for the life of the process: the step and every recurrent state it binds (on
    a GPU, most of the KV cache) stayed allocated. Now the runner lives on vLLM's buffer object and
    goes with it."""
    import dataclasses
    import weakref

    import numpy as np

    torch = pytest.importorskip("torch")
    from support import vllm_trace

    @dataclasses.dataclass
    class CopyBuffers:  # vLLM's MambaCopyBuffers is a plain dataclass
        n: int = 0

    module = _step_module([])
    plugin.install(module, "0.33.0")

    def engine() -> weakref.ref:
        states = [torch.zeros(16, 5, 3), torch.zeros(16, 2, 2)]
        cfg, ctx, funcs = vllm_trace.small_runner_objects(states, fake=False)
        batch = types.SimpleNamespace(
            req_ids=[],
            max_num_reqs=4,
            num_accepted_tokens_cpu=np.ones(4, np.int32),
            block_table=[vllm_trace.BlockTable(4, 8)],
        )
        so = vllm_trace.scheduler_output([], {}, set(), set(), set())
        cache_config = types.SimpleNamespace(enable_prefix_caching=True)
        module.preprocess_mamba(so, cfg, cache_config, {}, batch, {}, ctx, funcs, CopyBuffers(), None)
        return weakref.ref(states[0])

    state = engine()
    assert plugin.plugin_stats()["pre_copies"] == 1, plugin.plugin_stats()["reasons"]
    alive = state() is not None
    assert not alive, "the plugin keeps a freed runner's states"


def _served_v2_model_state(monkeypatch):
    """A served V2 model state (vLLM 0.33's class, the plugin's subclass installed on a copy of its
    module) over host states the adapter sees as CUDA ones: (model state, side, block tables)."""
    from recoverssm_rs.cuda.ops import CudaOps
    from recoverssm_rs.vllm import plugin_v2
    from support import device_fakes, vllm_oracle, vllm_trace, vllm_v2_oracle

    mh = vllm_oracle.load_or_skip(vllm_v2_oracle.load, f"vLLM {vllm_oracle.VERSION} (V2 runner)")
    monkeypatch.setattr(CudaOps, "launch_arg", staticmethod(device_fakes.FakeCuda))

    def bound(ctx):
        return {
            k: types.SimpleNamespace(kv_cache=[device_fakes.FakeCuda(t) for t in v.kv_cache]) for k, v in ctx.items()
        }

    monkeypatch.setattr(plugin_v2, "_adapter_context", bound)
    served = types.ModuleType(mh.__name__)
    served.__dict__.update({k: v for k, v in mh.__dict__.items() if k not in ("__name__", "__spec__")})
    assert plugin_v2.install_v2(served, "0.33.0")
    sim = vllm_trace.Sim([vllm_trace.GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", 5)
    side = vllm_trace.Side(sim, sim.make_states(), vllm_oracle.load())
    tables = [vllm_trace.torch.zeros(sim.max_reqs, sim.cols, dtype=vllm_trace.torch.int32)]
    ms = vllm_v2_oracle.vllm_model_state(served, side, tables, sim.max_reqs)
    assert ms._rs is not None and plugin.plugin_stats()["fallbacks"] == 0
    return ms, side, tables


def test_a_v2_model_state_the_adapter_cannot_rebuild_goes_to_vllm(monkeypatch, stats):
    """vLLM's V2 runner initialises its model state's KV cache twice: a minimal one for CUDA-graph
    profiling, freed, then the real one. Where the adapter served the first and refused the second
    (the real config, e.g. another group layout), the model state kept the first adapter: its
    half-steps were served over the freed profiling states, the real ones never copied, while the
    log said vLLM's code serves. Now a refused (re)build leaves the model state to vLLM's methods."""
    from recoverssm_rs.errors import LayoutError
    from recoverssm_rs.vllm.model_state import ModelStateV2

    ms, side, tables = _served_v2_model_state(monkeypatch)  # the profiling init: served

    def refuse(*a, **k):
        raise LayoutError("planted: the real KV-cache config")

    monkeypatch.setattr(ModelStateV2, "from_runner", refuse)
    bts = types.SimpleNamespace(block_tables=[types.SimpleNamespace(gpu=t) for t in tables], input_block_tables=tables)
    ms.initialize_kv_cache(side.kv_cache_config, bts)  # the real init: refused
    assert ms._rs is None, "the model state kept the adapter of the KV cache vLLM replaced"
    s = plugin.plugin_stats()
    assert s["fallbacks"] == 1 and "planted: the real KV-cache config" in s["reasons"][0]


def test_vllms_profiling_teardown_frees_the_v2_states(monkeypatch, stats):
    """vLLM's V2 runner frees its profiling KV cache before it allocates the real one
    (``_teardown_profiling_state``: the model state's ``_mamba_ctx`` dropped, the layers' KV
    caches cleared), having sized the real one on that memory. The served model state's adapter,
    an attribute of its own, kept binding the profiling states (views: the whole profiling KV
    cache) until the real ``initialize_kv_cache``, which vLLM calls after allocating the real
    cache: both were held at once (on a GPU, out of memory or less KV cache than planned). Now the
    adapter lives on vLLM's align context and goes with it."""
    import weakref

    ms, side, _ = _served_v2_model_state(monkeypatch)
    state = weakref.ref(side.states[0][0][0])
    ms._mamba_ctx = None  # vLLM's teardown
    for layer in side.forward_context.values():
        layer.kv_cache = []
    side.states = None
    alive = state() is not None
    assert not alive, "the served model state keeps vLLM's freed profiling states"
    assert ms._rs is None


def test_a_v2_adapter_no_align_context_can_hold_is_a_fallback(monkeypatch, stats):
    """The adapter lives on vLLM's align context. Where there is none, or it takes no attribute,
    the adapter is not served (a reason, not an exception out of ``initialize_kv_cache``), and
    vLLM's buffers stay vLLM's: before, the adapter was lost silently after vLLM's two buffers had
    been pointed at its own."""
    ms, side, tables = _served_v2_model_state(monkeypatch)
    bts = types.SimpleNamespace(block_tables=[types.SimpleNamespace(gpu=t) for t in tables], input_block_tables=tables)

    class Slotted:
        __slots__ = ("x",)

    for ctx in (None, Slotted()):
        ms._mamba_ctx = ctx
        ms._rs = object()  # nowhere to hold it: no AttributeError
        assert ms._rs is None
        acc, idx = ms.num_accepted_tokens_gpu, ms._mamba_state_idx_gpu
        reason = ms._rs_build(side.kv_cache_config, bts)
        assert reason is not None and "no align context" in reason
        assert ms.num_accepted_tokens_gpu is acc and ms._mamba_state_idx_gpu is idx
