"""A test-only oracle for the ``sglang-lru`` checkpoint policy: SGLang 0.5.23's own
``UnifiedRadixCache`` with its Full and Mamba components (default no-extra-buffer mode, page size 1,
LRU), driven request by request over a trace the way its scheduler drives it.

Run as a script in its own process (``python sglang_checkpoint_oracle.py CASES.json``, where the file
holds ``[{"slots": S | null, "requests": [{"prompt": [...], "output": [...]}, ...]}, ...]``), because
loading SGLang's cache modules needs stand-ins for the packages and SGLang subpackages they import
but these code paths never call (kernels, distributed groups, HiCache, storage, metrics, server
configuration): a stand-in in the test process could hide a real package from other tests. The
wheel is the one :mod:`sglang_oracle` caches; its Python files are extracted next to it on first
use. No SGLang code is stored in this repository.

Per request, as the scheduler does (paths inside the wheel's ``sglang/srt``):

* ``mem_cache/common.py`` ``match_kv_cache`` with ``cow_mamba=True`` and the prompt capped at
  ``len - 1`` (``managers/schedule_batch.py`` ``_compute_max_prefix_len``): the tree's match and the
  Mamba component's copy-on-write of the matched state into a slot of the request's own (evicting
  from the Mamba LRU when the pool is full, ``components/mamba.py`` ``finalize_match_result_in_cache``);
* the request locks its matched node (``unified_radix_cache.py`` ``lock``) and gets its row and, on
  a miss, a fresh Mamba slot: ``HybridReqToTokenPool.alloc`` after the eviction
  ``mem_cache/allocation.py`` ``ensure_mamba_capacity`` asks for (restated here: that module
  compiles Triton kernels at import); its KV comes from an unbounded allocator stand-in;
* at the end, ``mem_cache/common.py`` ``release_kv_cache(checkpoint=True)``: the finished request's
  state joins the tree at its computed tokens (prompt + output less the last sampled token).

``slots``: the Mamba pool's size (``null``: more than any trace needs). Prints, per case,
``{"reused": [...]}`` (the tree's ``device_prefix_len`` per request) as a JSON list.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

# Run as a script: tests/ on the path, for the support package (the wheel cache, the stand-ins).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.stand_ins import module_attr  # noqa: E402

# Modules run from the wheel; every other ``sglang`` module is a stand-in. The two packages run their
# ``__init__``; the stand-in packages above them have none.
_PACKAGES = {"sglang.srt.mem_cache.unified_cache", "sglang.srt.mem_cache.unified_cache.components"}
_MODULES = """configs.mamba_utils mem_cache.allocation_sizing mem_cache.allocator.mamba mem_cache.base_prefix_cache
mem_cache.cache_init_params mem_cache.common mem_cache.evict_policy mem_cache.memory_pool mem_cache.radix_cache
mem_cache.unified_radix_cache mem_cache.utils mem_cache.unified_cache.cache_action
mem_cache.unified_cache.component_type mem_cache.unified_cache.components.base
mem_cache.unified_cache.components.full mem_cache.unified_cache.components.mamba
mem_cache.unified_cache.components.swa mem_cache.unified_cache.session_ref_tracker
mem_cache.unified_cache.tree_core_registry mem_cache.unified_cache.unified_tree_core
mem_cache.unified_cache.unified_tree_core_interface""".split()
REAL = {
    **{name: name.replace(".", "/") + "/__init__.py" for name in _PACKAGES},
    **{f"sglang.srt.{m}": "sglang/srt/" + m.replace(".", "/") + ".py" for m in _MODULES},
}
"""Module name -> its file inside the wheel."""


class _Switch:
    def __init__(self, value: Any = None) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class _Envs:
    """``sglang.srt.environ.envs``: every switch unset, the tree core the Python one."""

    def __getattr__(self, name: str) -> _Switch:
        return _Switch("python" if name == "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND" else None)


def _ns(**k: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**k)


def _no(*a: Any, **k: Any) -> bool:
    return False


def _consensus(*a: Any, **k: Any) -> Any:
    return lambda f: f


_NAMED: dict[str, dict[str, Any]] = {
    "sglang.srt.environ": {"envs": _Envs()},
    "sglang.srt.runtime_context": {
        "get_exec": lambda: _ns(mamba=_ns(mamba_max_states_per_path=-1, enable_mamba_extra_buffer_lazy=False)),
        "get_disagg": lambda: _ns(disaggregation_mode="null"),
        "get_observability": lambda: _ns(extra_metric_labels=None),
        "get_parallel": lambda: _ns(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0),
        "get_spec": lambda: _ns(speculative_algorithm=None),
        "get_serving": lambda: _ns(strip_thinking_cache=False),
        "mamba_cache_chunk_size": lambda: 64,
        "mamba_checkpoint_grid": lambda page_size: 64,
    },
    "sglang.srt.utils.rank_consensus_checker": {"rank_consensus": _consensus},
    "sglang.srt.mem_cache.allocator.page_interleave": {"page_interleave_shard_size": lambda allocator: 1},
    "sglang.srt.session.streaming_session": {"is_virtual_node": _no},
    "sglang.srt.layers.attention.dsv4.unified_kv_gate": {"is_unified_kv_triton": _no},
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :data:`REAL` from the files extracted from the wheel, stand-ins for every other
    ``sglang`` module."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not (name == "sglang" or name.startswith("sglang.")):
            return None
        if name in self.files:
            file = self.files[name]
            return importlib.util.spec_from_file_location(
                name, file, submodule_search_locations=[str(file.parent)] if name in _PACKAGES else None
            )
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__dict__.update(_NAMED.get(spec.name, {}))
        m.__getattr__ = module_attr  # type: ignore[method-assign]
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _sglang_oracle() -> types.ModuleType:
    from support import sglang_oracle

    return sglang_oracle


def load() -> types.SimpleNamespace:
    """SGLang's cache modules, loaded from the wheel (its files extracted into the cache once)."""
    wheel = _sglang_oracle()
    # The pool module's stand-ins are the pool oracle's (platform probes, memory saver, side-state
    # pools); this module adds the cache's.
    for name, attrs in wheel._NAMED.items():
        _NAMED[name] = {**attrs, **_NAMED.get(name, {})}
    sys.meta_path.insert(0, _Finder({name: wheel.extracted(member) for name, member in REAL.items()}))
    logging.getLogger("sglang").setLevel(logging.ERROR)
    get = importlib.import_module
    return types.SimpleNamespace(
        cache=get("sglang.srt.mem_cache.unified_radix_cache"),
        base=get("sglang.srt.mem_cache.base_prefix_cache"),
        common=get("sglang.srt.mem_cache.common"),
        pool=get("sglang.srt.mem_cache.memory_pool"),
        params=get("sglang.srt.mem_cache.cache_init_params"),
        configs=get("sglang.srt.configs.mamba_utils"),
        types=get("sglang.srt.mem_cache.unified_cache.component_type"),
    )


