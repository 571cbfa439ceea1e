"""The layout calculators speak vLLM's language: parameter names and shapes of vLLM 0.33's
``MambaStateShapeCalculator`` (vllm/model_executor/layers/mamba/mamba_utils.py).

Three layers of checks:

- every calculator's keyword names are pinned against a table of vLLM 0.33's parameter names
  (``VLLM_PARAMS`` below), translated by the documented rules (docs/design.md section 4);
- shapes for real model configs, worked out by hand from vLLM's formulas;
- where the vLLM 0.33.0 wheel can be had (downloaded once by tests/support/vllm_oracle.py into the
  cache outside the repository that the conformance oracle shares, or named by
  ``RECOVERSSM_VLLM_WHEEL``), the table is compared with
  the real signatures and the shapes with vLLM's own calculator over a few hundred configs. Only
  the single file ``mamba_utils.py`` is loaded, by path, with stubs for the vLLM modules it
  imports (none of which the shape calculator uses); vLLM's package ``__init__`` is never
  imported. Without network the test skips; ``RECOVERSSM_NO_DOWNLOAD=1`` skips it outright.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import logging
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from recoverssm_rs import LayoutError, layouts
from support import vllm_oracle

# --- the pinned names ------------------------------------------------------------------------

#: vLLM 0.33's shape calculator per family: method name and its parameters (``cls`` dropped).
VLLM_PARAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mamba1": ("mamba1_state_shape", ("tp_world_size", "intermediate_size", "state_size", "conv_kernel")),
    "mamba2": (
        "mamba2_state_shape",
        (
            "tp_world_size",
            "intermediate_size",
            "n_groups",
            "num_heads",
            "head_dim",
            "state_size",
            "conv_kernel",
            "num_spec",
        ),
    ),
    "short_conv": ("short_conv_state_shape", ("tp_world_size", "intermediate_size", "conv_kernel", "num_spec")),
    "linear_attention": ("linear_attention_state_shape", ("num_heads", "tp_size", "head_dim")),
    "gdn": (
        "gated_delta_net_state_shape",
        ("tp_world_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel_size", "num_spec"),
    ),
    "kda": (
        "kda_state_shape",
        ("tp_world_size", "num_heads", "head_dim", "num_k_heads", "head_k_dim", "conv_kernel_size", "num_spec"),
    ),
}
#: ``append_replayssm_ring``'s parameters; ``logical_window`` keeps its name, ``backend`` is
#: ``mamba_backend`` here and ``num_speculative_tokens`` is the shared ``num_spec``.
VLLM_RING_PARAMS = ("base_shapes", "n_groups", "tp_world_size", "logical_window", "backend", "num_speculative_tokens")

#: vLLM's names for the shared settings -> the package's.
SHARED_RENAMES = {"tp_world_size": "tp_size", "tp_size": "tp_size", "num_spec": "num_spec"}
#: Settings every calculator of the package takes beyond vLLM's (storage and RecoverSSM).
EXTRAS = {
    "mamba1": {"num_spec", "conv_layout", "dtype", "ssm_dtype"},
    "mamba2": {"conv_layout", "dtype", "ssm_dtype", "logical_window", "mamba_backend"},
    "short_conv": {"conv_layout", "dtype"},
    "linear_attention": {"num_spec", "ssm_dtype"},
    "gdn": {"conv_layout", "dtype", "ssm_dtype", "recover_ssm"},
    "kda": {"conv_layout", "dtype", "ssm_dtype", "recover_ssm"},
}


def our_params(family: str) -> list[str]:
    return list(inspect.signature(layouts.FAMILIES[family]).parameters)


@pytest.mark.parametrize("family", sorted(VLLM_PARAMS))
def test_parameter_names_are_vllms(family):
    _, vllm_names = VLLM_PARAMS[family]
    expected = {SHARED_RENAMES.get(n, n) for n in vllm_names} | EXTRAS[family]
    assert set(our_params(family)) == expected
    # Every model parameter is keyword-only, under exactly vLLM's name.
    sig = inspect.signature(layouts.FAMILIES[family])
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.parameters.values())


def test_old_names_are_gone():
    with pytest.raises(TypeError, match="hidden_size"):
        layouts.short_conv(hidden_size=2048, conv_kernel=3)
    with pytest.raises(TypeError, match="conv_kernel_size"):
        layouts.mamba1(intermediate_size=4096, state_size=16, conv_kernel_size=4)
    with pytest.raises(LayoutError, match="unknown override 'replay_ring'"):
        layouts.preset("nemotron-h-8b", replay_ring=16)


def test_kda_defaults_follow_vllm():
    # vLLM: num_k_heads defaults to num_heads, head_k_dim to head_dim, conv_kernel_size to 4.
    a = layouts.kda(num_heads=32, head_dim=128)
    b = layouts.kda(num_heads=32, head_dim=128, num_k_heads=32, head_k_dim=128, conv_kernel_size=4)
    assert a == b and a.states[0].shape == (3, 3 * 32 * 128)


# --- shapes worked out by hand -----------------------------------------------------------------

HAND_CASES = [
    # LFM2-1.2B short conv (conv_dim 2048, L_cache 3), tp 2, 2 drafts: width 3 - 1 + 2 = 4.
    ("short_conv", dict(intermediate_size=2048, conv_kernel=3, tp_size=2, num_spec=2), [(4, 1024)]),
    ("short_conv", dict(intermediate_size=2048, conv_kernel=3, tp_size=2, num_spec=2, conv_layout="DS"), [(1024, 4)]),
    # mamba-2.8b (intermediate 5120, state 16, conv 4), tp 2: conv (3, 2560), temporal (2560, 16).
    ("mamba1", dict(intermediate_size=5120, state_size=16, conv_kernel=4, tp_size=2), [(3, 2560), (2560, 16)]),
    # Nemotron-H-8B Mamba2, tp 4, 1 draft: g' = 8, dim = (8192 + 2*8*128) / 4 = 2560.
    (
        "mamba2",
        dict(
            intermediate_size=8192,
            n_groups=8,
            num_heads=128,
            head_dim=64,
            state_size=128,
            conv_kernel=4,
            tp_size=4,
            num_spec=1,
        ),
        [(4, 2560), (32, 64, 128)],
    ),
    # One group over tp 2 is replicated: g' = 2, dim = (4096 + 2*2*128) / 2 = 2304; ring of 8.
    (
        "mamba2",
        dict(
            intermediate_size=4096,
            n_groups=1,
            num_heads=64,
            head_dim=64,
            state_size=128,
            conv_kernel=4,
            tp_size=2,
            logical_window=8,
        ),
        [(3, 2304), (32, 64, 128), (32, 8, 64), (32, 8), (1, 8, 128)],
    ),
    # MiniMax-Text-01 lightning attention (64 heads of 96), tp 8.
    ("linear_attention", dict(num_heads=64, head_dim=96, tp_size=8), [(8, 96, 96)]),
    # Qwen3-Next GDN, tp 4, 2 drafts, DS: dim = (2*16*128 + 32*128) / 4 = 2048, width 5.
    (
        "gdn",
        dict(
            num_k_heads=16,
            num_v_heads=32,
            head_k_dim=128,
            head_v_dim=128,
            conv_kernel_size=4,
            tp_size=4,
            num_spec=2,
            conv_layout="DS",
        ),
        [(2048, 5), (8, 128, 128)],
    ),
    # ... with the RecoverSSM records: [H, Q, V] and [H, Q, K + 1], Q = 3.
    (
        "gdn",
        dict(
            num_k_heads=16,
            num_v_heads=32,
            head_k_dim=128,
            head_v_dim=128,
            conv_kernel_size=4,
            tp_size=4,
            num_spec=2,
            recover_ssm=True,
        ),
        [(5, 2048), (8, 128, 128), (8, 3, 128), (8, 3, 129)],
    ),
    # Kimi-Linear KDA, tp 4, 1 draft: dim = (32*128 + 2*32*128) / 4 = 3072; records [H, Q, 2K].
    (
        "kda",
        dict(num_heads=32, head_dim=128, tp_size=4, num_spec=1, recover_ssm=True),
        [(4, 3072), (8, 128, 128), (8, 2, 128), (8, 2, 256)],
    ),
]


@pytest.mark.parametrize("family, kwargs, expected", HAND_CASES)
def test_shapes_by_hand(family, kwargs, expected):
    assert [s.shape for s in layouts.FAMILIES[family](**kwargs).states] == expected


# --- against vLLM's own calculator -------------------------------------------------------------

VLLM_VERSION = vllm_oracle.VERSION
MEMBER = "vllm/model_executor/layers/mamba/mamba_utils.py"


def _mamba_utils_source() -> Path:
    """The path of vLLM 0.33.0's mamba_utils.py, extracted from the wheel that
    tests/support/vllm_oracle.py downloads once into the cache it shares with the conformance
    oracle; skips the test when the wheel cannot be had."""
    try:
        return vllm_oracle.extracted(MEMBER)
    except vllm_oracle.OracleUnavailable as exc:
        pytest.skip(f"cannot get vllm=={VLLM_VERSION}: {exc}")


class _Layout:
    """Stands in for ``vllm.envs``: the conv layout the calculator reads."""

    VLLM_SSM_CONV_STATE_LAYOUT: str | None = None


class _MambaBackendEnum(enum.Enum):
    TRITON = "triton"
    FLASHINFER = "flashinfer"
    CPU = "cpu"


class _Logger(logging.LoggerAdapter):
    """vLLM's logger, with its ``*_once`` methods."""

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.info(msg, *args)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.warning(msg, *args)


