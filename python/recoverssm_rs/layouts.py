"""Layout calculators for the recurrent-state families engines serve, and model presets.

Every calculator returns a validated :class:`~recoverssm_rs.Layout` for one tensor-parallel rank.
The shape formulas and their checks (divisibility by ``tp_size``, conv widths, ...) are applied by the
compiled core. The model parameters carry the names of vLLM 0.33's ``MambaStateShapeCalculator``
(``conv_kernel`` for Mamba1, Mamba2 and short conv, ``conv_kernel_size`` for GDN and KDA, as there);
the shared settings are ``tp_size`` (vLLM's ``tp_world_size``), ``num_spec`` (draft tokens per step),
``conv_layout`` (``"SD"`` = ``(width, dim)``, ``"DS"`` = ``(dim, width)``), ``dtype`` (conv windows,
verify-record keys) and ``ssm_dtype`` (temporal / recurrent states). docs/design.md section 4 has the
formulas and where these calculators are stricter than vLLM's.

====================  =======================================================================
calculator            states (per rank)
====================  =======================================================================
``mamba1``            conv ``dim=intermediate_size/tp, width=conv_kernel-1``;
                      temporal ``(intermediate_size/tp, state_size)``
``mamba2``            conv ``dim=(intermediate_size+2 g' state_size)/tp, width=conv_kernel-1+nspec``;
                      temporal ``(num_heads/tp, head_dim, state_size)``; ``logical_window=W``
                      adds three ReplaySSM rings as workspace (ring ``W``, or ``W+1+nspec`` with
                      ``mamba_backend="flashinfer"``)
``short_conv``        conv ``dim=intermediate_size/tp, width=conv_kernel-1+nspec``
``linear_attention``  temporal ``(num_heads/tp, head_dim, head_dim)``
``gdn``               conv ``dim=(2 num_k_heads head_k_dim + num_v_heads head_v_dim)/tp``;
                      temporal ``(num_v_heads/tp, head_v_dim, head_k_dim)``; ``recover_ssm=True``
                      adds the verify records ``[H,Q,V]`` fp32, ``[H,Q,K+1]``
``kda``               conv ``dim=(num_heads head_dim + 2 num_k_heads head_k_dim)/tp``;
                      recurrent ``(num_heads/tp, head_dim, head_dim)`` fp32; ``recover_ssm=True``
                      adds the verify records ``[H,Q,V]`` fp32, ``[H,Q,2K]``
====================  =======================================================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from . import _core
from ._core import Layout
from .errors import LayoutError

__all__ = [
    "FAMILIES",
    "PRESETS",
    "Preset",
    "gdn",
    "kda",
    "linear_attention",
    "mamba1",
    "mamba2",
    "preset",
    "short_conv",
]

Dtype = Any
"""A dtype name (``"bfloat16"``, ``"fp32"``, ...) or a torch / numpy dtype; ``None``: the family's default."""

# Each calculator passes its arguments, by name, to the core's calculator of the same family, which
# checks every value (the message names the parameter) and applies the shape formulas.


def mamba1(
    *,
    intermediate_size: int,
    state_size: int,
    conv_kernel: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: str = "SD",
    dtype: Dtype = None,
    ssm_dtype: Dtype = None,
) -> Layout:
    """Mamba1: conv window + temporal state."""
    return _core.mamba1_layout(**locals())


def mamba2(
    *,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: str = "SD",
    dtype: Dtype = None,
    ssm_dtype: Dtype = None,
    logical_window: int | None = None,
    mamba_backend: str = "triton",
) -> Layout:
    """Mamba2: conv window + temporal state (+ the three ReplaySSM rings as workspace)."""
    return _core.mamba2_layout(**locals())


def short_conv(
    *,
    intermediate_size: int,
    conv_kernel: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: str = "SD",
    dtype: Dtype = None,
) -> Layout:
    """Short conv: one conv window."""
    return _core.short_conv_layout(**locals())


def linear_attention(
    *, num_heads: int, head_dim: int, tp_size: int = 1, num_spec: int = 0, ssm_dtype: Dtype = None
) -> Layout:
    """Linear attention: one temporal state."""
    return _core.linear_attention_layout(conv_layout="SD", **locals())


def gdn(
    *,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    conv_kernel_size: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: str = "SD",
    dtype: Dtype = None,
    ssm_dtype: Dtype = None,
    recover_ssm: bool = False,
) -> Layout:
    """Gated DeltaNet: conv window + temporal state (+ RecoverSSM verify records)."""
    return _core.gdn_layout(**locals())