class _Kv:
    """The request record fields SGLang's cache and pools read and write (``Req.kv``)."""

    def __init__(self) -> None:
        self.req_pool_idx: Any = None
        self.mamba_pool_idx: Any = None
        self.mamba_ping_pong_track_buffer = None
        self.mamba_cow_src_index = None
        self.mamba_needs_clear = False
        self.mamba_last_track_seqlen = None
        self.mamba_prev_track_seqlen = None
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.kv_allocated_len = 0
        self.kv_committed_len = 0
        self.is_kv_released = False

    holds_kv = property(lambda self: self.req_pool_idx is not None)
    holds_mamba = property(lambda self: self.mamba_pool_idx is not None)

    def get_evicted_seqlen(self, component: Any) -> int:
        return 0

    def swa_dead_lo(self, page_size: int) -> int:
        return 0

    def mark_kv_released(self) -> None:
        self.is_kv_released = True


class _Req:
    """A scheduler request: the fields the cache reads, no sampling, no logprobs."""

    def __init__(self, rid: int, prompt: list[int], output: list[int]) -> None:
        self.rid = str(rid)
        self.origin_input_ids = prompt
        self.output_ids = output
        self.full_untruncated_fill_ids = list(prompt)
        self.extra_key = self.cache_salt = self.priority = self.session_id = None
        self.kv_rotation_base = self.lock = self.last_node = self.finished_len = self.finished_reason = None
        self.skip_radix_cache_insert = False
        self.done = False
        self.kv = _Kv()

    def _compute_max_prefix_len(self, input_len: int) -> int:
        # managers/schedule_batch.py _compute_max_prefix_len without logprobs or dLLM blocks.
        return max(input_len - 1, 0)

    def finished(self) -> bool:
        return self.done

    def refresh_fill_ids(self) -> None:
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids

    def owned_kv_len(self) -> int:
        return self.kv.kv_committed_len


