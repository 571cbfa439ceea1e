"""The vLLM plugin (recoverssm_rs.vllm.plugin) over vLLM 0.33.0's own ``mamba_utils`` (the oracle's
module, see tests/support/vllm_oracle.py): installed on a copy of that module, it replaces the three
step functions (their signatures are vLLM's), serves random align-mode traces -- with and without
speculative decoding, one and several mamba groups -- where vLLM's own copy code never runs and the
states and counts equal the package's step at every half-step (which the oracle tests hold equal to
vLLM's), and falls back to vLLM's functions, counted and logged once, where it cannot serve.

The end-to-end run on a real vLLM is tests/e2e/test_vllm_cpu.py.
"""

from __future__ import annotations

import logging
import types

import pytest

pytest.importorskip("torch")

from recoverssm_rs.vllm import plugin  # noqa: E402
from support import vllm_oracle, vllm_trace  # noqa: E402
from support.vllm_trace import TRACES  # noqa: E402

STEP_FUNCS = ("preprocess_mamba", "stage_postprocess_inputs_to_gpu", "postprocess_mamba_align_gpu")


@pytest.fixture(scope="module")
def oracle():
    return vllm_oracle.load_or_skip(vllm_oracle.load, f"vLLM {vllm_oracle.VERSION}")


@pytest.fixture
def stats(monkeypatch):
    """Fresh counters for one test."""
    fresh = plugin._Stats()
    monkeypatch.setattr(plugin, "_stats", fresh)
    return fresh


def _copy_of(module: types.ModuleType) -> types.ModuleType:
    """A module with ``module``'s attributes (vLLM's functions keep their own globals)."""
    m = types.ModuleType(module.__name__)
    m.__dict__.update({k: v for k, v in module.__dict__.items() if k not in ("__name__", "__spec__")})
    return m


def _counting(module: types.ModuleType, names: tuple[str, ...], mp: pytest.MonkeyPatch | None = None) -> dict[str, int]:
    """Counts the calls of ``module``'s functions ``names`` (through ``mp`` when given: undone
    after the test)."""
    counts = dict.fromkeys(names, 0)
    for n in names:
        f = getattr(module, n)

        def counted(*a, _f=f, _n=n, **k):
            counts[_n] += 1
            return _f(*a, **k)

        (mp.setattr if mp is not None else setattr)(module, n, counted)
    return counts


def test_vllm_033_signatures_are_the_plugins(oracle):
    for name in STEP_FUNCS:
        assert plugin.signature_matches(getattr(oracle.wmu, name), name), name
    assert not plugin.signature_matches(lambda scheduler_output, input_batch: None, "preprocess_mamba")


@pytest.mark.parametrize(
    "version,ok",
    [("0.32.0", True), ("0.33.0", True), ("0.33.1+cpu", True), ("0.34.0", False), ("1.32.0", False), ("dev", False)],
)
def test_versions(version, ok):
    assert plugin.version_supported(version) is ok


@pytest.mark.parametrize("name", ["gdn-SD-spec2", "3groups-DS-spec2", "gdn-SD-nospec-scalar"])
def test_plugin_serves_vllm_step_functions(oracle, stats, name, monkeypatch, caplog):
    wmu = _copy_of(oracle.wmu)
    # vLLM's own copy code (looked up in vLLM's module by vLLM's functions): never runs while the
    # plugin serves
    own = _counting(oracle.wmu, ("collect_mamba_copy_meta", "do_mamba_copy_block"), monkeypatch)
    ctx_cls = oracle.wmu.MambaSpecDecodeGPUContext
    fused = {"pre": 0, "post": 0}
    real_pre, real_post = ctx_cls.run_fused_precopy, ctx_cls.run_fused_postprocess

    def count_pre(self, *a, **k):
        fused["pre"] += 1
        return real_pre(self, *a, **k)

    def count_post(self, *a, **k):
        fused["post"] += 1
        return real_post(self, *a, **k)

    replaced = plugin.install(wmu, "0.33.0")
    assert replaced == ["preprocess_mamba", "postprocess_mamba_align_gpu", "stage_postprocess_inputs_to_gpu"]
    calls = _counting(wmu, STEP_FUNCS)
    groups, bs, nsb, layout, seed, *shared = TRACES[name]
    ns = types.SimpleNamespace(wmu=wmu, lmu=oracle.lmu, envs=oracle.envs)
    mp = pytest.MonkeyPatch()
    mp.setattr(ctx_cls, "run_fused_precopy", count_pre)
    mp.setattr(ctx_cls, "run_fused_postprocess", count_post)
    try:
        # vLLM's side of the trace calls ns.wmu's functions, i.e. the plugin's; the other side is
        # the package's step, which the oracle tests hold equal to vLLM 0.33's own functions.
        with caplog.at_level(logging.INFO, logger="vllm.plugins.recoverssm_rs"):
            t = vllm_trace.run_trace(ns, groups, block_size=bs, nsb=nsb, conv_layout=layout, seed=seed, steps=16)
    finally:
        mp.undo()
    # one INFO line (at the first call: vLLM sets its logging up after loading plugins)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) == 1 and "serves vLLM 0.33.0's mamba state step: replaced" in lines[0], lines
    assert t.pre_copies > 0 and (t.post_copies > 0 or nsb == 0)
    s = plugin.plugin_stats()
    assert s["fallbacks"] == 0 and s["reasons"] == []
    assert s["pre_copies"] == calls["preprocess_mamba"] == t.steps
    assert s["post_processes"] == calls["postprocess_mamba_align_gpu"] == (t.busy_steps if nsb else 0)
    assert s["steps"] == s["pre_copies"] + s["post_processes"]
    assert own == {"collect_mamba_copy_meta": 0, "do_mamba_copy_block": 0}
    assert fused == {"pre": 0, "post": 0}


