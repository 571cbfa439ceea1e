"""The family layout of one tensor-parallel rank of an SGLang mamba pool, from SGLang's cache
parameters (``Mamba2CacheParams`` / ``KimiLinearCacheParams``, read by attribute): what
:meth:`SglangMambaPool.state_pool` needs so that transfers can re-shard between TP sizes."""

from __future__ import annotations

from typing import Any

from .. import _core
from .._core import Layout
from ..errors import LayoutError, _reading

__all__ = ["layout_for"]

#: The fields of SGLang's cache shape the core reads (``None`` where a shape has none).
_SHAPE = (
    *("num_heads", "head_dim", "conv_kernel", "state_size", "intermediate_size", "conv_dim"),
    *("num_k_heads", "head_k_dim", "conv_shard_groups"),
)


def layout_for(cache_params: Any, *, tp_size: int) -> Layout:
    """The layout of one rank of ``tp_size`` for SGLang's ``cache_params`` (the full-model
    parameters its pool was built from, with that ``tp_size``), chosen by the core
    (``_core.sglang_layout``): Kimi-Linear (``shape.num_k_heads``) is :func:`layouts.kda
    <recoverssm_rs.layouts.kda>` with ``SD`` conv slots; a pool with three conv shard groups
    (Qwen3-Next's GDN: q, k, v) :func:`layouts.gdn <recoverssm_rs.layouts.gdn>` and any other
    :func:`layouts.mamba2 <recoverssm_rs.layouts.mamba2>`, both ``DS``. Without speculative
    columns: SGLang keeps its verify windows apart from the conv state.

    Raises:
        LayoutError: the parameters do not form a valid layout (the core's message names them).
    """
    with _reading("cache_params (SGLang's cache parameters)", LayoutError):
        shape, dtype = cache_params.shape, cache_params.dtype
        fields: dict[str, Any] = {k: getattr(shape, k, None) for k in _SHAPE}
        return _core.sglang_layout(tp_size=tp_size, dtype=dtype.conv, ssm_dtype=dtype.temporal, **fields)
