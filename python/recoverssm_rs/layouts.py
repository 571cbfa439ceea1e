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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ._core import (
    Layout,
    gdn_layout,
    kda_layout,
    linear_attention_layout,
    mamba1_layout,
    mamba2_layout,
    short_conv_layout,
)

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

mamba1 = mamba1_layout
mamba2 = mamba2_layout
short_conv = short_conv_layout
linear_attention = linear_attention_layout
gdn = gdn_layout
kda = kda_layout

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
        """The layout for one rank; keyword arguments override the preset's parameters."""
        kwargs = {**self.params, **self.defaults, **overrides}
        return FAMILIES[self.family](**kwargs)

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
        params=dict(
            num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel_size=4
        ),
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
    """The layout of preset ``name`` for one rank (``tp_size``, ``num_spec``, ... as overrides)."""
    try:
        p = PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
    return p.layout(**overrides)