def _side(oracle, name="gdn-SD-nospec-scalar"):
    groups, bs, nsb, layout, seed, *_ = TRACES[name]
    vllm_oracle.set_conv_layout(oracle, layout)
    sim = vllm_trace.Sim(groups, bs, nsb, layout, seed)
    side = vllm_trace.Side(sim, sim.make_states(False), oracle)
    return sim, side


def test_unservable_runner_falls_back_counted_and_logged_once(oracle, stats, caplog, monkeypatch):
    """A runner the step cannot serve (here: a copy function of another kind than its state) runs
    vLLM's own functions, each call counted as a fallback, the reason logged once."""
    wmu = _copy_of(oracle.wmu)
    plugin.install(wmu, "0.33.0")
    _, side = _side(oracle)
    vside = vllm_trace.VllmSide(oracle, side)
    vside.ns = types.SimpleNamespace(wmu=wmu)
    own = _counting(oracle.wmu, ("do_mamba_copy_block",), monkeypatch)
    funcs = side.copy_funcs(oracle)
    vside.funcs = {t: tuple(reversed(f)) for t, f in funcs.items()}  # conv <-> temporal: refused
    so = vllm_trace.scheduler_output([], {}, set(), set(), set())
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.recoverssm_rs"):
        vside.pre(so)
        vside.pre(so)
    s = plugin.plugin_stats()
    assert s["fallbacks"] == 2 and s["steps"] == 0 and own["do_mamba_copy_block"] == 2
    assert len(s["reasons"]) == 1 and "cannot serve" in s["reasons"][0]
    assert len([r for r in caplog.records if "vLLM's own code serves" in r.getMessage()]) == 1


def test_rejected_step_hands_the_runner_to_vllm(oracle, stats):
    """A step the package rejects (a request missing from ``requests``) changes nothing and vLLM's
    function runs it; the runner stays with vLLM's code, whose bookkeeping the plugin kept."""
    wmu = _copy_of(oracle.wmu)
    plugin.install(wmu, "0.33.0")
    sim, side = _side(oracle)
    vside = vllm_trace.VllmSide(oracle, side)
    vside.ns = types.SimpleNamespace(wmu=wmu)
    r = sim.new_request()
    sim.admit(r)
    sim.ensure_cols(r, 5)
    side.load_batch([r])
    so = vllm_trace.scheduler_output([r], {r.rid: (5, 0)}, set(), set(), set())
    vside.pre(so)  # served
    assert vside.mamba_state_idx == {r.rid: (r.computed + 5 - 1) // sim.bs}
    del side.requests[r.rid]
    with pytest.raises(KeyError):  # vLLM's own function, given the same bad input, fails its own way
        vside.pre(so)
    s = plugin.plugin_stats()
    assert s["pre_copies"] == 1 and s["fallbacks"] == 1 and "rejected a pre-copy" in s["reasons"][0]


def test_register_switch_and_unknown_version(monkeypatch, stats, oracle):
    """``RECOVERSSM_VLLM_PLUGIN=0`` replaces nothing; an unknown vLLM version replaces nothing and
    counts a fallback; a known one replaces the functions of ``vllm.v1.worker.mamba_utils``."""
    wmu = _copy_of(oracle.wmu)
    originals = {n: getattr(wmu, n) for n in STEP_FUNCS}
    fake = types.ModuleType("vllm")
    monkeypatch.setitem(__import__("sys").modules, "vllm", fake)
    monkeypatch.setitem(__import__("sys").modules, "vllm.v1.worker.mamba_utils", wmu)

    monkeypatch.setenv("RECOVERSSM_VLLM_PLUGIN", "0")
    fake.__version__ = "0.33.0"
    plugin.register()
    assert {n: getattr(wmu, n) for n in STEP_FUNCS} == originals
    assert plugin.plugin_stats()["active"] is False and plugin.plugin_stats()["fallbacks"] == 0

    monkeypatch.setattr(plugin, "_stats", plugin._Stats())
    monkeypatch.delenv("RECOVERSSM_VLLM_PLUGIN")
    fake.__version__ = "0.40.0"
    plugin.register()
    assert {n: getattr(wmu, n) for n in STEP_FUNCS} == originals
    s = plugin.plugin_stats()
    assert s["fallbacks"] == 1 and "0.40.0" in s["reasons"][0] and not s["active"]

    monkeypatch.setattr(plugin, "_stats", plugin._Stats())
    fake.__version__ = "0.33.0"
    plugin.register()
    plugin.register()  # once per process
    assert all(getattr(wmu, n) != originals[n] for n in STEP_FUNCS)
    s = plugin.plugin_stats()
    assert s["active"] and s["vllm_version"] == "0.33.0" and len(s["replaced"]) == 3


def test_the_wheel_declares_the_entry_point():
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    group = meta["project"]["entry-points"]["vllm.general_plugins"]
    assert group == {"recoverssm_rs": "recoverssm_rs.vllm.plugin:register"}
    module, _, func = group["recoverssm_rs"].partition(":")
    assert callable(getattr(__import__(module, fromlist=[func]), func))
