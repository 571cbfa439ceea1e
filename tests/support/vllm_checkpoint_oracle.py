"""A test-only oracle for the ``vllm`` checkpoint policy: vLLM 0.33.0's own prefix-cache functions
for a hybrid model (one full-attention group, one Mamba group in align mode), composed request by
request over a trace.

Run as a script in its own process (``python vllm_checkpoint_oracle.py CASES.json``, where the file
holds ``[{"block": B, "requests": [{"prompt": [...], "output": [...]}, ...]}, ...]``), because
loading vLLM's ``v1/core`` modules needs stand-ins for third-party packages and vLLM subpackages
they import but these functions never call (tokenizers, configs, distributed, servers): a stand-in
in the test process could hide a real package from other tests. The wheel is the one
:mod:`vllm_oracle` caches; its Python files are extracted next to it on first use. No vLLM code is
stored in this repository.

Per request it calls, from ``vllm/v1/core/single_type_kv_cache_manager.py``:
``FullAttentionManager.find_longest_cache_hit`` (the attention hit), ``MambaManager.find_longest_cache_hit``
(the state hit, right to left, a state block ending exactly on the hit) and
``MambaManager.reachable_block_mask`` with ``prefix_cache_retention_interval=0`` (which state blocks
the request keeps: the replay boundary ``len - 1`` and the junction, the attention hit when it runs
past the state hit, as ``kv_cache_manager.py:323`` computes it). Block hashes are the prefixes
themselves (vLLM chains hashes, so a hash names a prefix). What it does not run: the scheduler's
chunking (the prefill stopping at the junction, ``scheduler.py:546``) and the block pool's eviction;
the oracle is for unlimited pools.

Prints, per case, ``{"reused": [...], "written": [[positions], ...]}`` (a JSON list).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

# Run as a script: tests/ on the path, for the support package (the wheel cache, the stand-ins).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.stand_ins import module_attr  # noqa: E402

THIRD_PARTY = (
    "psutil zmq msgspec cbor2 transformers huggingface_hub safetensors aiohttp openai_harmony openai "
    "pybase64 cachetools uvloop cpuinfo prometheus_client xgrammar fastapi"
).split()
VLLM_STANDINS = (
    "vllm.config vllm.distributed vllm.multimodal vllm.v1.hisparse vllm.v1.metrics vllm.platforms "
    "vllm.model_executor vllm.sampling_params vllm.pooling_params vllm.lora vllm.v1.structured_output "
    "vllm.parser vllm.entrypoints vllm.renderers vllm.inputs vllm.outputs vllm.tokenizers vllm.reasoning "
    "vllm.tool_parsers"
).split()


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in THIRD_PARTY or any(name == p or name.startswith(p + ".") for p in VLLM_STANDINS):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = module_attr  # type: ignore[method-assign]
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _python_tree() -> Path:
    """vLLM's Python files, extracted once next to the cached wheel."""
    from support import vllm_oracle

    root = vllm_oracle.cache_dir() / "extracted-py"
    done = root / ".complete"
    if not done.is_file():
        with zipfile.ZipFile(vllm_oracle.wheel()) as z:
            for member in z.namelist():
                if member.startswith("vllm/") and member.endswith(".py"):
                    z.extract(member, root)
        done.write_text("ok")
    return root


def load() -> Any:
    """vLLM's ``single_type_kv_cache_manager`` and ``kv_cache_interface`` modules."""
    sys.path.insert(0, str(_python_tree()))
    sys.meta_path.insert(0, _StandIns())
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm.v1.core.single_type_kv_cache_manager as stm
    import vllm.v1.kv_cache_interface as kvi

    return stm, kvi


class _Pool:
    """What the hit searches read of a block pool: the hash block and ``get_cached_block``."""

    def __init__(self, block: int, cached: set[tuple[int, ...]]) -> None:
        self.hash_block_size = block
        self.cached = cached
        self.null_block = object()

    def get_cached_block(self, block_hash: tuple[int, ...], group_ids: list[int]) -> list[object] | None:
        return [object() for _ in group_ids] if block_hash in self.cached else None


def run(stm: Any, kvi: Any, trace: list[dict[str, Any]], block: int) -> dict[str, Any]:
    import torch

    attn_spec = kvi.FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float16)
    mamba_spec = kvi.MambaSpec(block_size=block, shapes=((4, 8),), dtypes=(torch.float32,), mamba_cache_mode="align")
    attention: set[tuple[int, ...]] = set()
    states: set[tuple[int, ...]] = set()
    reused: list[int] = []
    written: list[list[int]] = []
    for r in trace:
        prompt, output = r["prompt"], r["output"]
        n = len(prompt)
        hashes = [tuple(prompt[: (i + 1) * block]) for i in range(n // block)]
        _, attn_hit = stm.FullAttentionManager.find_longest_cache_hit(
            hashes, n - 1, [0], _Pool(block, attention), attn_spec, False, block
        )
        _, hit = stm.MambaManager.find_longest_cache_hit(
            hashes, attn_hit, [1], _Pool(block, states), mamba_spec, False, block
        )
        junction = attn_hit if attn_hit > hit else 0
        seq = (prompt + output)[: n + max(len(output), 1) - 1]
        full = len(seq) // block
        mask = stm.MambaManager.reachable_block_mask(
            start_block=0,
            end_block=full,
            alignment_tokens=block,
            kv_cache_spec=mamba_spec,
            use_eagle=False,
            retention_interval=0,
            reachable_boundaries=[n - 1, *([junction] if junction else [])],
        )
        new = []
        for i, keep in enumerate(mask or []):
            key = tuple(seq[: (i + 1) * block])
            if keep and (i + 1) * block > hit and key not in states:
                states.add(key)
                new.append((i + 1) * block)
        attention.update(tuple(seq[: (i + 1) * block]) for i in range(full))
        reused.append(hit)
        written.append(new)
    return {"reused": reused, "written": written}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    modules = load()
    print(json.dumps([run(*modules, c["requests"], c["block"]) for c in cases]))
