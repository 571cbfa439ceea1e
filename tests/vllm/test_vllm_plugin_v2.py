"""The vLLM plugin's V2 part (recoverssm_rs.vllm.plugin_v2) over vLLM 0.33.0's own V2 runner model
state (``MambaHybridModelState``, loaded by tests/support/vllm_v2_oracle.py, its Triton kernels run
by Triton's interpreter): installed on a copy of vLLM's ``mamba_hybrid`` module, the served class
driven through vLLM's own interface equals vLLM's class byte for byte on random traces (states,
running columns, accepted counts after every half-step), every half-step is one launch of the
package's kernel (through its host emulation) and counted in ``plugin_stats()``; where the adapter
cannot serve, vLLM's own methods take over, counted and logged once, and the states stay equal."""

from __future__ import annotations

import logging
import sys
import types

import pytest

pytest.importorskip("torch")

from recoverssm_rs.vllm import plugin, plugin_v2  # noqa: E402
from support import vllm_oracle, vllm_trace  # noqa: E402

GroupCfg = vllm_trace.GroupCfg

TRACES = {
    "gdn-SD-spec2": ([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", 55),
    "2groups-DS-spec2": ([GroupCfg("GDN_ATTN", 1), GroupCfg("LINEAR", 1, temporal_shape=(3, 4))], 4, 2, "DS", 52),
    "2groups-SD-nospec": ([GroupCfg("GDN_ATTN", 1), GroupCfg("SHORT_CONV", 1, conv_dim=3)], 3, 0, "SD", 73),
}


@pytest.fixture(scope="module")
def mh():
    from support import vllm_v2_oracle

    return vllm_oracle.load_or_skip(vllm_v2_oracle.load, f"vLLM {vllm_oracle.VERSION} (V2 runner)")


@pytest.fixture
def stats(monkeypatch):
    fresh = plugin._Stats()
    monkeypatch.setattr(plugin, "_stats", fresh)
    return fresh


@pytest.fixture
def as_device(monkeypatch):
    """The adapter's launches see the host tensors as CUDA ones (the states, through the forward
    context the plugin hands it; its buffers and the runner's inputs, as launch arguments)."""
    from recoverssm_rs.cuda.ops import CudaOps
    from support.device_fakes import FakeCuda

    monkeypatch.setattr(CudaOps, "launch_arg", staticmethod(FakeCuda))

    def bound(ctx):
        return {k: types.SimpleNamespace(kv_cache=[FakeCuda(t) for t in v.kv_cache]) for k, v in ctx.items()}

    monkeypatch.setattr(plugin_v2, "_adapter_context", bound)


def _served(mh):
    """A copy of vLLM's module with the plugin's class installed (vLLM's module stays as it is)."""
    copy = types.ModuleType(mh.__name__)
    copy.__dict__.update({k: v for k, v in mh.__dict__.items() if k not in ("__name__", "__spec__")})
    assert plugin_v2.install_v2(copy, "0.33.0")
    assert copy.MambaHybridModelState is not mh.MambaHybridModelState
    assert issubclass(copy.MambaHybridModelState, mh.MambaHybridModelState)
    return copy


def _run(mh, served, name, **kw):
    from support import vllm_v2_plugin_trace

    groups, bs, nsb, layout, seed = TRACES[name]
    return vllm_v2_plugin_trace.run(
        mh.MambaHybridModelState,
        served.MambaHybridModelState,
        groups,
        block_size=bs,
        nsb=nsb,
        conv_layout=layout,
        seed=seed,
        **kw,
    )


@pytest.mark.parametrize("name", list(TRACES))
def test_served_v2_model_state_equals_vllm(mh, stats, fake_ops, emulator, as_device, name):
    served = _served(mh)
    trace = _run(mh, served, name)
    assert trace.pre_moves > 0 and trace.prefix_hits > 0 and trace.pp_rows > 0 and trace.non_last > 0
    s = plugin.plugin_stats()
    assert s["fallbacks"] == 0, s["reasons"]
    assert s["post_processes"] == trace.steps and 0 < s["pre_copies"] <= trace.steps
    # every served half-step is one launch of the package's kernel: vLLM's own copies never ran
    assert len(emulator.calls) == s["steps"]
    assert {c["kernel"] for c in emulator.calls} == {"rs_state_copy_slots"}
    assert f"{mh.__name__}.MambaHybridModelState" in s["replaced"]


@pytest.mark.parametrize("where", ["host", "rejected"])
def test_vllm_serves_where_the_adapter_cannot(mh, stats, fake_ops, emulator, as_device, monkeypatch, caplog, where):
    """States on the host (vLLM's CPU build running the V2 runner): the plugin declines the model
    state. A half-step the adapter rejects (here: every half-step): vLLM's own methods serve from
    then on, over the same per-slot buffers. Either way the trace stays equal to vLLM's, the reason
    is logged once and every half-step vLLM serves is a fallback."""
    from recoverssm_rs.errors import PlanError

    if where == "host":
        monkeypatch.setattr(plugin_v2, "_adapter_context", lambda ctx: ctx)
        words = "the adapter's kernel runs on CUDA"
    else:
        from recoverssm_rs.vllm.model_state import ModelStateV2

        def refuse(self, *a, **k):
            raise PlanError("planted refusal")

        monkeypatch.setattr(ModelStateV2, "preprocess_state", refuse)
        monkeypatch.setattr(ModelStateV2, "postprocess_state", refuse)
        words = "rejected a half-step (nothing changed): planted refusal"
    served = _served(mh)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.recoverssm_rs"):
        trace = _run(mh, served, "gdn-SD-spec2", steps=8)
    s = plugin.plugin_stats()
    assert s["steps"] == 0 and not emulator.calls
    assert s["fallbacks"] >= 2 * trace.steps - 1
    assert any(words in r for r in s["reasons"]), s["reasons"]
    assert len([r for r in caplog.records if words in r.getMessage()]) == 1  # logged once


def test_recoverssm_model_states_stay_vllm(mh, stats, as_device):
    """With RecoverSSM's commit on (``use_kda_recoverssm``), vLLM's post-process commits: the
    plugin leaves that model state to vLLM, counted and logged once."""
    from support import vllm_v2_oracle

    served = _served(mh)
    sim = vllm_trace.Sim([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", 5)
    side = vllm_trace.Side(sim, sim.make_states(), vllm_oracle.load())
    tables = [vllm_trace.torch.zeros(sim.max_reqs, sim.cols, dtype=vllm_trace.torch.int32)]
    ms = vllm_v2_oracle.vllm_model_state(served, side, tables, sim.max_reqs, recoverssm=True)
    assert ms._rs is None
    assert plugin.plugin_stats()["fallbacks"] == 1
    assert "RecoverSSM" in plugin.plugin_stats()["reasons"][0]


def test_other_signatures_are_left_alone(stats):
    class Other:
        def preprocess_state(self, input_batch, block_tables):  # not vLLM 0.32 / 0.33's
            pass

    module = types.ModuleType("m")
    module.MambaHybridModelState = Other
    assert not plugin_v2.install_v2(module, "0.34.0")
    assert module.MambaHybridModelState is Other
    s = plugin.plugin_stats()
    assert s["fallbacks"] == 1 and "another signature" in s["reasons"][0]


def test_watch_installs_when_vllm_loads_the_module(mh, stats, monkeypatch):
    copy = types.ModuleType(plugin_v2.MODULE_V2)
    copy.MambaHybridModelState = mh.MambaHybridModelState
    monkeypatch.setitem(sys.modules, plugin_v2.MODULE_V2, copy)
    plugin_v2.watch_v2("0.33.0")
    assert copy.MambaHybridModelState is not mh.MambaHybridModelState
    plugin_v2.watch_v2("0.33.0")  # twice: one subclass
    assert copy.MambaHybridModelState.__mro__[1] is mh.MambaHybridModelState
    monkeypatch.delitem(sys.modules, plugin_v2.MODULE_V2)
    # An earlier test of this process may have registered the plugin (and its hook) already.
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, plugin_v2._Watch)])
    before = list(sys.meta_path)
    plugin_v2.watch_v2("0.33.0")  # not loaded yet: an import hook for it
    added = [f for f in sys.meta_path if f not in before]
    assert len(added) == 1 and added[0].find_spec("elsewhere", None) is None
    monkeypatch.setattr(sys, "meta_path", before)
