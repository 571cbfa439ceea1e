"""A test-only oracle: vLLM 0.33.0's Kimi-K3 RecoverSSM commit, run on CPU.

From the cached wheel (see :mod:`support.vllm_oracle`), ``vllm/models/kimi_k3/nvidia/ops/
recoverssm.py`` (``KDARecoverSSMRecords``, ``KDARecoverSSMCommitContext`` and its Triton kernels:
the commit plan, the conv-window compaction and the KDA state fold) and ``vllm/models/kimi_k3/
nvidia/kda_metadata.py`` (``KimiK3KDAMetadata.commit_recoverssm_state`` and the commit metadata
classes) are loaded by path, with stand-ins for the imports they name but the commit does not run
(the attention-backend bases, the platform, the CuTe-DSL commit kernel: GPU only). The Triton
kernels run in Triton's interpreter over CPU tensors. No vLLM code is stored in this repository.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Iterator
from typing import Any

from . import vllm_oracle

RECOVERSSM = ("vllm/models/kimi_k3/nvidia/ops/recoverssm.py", "vllm.models.kimi_k3.nvidia.ops.recoverssm")
METADATA = ("vllm/models/kimi_k3/nvidia/kda_metadata.py", "vllm.models.kimi_k3.nvidia.kda_metadata")
RECOVER_META = ("vllm/v1/attention/backends/recoverssm_metadata.py", "vllm.v1.attention.backends.recoverssm_metadata")


@dataclasses.dataclass
class _GDNAttentionMetadata:
    """Stand-in for vLLM's ``GDNAttentionMetadata``: the field the commit reads."""

    num_spec_decodes: int = 0


class _Conv:
    """Switch for ``is_conv_state_dim_first`` (vLLM's ``VLLM_SSM_CONV_STATE_LAYOUT``)."""

    dim_first = True


_LOADED: types.SimpleNamespace | None = None


def load() -> types.SimpleNamespace:
    """``namespace(ops=..., meta=..., rmeta=..., conv=...)``: vLLM's ``recoverssm`` ops module,
    its ``kda_metadata`` module, ``recoverssm_metadata`` and the conv-layout switch (set
    ``conv.dim_first`` before ``KDARecoverSSMCommitContext.create``), loaded once per process.

    Raises:
        OracleUnavailable: no wheel, or no Triton interpreter.
    """
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    ns = vllm_oracle.load()  # Triton in interpreter mode, the shared stand-ins' environment
    stubs = vllm_oracle._stubs(ns.envs)
    mod = vllm_oracle._module
    stubs["vllm.model_executor.layers.mamba.mamba_utils"] = mod(
        "vllm.model_executor.layers.mamba.mamba_utils", is_conv_state_dim_first=lambda: _Conv.dim_first
    )

    def no_cute(*a: Any, **k: Any) -> None:
        raise AssertionError("the CuTe-DSL commit is GPU only; the oracle runs the Triton backend")

    for name in [
        "vllm.models",
        "vllm.models.kimi_k3",
        "vllm.models.kimi_k3.nvidia",
        "vllm.models.kimi_k3.nvidia.ops",
        "vllm.models.kimi_k3.nvidia.recoverssm",
        "vllm.platforms",
        "vllm.v1.attention.backends.gdn_attn",
        "vllm.v1.attention.backend",
    ]:
        stubs[name] = mod(name)
    stubs["vllm.models.kimi_k3.nvidia.recoverssm.kernels"] = mod(
        "vllm.models.kimi_k3.nvidia.recoverssm.kernels", cute_recoverssm_commit=no_cute
    )
    stubs["vllm.v1.attention.backends.utils"] = mod("vllm.v1.attention.backends.utils", NULL_BLOCK_ID=0)
    stubs["vllm.v1.attention.backend"].AttentionCGSupport = types.SimpleNamespace(ALWAYS="always")  # type: ignore[attr-defined]
    gdn = stubs["vllm.v1.attention.backends.gdn_attn"]
    gdn.GDNAttentionMetadata = _GDNAttentionMetadata  # type: ignore[attr-defined]
    gdn.GDNAttentionMetadataBuilder = type("GDNAttentionMetadataBuilder", (), {})  # type: ignore[attr-defined]
    gdn.GDNAttentionBackend = type("GDNAttentionBackend", (), {})  # type: ignore[attr-defined]
    names = [RECOVER_META, RECOVERSSM, METADATA]
    with vllm_oracle.stubbed(stubs, keep=[n for _, n in names]):
        loaded = {n: vllm_oracle.exec_by_path(n, vllm_oracle.extracted(member)) for member, n in names}
    _LOADED = types.SimpleNamespace(
        ops=loaded[RECOVERSSM[1]], meta=loaded[METADATA[1]], rmeta=loaded[RECOVER_META[1]], conv=_Conv
    )
    return _LOADED


@contextlib.contextmanager
def integer_masks() -> Iterator[None]:
    """While active, Triton's interpreter takes a load's or store's integer mask as ``mask != 0``.

    vLLM's conv-window kernel masks its boundary load and store with ``mask & (boundary_state_idx
    > null_block_id)``, which Triton's semantics type as int32 (a boolean block and a scalar
    comparison); the interpreter's native load and store take boolean masks only ("mask has
    unsupported dtype"). Compiled, a nonzero mask element is a true one; so it is here."""
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask: Any) -> Any:
        if mask.data.dtype == bool:
            return mask
        return interp.TensorHandle(mask.data != 0, interp.tl.int1)

    def masked_load(self: Any, ptrs: Any, mask: Any, other: Any, cache_policy: Any, is_volatile: Any) -> Any:
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    def masked_store(self: Any, ptrs: Any, value: Any, mask: Any, cache_policy: Any) -> Any:
        return store(self, ptrs, value, as_bool(mask), cache_policy)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store  # type: ignore[method-assign]
    try:
        yield
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store  # type: ignore[method-assign]