def _vllm_divide(numerator: int, denominator: int) -> int:
    # vllm.distributed.utils.divide: assert exact division, then floor-divide.
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


@pytest.fixture(scope="module")
def vllm_mamba_utils():
    torch = pytest.importorskip("torch")
    path = _mamba_utils_source()
    envs = _Layout()

    def module(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    stubs = {
        "vllm": module("vllm"),
        "vllm.envs": envs,
        "vllm.config": module("vllm.config"),
        "vllm.config.cache": module("vllm.config.cache", MambaDType=str),
        "vllm.config.mamba": module("vllm.config.mamba", MambaBackendEnum=_MambaBackendEnum),
        "vllm.config.model": module("vllm.config.model", ModelDType=str),
        "vllm.distributed": module("vllm.distributed", divide=_vllm_divide),
        "vllm.logger": module("vllm.logger", init_logger=lambda name: _Logger(logging.getLogger(name), {})),
        "vllm.utils": module("vllm.utils"),
        "vllm.utils.torch_utils": module(
            "vllm.utils.torch_utils", STR_DTYPE_TO_TORCH_DTYPE={}, get_kv_cache_torch_dtype=lambda *a: torch.float32
        ),
        "vllm.v1": module("vllm.v1"),
        "vllm.v1.attention": module("vllm.v1.attention"),
        "vllm.v1.attention.backends": module("vllm.v1.attention.backends"),
        "vllm.v1.attention.backends.registry": module(
            "vllm.v1.attention.backends.registry", MambaAttentionBackendEnum=enum.Enum
        ),
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)  # type: ignore[arg-type]
    try:
        spec = importlib.util.spec_from_file_location("_vllm_0_33_mamba_utils", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return mod, envs


def test_pinned_names_match_vllm(vllm_mamba_utils):
    mod, _ = vllm_mamba_utils
    calc = mod.MambaStateShapeCalculator
    for family, (method, names) in VLLM_PARAMS.items():
        assert tuple(inspect.signature(getattr(calc, method)).parameters) == names, family
    assert tuple(inspect.signature(calc.append_replayssm_ring).parameters) == VLLM_RING_PARAMS


def _configs(family: str, rng: random.Random) -> list[dict[str, Any]]:
    """Random configs of ``family`` under the package's names, divisible and not."""
    pick = rng.choice
    out = []
    for _ in range(150):
        c: dict[str, Any] = {"tp_size": pick([1, 2, 3, 4, 8])}
        if family != "mamba1":
            c["num_spec"] = pick([0, 1, 3, 7])
        if family == "mamba1":
            c.update(intermediate_size=pick([64, 96, 4096, 5120]), state_size=pick([8, 16]), conv_kernel=pick([2, 4]))
        elif family == "mamba2":
            c.update(
                intermediate_size=pick([1024, 4096, 8192]),
                n_groups=pick([1, 2, 3, 6, 8]),
                num_heads=pick([24, 64, 128]),
                head_dim=pick([32, 64]),
                state_size=pick([64, 128]),
                conv_kernel=pick([2, 4]),
            )
            if rng.random() < 0.5:
                c.update(logical_window=pick([4, 16]), mamba_backend=pick(["triton", "flashinfer", "cpu"]))
        elif family == "short_conv":
            c.update(intermediate_size=pick([96, 1024, 2048]), conv_kernel=pick([2, 3, 4]))
        elif family == "linear_attention":
            c.update(num_heads=pick([6, 8, 64]), head_dim=pick([64, 96]))
        elif family == "gdn":
            c.update(
                num_k_heads=pick([2, 3, 16]),
                num_v_heads=pick([4, 6, 32]),
                head_k_dim=pick([64, 128]),
                head_v_dim=pick([64, 128]),
                conv_kernel_size=pick([2, 4]),
            )
        elif family == "kda":
            c.update(num_heads=pick([6, 8, 32]), head_dim=pick([64, 128]), conv_kernel_size=pick([2, 4]))
            if rng.random() < 0.5:
                c.update(num_k_heads=pick([3, 8, 32]), head_k_dim=pick([64, 128]))
        out.append(c)
    return out


def _stricter_here(family: str, c: dict[str, Any]) -> bool:
    """The configs docs/design.md section 4 lists as rejected here but accepted by vLLM."""
    tp = c["tp_size"]
    if family == "linear_attention":
        return c["num_heads"] % tp != 0  # vLLM floors num_heads // tp_size
    if family == "gdn":
        return c["num_k_heads"] % tp != 0  # vLLM does not shard-check the key heads
    if family == "mamba2":
        # vLLM's calculator pads (or shrinks) n_groups to tp; its Mamba2 layer serves only
        # n_groups % tp == 0 or n_groups == 1, and a transfer re-shards groups sharded or replicated.
        return c["n_groups"] % tp != 0 and tp % c["n_groups"] != 0
    if family == "kda":
        # vLLM does not shard-check the key heads (its KDA layers pass none: num_heads, divisible).
        return c.get("num_k_heads", c["num_heads"]) % tp != 0
    return False


def _vllm_shapes(mod: Any, family: str, c: dict[str, Any]) -> list[tuple[int, ...]]:
    calc = mod.MambaStateShapeCalculator
    method, names = VLLM_PARAMS[family]
    ours = {SHARED_RENAMES.get(n, n): n for n in names}
    kwargs = {vllm: c[mine] for mine, vllm in ours.items() if mine in c}
    shapes = list(getattr(calc, method)(**kwargs))
    if family == "mamba2" and "logical_window" in c:
        shapes = list(
            calc.append_replayssm_ring(
                base_shapes=tuple(shapes),
                n_groups=c["n_groups"],
                tp_world_size=c["tp_size"],
                logical_window=c["logical_window"],
                backend=_MambaBackendEnum(c.get("mamba_backend", "triton")),
                num_speculative_tokens=c.get("num_spec", 0),
            )
        )
    return [tuple(s) for s in shapes]


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
@pytest.mark.parametrize("family", sorted(VLLM_PARAMS))
def test_shapes_match_vllms_calculator(vllm_mamba_utils, family, conv_layout):
    mod, envs = vllm_mamba_utils
    envs.VLLM_SSM_CONV_STATE_LAYOUT = conv_layout
    mod.get_conv_state_layout.cache_clear()
    rng = random.Random(f"{family}-{conv_layout}")
    compared = rejected = 0
    for c in _configs(family, rng):
        mine = dict(c)
        if family != "linear_attention":
            mine["conv_layout"] = conv_layout
        try:
            expected = _vllm_shapes(mod, family, c)
        except (AssertionError, ZeroDivisionError):
            expected = None
        if expected is None or _stricter_here(family, c):
            with pytest.raises(LayoutError):
                layouts.FAMILIES[family](**mine)
            rejected += 1
            continue
        got = [s.shape for s in layouts.FAMILIES[family](**mine).states]
        assert got == expected, (family, c)
        compared += 1
    # The grid exercises both outcomes.
    assert compared >= 30 and rejected >= 1, (compared, rejected)