def kda(
    *,
    num_heads: int,
    head_dim: int,
    num_k_heads: int | None = None,
    head_k_dim: int | None = None,
    conv_kernel_size: int = 4,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: str = "SD",
    dtype: Dtype = None,
    ssm_dtype: Dtype = None,
    recover_ssm: bool = False,
) -> Layout:
    """Kimi Delta Attention: conv window + recurrent state (+ RecoverSSM verify records)."""
    return _core.kda_layout(**locals())


#: Calculator by family name.
FAMILIES: Mapping[str, Callable[..., Layout]] = MappingProxyType(
    {
        "mamba1": mamba1,
        "mamba2": mamba2,
        "short_conv": short_conv,
        "linear_attention": linear_attention,
        "gdn": gdn,
        "kda": kda,
    }
)


@dataclass(frozen=True)
class Preset:
    """A real model's recurrent-layer configuration, from its public model config."""

    name: str
    model: str
    family: str
    params: Mapping[str, Any]
    num_layers: int
    """Number of recurrent layers of this family in the model."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Defaults for ``tp_size`` / ``num_spec`` / ``conv_layout`` / dtypes, overridable."""
    note: str = ""

    def layout(self, **overrides: Any) -> Layout:
        """The layout for one rank; keyword arguments override the preset's parameters.

        Raises:
            LayoutError: an override that is not a parameter of the family's calculator (the
                message names it and lists the calculator's parameters), or values the calculator
                refuses.
        """
        calculator = FAMILIES[self.family]
        # The calculator's signature is the one list of its parameters; a name outside it is
        # reported as the package's error rather than as Python's TypeError from the call.
        known = inspect.signature(calculator).parameters
        unknown = [k for k in overrides if k not in known]
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            raise LayoutError(
                f"preset {self.name!r}: unknown override{'s' if len(unknown) > 1 else ''} {names}; "
                f"the {self.family} calculator takes: {', '.join(known)}"
            )
        return calculator(**{**self.params, **self.defaults, **overrides})

    def __repr__(self) -> str:
        return f"Preset({self.name!r}, model={self.model!r}, family={self.family!r})"


def _presets(*items: Preset) -> Mapping[str, Preset]:
    return MappingProxyType({p.name: p for p in items})


#: Presets by name.
PRESETS: Mapping[str, Preset] = _presets(
    Preset(
        name="qwen3-next-80b-a3b",
        model="Qwen/Qwen3-Next-80B-A3B-Instruct",
        family="gdn",
        params=dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel_size=4),
        num_layers=36,
        defaults=dict(dtype="bfloat16", ssm_dtype="bfloat16", conv_layout="SD"),
        note="48 layers, full attention every 4th: 36 Gated DeltaNet layers",
    ),
    Preset(
        name="kimi-linear-48b-a3b",
        model="moonshotai/Kimi-Linear-48B-A3B-Instruct",
        family="kda",
        params=dict(num_heads=32, head_dim=128, conv_kernel_size=4),
        num_layers=20,
        defaults=dict(dtype="bfloat16", ssm_dtype="float32", conv_layout="SD"),
        note="27 layers: 20 Kimi Delta Attention layers, 7 MLA layers",
    ),
    Preset(
        name="kimi-k3-like-recoverssm",
        model="Kimi-K3-like (KDA with RecoverSSM, DSpark drafts)",
        family="kda",
        params=dict(num_heads=32, head_dim=128, conv_kernel_size=4, recover_ssm=True),
        num_layers=48,
        defaults=dict(dtype="bfloat16", ssm_dtype="float32", conv_layout="DS", num_spec=7),
        note=(
            "KDA heads as Kimi-Linear (32 x 128, recurrent 32 x 128 x 128 fp32), 48 recurrent "
            "layers, 7 draft tokens; RecoverSSM appends the two verify-record workspaces"
        ),
    ),
    Preset(
        name="nemotron-h-8b",
        model="nvidia/Nemotron-H-8B-Base-8K",
        family="mamba2",
        params=dict(
            intermediate_size=8192,
            n_groups=8,
            num_heads=128,
            head_dim=64,
            state_size=128,
            conv_kernel=4,
        ),
        num_layers=24,
        defaults=dict(dtype="bfloat16", ssm_dtype="bfloat16", conv_layout="SD"),
        note="52 layers: 24 Mamba2, 24 MLP, 4 attention",
    ),
)


def preset(name: str, **overrides: Any) -> Layout:
    """The layout of preset ``name`` for one rank (``tp_size``, ``num_spec``, ... as overrides).

    Raises:
        LayoutError: an unknown preset (the message lists the known ones), an override that is not
            a parameter of the family's calculator (the message names it and lists the
            parameters), or values the calculator refuses.
    """
    p = PRESETS.get(name) if isinstance(name, str) else None
    if p is None:
        raise LayoutError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return p.layout(**overrides)
