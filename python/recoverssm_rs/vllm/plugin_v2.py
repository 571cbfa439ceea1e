"""The vLLM plugin's V2 part: vLLM's GPU-resident runner (``vllm/v1/worker/gpu/``) served by
:class:`~recoverssm_rs.vllm.ModelStateV2`.

vLLM's V2 runner builds its model state with ``init_model_state`` -> ``resolve_model_state_cls``
(``vllm/v1/worker/gpu/model_states/__init__.py``), which imports ``MambaHybridModelState`` from
``vllm.v1.worker.gpu.model_states.mamba_hybrid`` at every call. :func:`install_v2` replaces that
module attribute with a subclass of vLLM's class: each model state it builds makes a
:class:`ModelStateV2` over the same KV-cache config, forward context, copy functions and per-slot
block tables in ``initialize_kv_cache``, points vLLM's ``num_accepted_tokens_gpu`` and
``_mamba_state_idx_gpu`` at the adapter's buffers (the model's kernels and vLLM's own code read
them there), and serves ``preprocess_state`` / ``postprocess_state`` with one launch each.

:func:`watch_v2` installs it when vLLM imports the module (an import hook: a V1-only process never
imports the V2 runner). Where it cannot serve (not align mode, RecoverSSM's commit on,
a layout or device the adapter refuses, a half-step it rejects), vLLM's own methods serve: the
reason is logged once and every such model state / half-step counts as a fallback.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import inspect
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..errors import RecoverSSMError

MODULE_V2 = "vllm.v1.worker.gpu.model_states.mamba_hybrid"

#: The parameters of the methods the subclass overrides, as vLLM 0.32 and 0.33 declare them.
PARAMS_V2: dict[str, tuple[str, ...]] = {
    "initialize_kv_cache": ("self", "kv_cache_config", "block_tables"),
    "add_request": ("self", "req_index", "new_req_data"),
    "preprocess_state": ("self", "input_batch", "block_tables", "kv_cache_config", "num_computed_tokens"),
    "postprocess_state": ("self", "idx_mapping", "num_sampled", "num_computed_tokens"),
}


def _adapter_context(forward_context: Any) -> Any:
    """The forward context the adapter is built over (vLLM's own; tests bind host tensors as
    device ones here)."""
    return forward_context


def _plugin() -> Any:
    from . import plugin

    return plugin


def _served_class(base: type) -> type:
    """A subclass of vLLM's ``MambaHybridModelState`` whose align-mode step is the package's."""

    class RecoverSSMMambaHybridModelState(base):  # type: ignore[misc]
        __doc__ = f"vLLM's ``{base.__name__}`` with its align-mode step served by recoverssm_rs."
        _recoverssm_served = True
        num_accepted_tokens_gpu: Any
        _mamba_state_idx_gpu: Any

        @property
        def _rs(self) -> Any:
            """The adapter, on vLLM's align context: gone with it (vLLM drops it to free its profiling
            KV cache, which the adapter binds, before it allocates the real one)."""
            return getattr(getattr(self, "_mamba_ctx", None), "_recoverssm_rs", None)

        @_rs.setter
        def _rs(self, rs: Any) -> None:
            # Held nowhere when the context is missing or takes no attribute: _rs_build reports it.
            with contextlib.suppress(AttributeError, TypeError):
                object.__setattr__(self._mamba_ctx, "_recoverssm_rs", rs)

        def initialize_kv_cache(self, kv_cache_config: Any, block_tables: Any) -> None:
            self._rs = None  # an earlier KV cache's adapter (vLLM's profiling one) never serves this one
            super().initialize_kv_cache(kv_cache_config, block_tables)
            reason = self._rs_build(kv_cache_config, block_tables)
            if reason is not None:
                _plugin().record_fallback(reason)

        def _rs_build(self, kv_cache_config: Any, block_tables: Any) -> str | None:
            from .model_state import ModelStateV2

            if not getattr(self, "_align_mode", False):
                return "V2 runner: mamba_cache_mode is not 'align' (nothing of the package's to serve)"
            if getattr(self, "recoverssm", None) is not None:
                return "V2 runner: RecoverSSM (use_kda_recoverssm) commits in vLLM's post-process"
            try:
                group_ids, _ = self._get_mamba_group_info(kv_cache_config)
                funcs = self._mamba_state_copy_funcs
                rs = ModelStateV2.from_runner(
                    kv_cache_config,
                    _adapter_context(self.vllm_config.compilation_config.static_forward_context),
                    funcs,
                    max_num_reqs=self.max_num_reqs,
                    conv_layout=_plugin().conv_layout_of(funcs),
                    device=self.device,
                )
                tables = {int(g): block_tables.block_tables[g].gpu for g in group_ids}
            except (RecoverSSMError, AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
                return f"V2 runner: the adapter cannot serve this model state: {type(exc).__name__}: {exc}"
            if not rs.placement.is_cuda:
                return f"V2 runner: the states are on {rs.placement.name}; the adapter's kernel runs on CUDA"
            self._rs = rs
            if self._rs is not rs:
                return "V2 runner: no align context (_mamba_ctx) that can hold the adapter"
            # vLLM's model kernels and vLLM's own methods read these two: the adapter's buffers.
            rs.num_accepted.copy_(self.num_accepted_tokens_gpu)
            rs.state_idx.copy_(self._mamba_state_idx_gpu)
            self.num_accepted_tokens_gpu = rs.num_accepted
            self._mamba_state_idx_gpu = rs.state_idx
            self._rs_tables = tables
            return None

        def _rs_give_up(self, exc: Exception) -> None:
            self._rs = None
            _plugin().record_fallback(f"V2 runner: the adapter rejected a half-step (nothing changed): {exc}")

        def add_request(self, req_index: int, new_req_data: Any) -> None:
            super().add_request(req_index, new_req_data)  # the count and column, in the adapter's buffers

        def preprocess_state(
            self, input_batch: Any, block_tables: Any, kv_cache_config: Any, num_computed_tokens: Any
        ) -> None:
            rs = self._rs
            if rs is not None:
                n = int(input_batch.num_reqs)
                if n == 0:
                    return
                try:
                    rs.preprocess_state(
                        input_batch.idx_mapping[:n], num_computed_tokens, input_batch.query_start_loc, self._rs_tables
                    )
                    _plugin().record_served("pre_copies")
                    return
                except RecoverSSMError as exc:
                    self._rs_give_up(exc)
            elif getattr(self, "_align_mode", False):
                _plugin().record_fallback("V2 runner: a model state the adapter does not serve")
            super().preprocess_state(input_batch, block_tables, kv_cache_config, num_computed_tokens)

        def postprocess_state(self, idx_mapping: Any, num_sampled: Any, num_computed_tokens: Any = None) -> None:
            rs = self._rs
            if rs is not None:
                try:
                    rs.postprocess_state(idx_mapping, num_sampled, num_computed_tokens, self._rs_tables)
                    _plugin().record_served("post_processes")
                    return
                except RecoverSSMError as exc:
                    self._rs_give_up(exc)
            elif getattr(self, "_align_mode", False):
                _plugin().record_fallback("V2 runner: a model state the adapter does not serve")
            super().postprocess_state(idx_mapping, num_sampled, num_computed_tokens)

    RecoverSSMMambaHybridModelState.__qualname__ = RecoverSSMMambaHybridModelState.__name__
    return RecoverSSMMambaHybridModelState


def _signature_of(cls: type, name: str) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(getattr(cls, name)).parameters)
    except (AttributeError, TypeError, ValueError):
        return None


def install_v2(module: ModuleType, version: str) -> bool:
    """Replaces ``module.MambaHybridModelState`` (vLLM's ``mamba_hybrid`` module, or a module with
    its class) with the served subclass when its methods have vLLM's signatures; returns whether it
    did (a fallback is counted and logged otherwise). Installing twice does nothing more."""
    plugin = _plugin()
    base = getattr(module, "MambaHybridModelState", None)
    if base is None:
        plugin.record_fallback(f"{module.__name__}.MambaHybridModelState is missing (vLLM {version})")
        return False
    if getattr(base, "_recoverssm_served", False):
        return True
    wrong = [n for n, p in PARAMS_V2.items() if _signature_of(base, n) != p]
    if wrong:
        plugin.record_fallback(
            f"V2 runner: MambaHybridModelState.{', '.join(wrong)} has another signature (vLLM {version})"
        )
        return False
    module.MambaHybridModelState = _served_class(base)  # type: ignore[attr-defined]
    name = f"{module.__name__}.MambaHybridModelState"
    plugin.record_replaced(name)
    plugin.log.info("recoverssm_rs serves vLLM %s's V2 runner: replaced %s", version, name)
    return True


class _Watch(importlib.abc.MetaPathFinder):
    """Installs :func:`install_v2` on vLLM's ``mamba_hybrid`` module right after it executes."""

    def __init__(self, version: str) -> None:
        self.version = version

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != MODULE_V2:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader, version = spec.loader, self.version

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                install_v2(module, version)

        spec.loader = _Loader()
        return spec


def watch_v2(version: str) -> None:
    """Serves vLLM's V2 runner in this process: now when its ``mamba_hybrid`` module is loaded,
    else when vLLM imports it."""
    loaded = sys.modules.get(MODULE_V2)
    if loaded is not None:
        install_v2(loaded, version)
    elif not any(isinstance(f, _Watch) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watch(version))
