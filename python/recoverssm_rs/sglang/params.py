"""The family layout of one tensor-parallel rank of an SGLang mamba pool, from SGLang's cache
parameters (``Mamba2CacheParams`` / ``KimiLinearCacheParams``, read by attribute): what
:meth:`SglangMambaPool.state_pool` needs so that transfers can re-shard between TP sizes."""

from __future__ import annotations

from typing import Any

from .. import layouts
from .._core import Layout

__all__ = ["layout_for"]


def layout_for(cache_params: Any, *, tp_size: int) -> Layout:
    """The layout of one rank of ``tp_size`` for SGLang's ``cache_params`` (the full-model
    parameters its pool was built from, with that ``tp_size``):

    * Kimi-Linear (``shape.num_k_heads``): :func:`layouts.kda`, conv ``SD`` (SGLang's
      ``(K-1, channels)`` slots);
    * a Mamba2-shaped pool with three conv shard groups (Qwen3-Next's GDN: q, k, v):
      :func:`layouts.gdn`, conv ``DS``;
    * otherwise :func:`layouts.mamba2`, conv ``DS``.

    Without speculative columns: SGLang keeps its verify windows apart from the conv state.

    Raises:
        LayoutError: the parameters do not form a valid layout (the core's message names them).
    """
    shape, dtype = cache_params.shape, cache_params.dtype
    common: dict[str, Any] = {"tp_size": tp_size, "dtype": dtype.conv, "ssm_dtype": dtype.temporal}
    if getattr(shape, "num_k_heads", None) is not None:
        return layouts.kda(
            num_heads=shape.num_heads,
            head_dim=shape.head_dim,
            num_k_heads=shape.num_k_heads,
            head_k_dim=shape.head_k_dim,
            conv_kernel_size=shape.conv_kernel,
            conv_layout="SD",
            **common,
        )
    groups = getattr(shape, "conv_shard_groups", None)
    if groups is not None and len(groups) == 3:
        return layouts.gdn(
            num_k_heads=groups[0] // shape.state_size,
            head_k_dim=shape.state_size,
            num_v_heads=shape.num_heads,
            head_v_dim=shape.head_dim,
            conv_kernel_size=shape.conv_kernel,
            conv_layout="DS",
            **common,
        )
    return layouts.mamba2(
        intermediate_size=shape.intermediate_size,
        n_groups=(shape.conv_dim - shape.intermediate_size) // (2 * shape.state_size),
        num_heads=shape.num_heads,
        head_dim=shape.head_dim,
        state_size=shape.state_size,
        conv_kernel=shape.conv_kernel,
        conv_layout="DS",
        **common,
    )