class _KvAllocator:
    """An unbounded token-to-KV allocator (the model bounds checkpoints only)."""

    page_size = 1
    device = "cpu"

    def __init__(self) -> None:
        self.next = 1

    def alloc(self, n: int) -> Any:
        import torch

        out = torch.arange(self.next, self.next + n, dtype=torch.int64)
        self.next += n
        return out

    def free(self, indices: Any) -> None:
        pass

    def available_size(self) -> int:
        return 1 << 40

    full_available_size = available_size

    def mamba_full_cache_donor(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


class _Session:
    """``StreamingSession`` with no streaming request: every ``try_*`` declines."""

    def __init__(self) -> None:
        self.slots: dict[str, Any] = {}

    def try_match_prefix(self, params: Any) -> None:
        return None

    def try_checkpoint(self, req: Any, **k: Any) -> bool:
        return False

    def try_cache_finished_req(self, req: Any) -> bool:
        return False

    def take(self, req: Any) -> None:
        pass


def build(ns: types.SimpleNamespace, slots: int, max_len: int) -> Any:
    """A ``UnifiedRadixCache`` (Full + Mamba, no extra buffer, page 1, LRU) over a
    ``HybridReqToTokenPool`` with ``slots`` Mamba slots."""
    import torch

    C = ns.configs
    shape = C.Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=4, n_groups=1, num_heads=1, head_dim=4, state_size=2, conv_kernel=2
    )
    params = C.Mamba2CacheParams(
        shape=shape, layers=[0], dtype=C.Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
    )
    pool = ns.pool.HybridReqToTokenPool(
        size=2,
        mamba_size=slots,
        mamba_spec_state_size=2,
        max_context_len=max_len,
        device="cpu",
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False,
        speculative_num_draft_tokens=None,
    )
    CT = ns.types.ComponentType
    init = ns.params.CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=_KvAllocator(),
        page_size=1,
        tree_components=(CT.FULL, CT.MAMBA),
        tree_core_backend="python",
    )
    cache = ns.cache.UnifiedRadixCache(init)
    cache.session = _Session()
    return cache


def run(ns: types.SimpleNamespace, trace: list[dict[str, Any]], slots: int | None) -> dict[str, Any]:
    """Replays ``trace`` one request at a time; returns the tokens each request reused."""
    import torch

    max_len = max(len(r["prompt"]) + len(r["output"]) for r in trace) + 2
    cache = build(ns, slots if slots is not None else len(trace) + 2, max_len)
    pool, kv = cache.req_to_token_pool, cache.token_to_kv_pool_allocator
    EvictParams = ns.base.EvictParams
    reused = []
    for i, r in enumerate(trace):
        req = _Req(i, list(r["prompt"]), list(r["output"]))
        ns.common.match_kv_cache(
            req, cache, req.full_untruncated_fill_ids, cow_mamba=True, max_prefix_len=len(req.origin_input_ids) - 1
        )
        reused.append(req.prefix_len)
        req.lock = cache.lock(req.last_node)
        # allocation.py ensure_mamba_capacity, then HybridReqToTokenPool.alloc.
        needed = 0 if req.kv.holds_mamba else 1
        available = pool.mamba_allocator.schedulable_available_size()
        if available < needed:
            cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=needed - available))
        assert pool.alloc([req]) is not None
        # The prefill and the decode: KV for every computed token past the hit.
        computed = len(req.origin_input_ids) + max(len(req.output_ids), 1) - 1
        prefix = cache.prefix_device_indices(req) if req.prefix_len else kv.alloc(0)
        row = req.kv.req_pool_idx
        pool.write((row, slice(0, req.prefix_len)), prefix.to(torch.int32))
        pool.write((row, slice(req.prefix_len, computed)), kv.alloc(computed - req.prefix_len).to(torch.int32))
        req.kv.kv_allocated_len = req.kv.kv_committed_len = computed
        req.done = True
        ns.common.release_kv_cache(req, cache, checkpoint=True)
    return {"reused": reused}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    loaded = load()
    print(json.dumps([run(loaded, c["requests"], c.get("slots")) for c in cases]))
