"""Type stubs for the compiled core, ``recoverssm_rs._core`` (hand-kept: update with the bindings)."""

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, final

_T = TypeVar("_T")

__version__: str
__all__ = [
    "BackendUnavailableError",
    "BindingError",
    "BoundTensors",
    "CheckpointCache",
    "CheckpointPlan",
    "CommitLaunch",
    "CommitPlanner",
    "CopyPlan",
    "ErrorWord",
    "FusedCopy",
    "KernelLaunch",
    "KimiK3CommitPlanner",
    "Layout",
    "LayoutError",
    "CacheCounters",
    "HostCacheIndex",
    "LayoutFingerprint",
    "PeerInfo",
    "PlanError",
    "Planner",
    "RawBuffer",
    "RecoverSSMError",
    "StateSpec",
    "TransferPlan",
    "VllmSlots",
    "VllmSlotStep",
    "__version__",
    "_validate_copy_funcs",
    "align_post_process",
    "align_pre_copy",
    "check_cache_sizes",
    "check_checkpoint_trace",
    "check_vllm_step",
    "check_commit_counts",
    "block_list",
    "check_pool",
    "check_saved_states",
    "encode_saved_states",
    "guarded_transfer",
    "guarded_write",
    "read_saved_file",
    "remove_file",
    "restore_sources",
    "source_pools",
    "write_file",
    "check_sources",
    "endpoint_args",
    "pull_args",
    "transfer_plan_arg",
    "check_device_tables",
    "check_index",
    "commit_grid",
    "copy_func_kind",
    "commit_meta_table",
    "copy_tiles_launch",
    "gdn_layout",
    "kda_layout",
    "kernel_abi",
    "linear_attention_layout",
    "mamba1_layout",
    "mamba2_layout",
    "pack_launch",
    "plan_transfer",
    "sglang_check_pool",
    "sglang_commit_selection",
    "sglang_host_copies",
    "sglang_ids",
    "sglang_slot_launch",
    "sglang_slot_table",
    "recover_geometry",
    "short_conv_layout",
    "simulate_checkpoints",
    "state_chunks",
    "vllm_check_prev_rows",
    "vllm_device_post_process",
    "vllm_device_pre_copy",
    "vllm_post_process",
    "vllm_pre_copy",
    "vllm_step_groups",
]

_Role = Literal["persistent", "workspace"]
_CopyKindName = Literal["conv", "temporal"]
_ConvLayoutName = Literal["SD", "DS"]

@final
class StateSpec:
    """One state tensor of a layer (per block if persistent, per request if workspace)."""

    def __new__(
        cls,
        name: str,
        shape: Sequence[int],
        dtype: Any,
        role: _Role = "persistent",
        copy: _CopyKindName | None = None,
        conv_layout: _ConvLayoutName | None = None,
    ) -> StateSpec: ...
    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def role(self) -> _Role: ...
    @property
    def copy(self) -> _CopyKindName | None: ...
    @property
    def conv_layout(self) -> _ConvLayoutName | None: ...
    @property
    def nbytes(self) -> int | None: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class Layout:
    """A validated per-layer layout: persistent states first, workspace after."""

    def __new__(cls, backend: str, states: Sequence[StateSpec], num_spec: int | None = None) -> Layout: ...
    @property
    def backend(self) -> str: ...
    @property
    def states(self) -> tuple[StateSpec, ...]: ...
    @property
    def persistent(self) -> tuple[StateSpec, ...]: ...
    @property
    def workspace(self) -> tuple[StateSpec, ...]: ...
    @property
    def num_spec(self) -> int: ...
    @property
    def copyable_prefix_len(self) -> int: ...
    @property
    def persistent_bytes_per_block(self) -> int: ...
    @property
    def workspace_bytes_per_request(self) -> int: ...
    def state(self, name: str) -> StateSpec: ...
    def recover_geometry(self) -> dict[str, Any]: ...
    def to_dict(self) -> dict[str, Any]: ...
    def __len__(self) -> int: ...

def copy_func_kind(name: str) -> Literal["conv", "temporal"]:
    """The copy kind a copy function's name or kind names; ``LayoutError`` for any other name."""

def _validate_copy_funcs(
    groups: Sequence[tuple[str, Sequence[Sequence[int]], Sequence[str] | None, int | None, int | None, str | None]],
    copy_funcs: Sequence[tuple[str, Sequence[str]]],
) -> dict[str, int]: ...

# The family calculators take keyword arguments only (recoverssm_rs.layouts has their typed signatures).
def mamba1_layout(**kwargs: Any) -> Layout: ...
def mamba2_layout(**kwargs: Any) -> Layout: ...
def short_conv_layout(**kwargs: Any) -> Layout: ...
def linear_attention_layout(**kwargs: Any) -> Layout: ...
def gdn_layout(**kwargs: Any) -> Layout: ...
def kda_layout(**kwargs: Any) -> Layout: ...

@final
class RawBuffer:
    """Read-only bytes of plan records (supports the buffer protocol; view with numpy)."""

    def __len__(self) -> int: ...

@final
class CopyPlan:
    """One step's copy plan over every group (see :class:`recoverssm_rs.planner.CopyPlan`)."""

    def segments(self) -> RawBuffer: ...
    def rows(self) -> RawBuffer: ...
    def wave_starts(self) -> RawBuffer: ...
    def tiles(self, tile_bytes: int = ...) -> tuple[RawBuffer, RawBuffer]: ...
    @property
    def num_waves(self) -> int: ...
    @property
    def num_segments(self) -> int: ...
    @property
    def num_copies(self) -> int: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def group_stats(self) -> list[tuple[int, int, int, int]]: ...
    @property
    def planner(self) -> Planner: ...
    def execute_host(self) -> None: ...
    def __len__(self) -> int: ...

@final
class Planner:
    """The core planner over one or more groups, bound to their tensors (see
    :class:`recoverssm_rs.planner.Planner`)."""

    def __new__(
        cls,
        groups: Sequence[tuple[Layout, Sequence[Sequence[Any]]]],
        *,
        block_size: int | None = None,
        persistent_only: bool = False,
    ) -> Planner: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def block_size(self) -> int | None: ...
    @property
    def num_spec(self) -> int: ...
    @property
    def layouts(self) -> list[Layout]: ...
    def group_sizes(self) -> list[tuple[int, int]]: ...
    @property
    def states(self) -> tuple[tuple[tuple[Any, ...], ...], ...]: ...
    # Keyword arguments: tables, src_col, dst_col, num_accepted, semantics.
    def plan(self, **kwargs: Any) -> CopyPlan: ...
    # Keyword arguments: src_blocks, dst_blocks.
    def plan_copy(self, **kwargs: Any) -> CopyPlan: ...
    def publish(self, blocks: Any, *, group: int = 0) -> None: ...
    def retract(self, blocks: Any, *, group: int = 0) -> None: ...
    def published(self, group: int = 0) -> list[int]: ...
    def holders(self, block: int, *, group: int = 0) -> int: ...
    def state_meta(self) -> RawBuffer: ...
    def check(self) -> None: ...
    def mark_written(self) -> None: ...
    def guarded(self, write: Callable[[], Any]) -> Any:
        """One guarded write: the guard checked, ``write()`` run, the write recorded."""
    def bind_device(self, metas: int, err: int) -> None: ...
    @property
    def device_bound(self) -> bool: ...
    # Positional: block_table, src_col, second, num_accepted[, err[, num_accepted_out]], with the
    # keywords block_size, pre_copy; or every argument by keyword.
    def check_device_step(self, *args: Any, **kwargs: Any) -> int: ...
    def device_step(self, *args: Any, **kwargs: Any) -> tuple[KernelLaunch | None, int, bool]: ...
    def launch_step(
        self, launch: Callable[[KernelLaunch | None, int], Any], *args: Any, **kwargs: Any
    ) -> tuple[int, bool]:
        """One guarded device step: checked as ``device_step``, ``launch(kl, requests)`` run and
        the write recorded; ``(requests, narrow)``."""

@final
class CommitPlanner:
    """Commit planning for one RecoverSSM layout over a pool of ``num_blocks`` blocks: which requests
    fold how many verified tokens into which block and, in align mode, which prefix-cache block
    receives the state at the crossed block boundary. Every input is checked before anything moves."""

    def __new__(cls, layout: Layout, num_blocks: int) -> CommitPlanner: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def window(self) -> int: ...
    # Keyword arguments: state_blocks, num_accepted, query_lens, seq_lens, block_table, block_size,
    # max_requests.
    def plan(self, **kwargs: Any) -> RawBuffer:
        """A commit plan (``COMMIT_ROW_DTYPE`` records); ``PlanError`` naming the request otherwise."""
    def check_state_blocks(self, state_blocks: Any, max_requests: int | None = None) -> int: ...

# Keyword arguments: recurrent, corrections, keygate, conv, conv_window (per-layer tensors), kind,
# conv_layout, conv_kernel_size.
def commit_meta_table(**kwargs: Any) -> RawBuffer:
    """The RecoverSSM commit kernel's table (128-byte ``CommitMeta`` records, one per layer); raises
    ``BindingError`` naming the layer and tensor the kernel cannot take."""

class RecoverSSMError(Exception): ...
class LayoutError(RecoverSSMError, ValueError): ...
class BindingError(RecoverSSMError, ValueError): ...
class PlanError(RecoverSSMError, ValueError): ...
class BackendUnavailableError(RecoverSSMError, RuntimeError): ...

@final
class KernelLaunch:
    """One ready launch built by the core: kernel, grid, block and the packed arguments."""

    @property
    def kernel(self) -> str: ...
    @property
    def grid(self) -> tuple[int, int, int]: ...
    @property
    def block(self) -> tuple[int, int, int]: ...
    @property
    def args(self) -> bytes: ...
    @property
    def args_ptr(self) -> int: ...
    @property
    def args_size(self) -> int: ...
    @property
    def extra_ptr(self) -> int:
        """Address of the ``extra`` array for ``cuLaunchKernel`` (valid while this object lives)."""
    def values(self) -> list[tuple[str, int]]: ...

@final
class FusedCopy:
    """The fused state copy over a caller-built table of state metas (constants checked once)."""

    # Keyword arguments: device, metas, num_meta, max_accepted, num_blocks, has_temporal, chunks,
    # err, groups.
    def __new__(cls, **kwargs: Any) -> FusedCopy: ...
    # Keyword arguments as Planner.device_step.
    def launch(self, **kwargs: Any) -> KernelLaunch | None: ...
    @property
    def device_index(self) -> int: ...

@final
class CommitLaunch:
    """The commit kernel of one state cache (constants and grid checked once)."""

    # Keyword arguments: device, metas, num_blocks, max_requests, err, threads.
    def __new__(cls, table: Any, **kwargs: Any) -> CommitLaunch: ...
    # Keyword arguments: rows, num_rows, num_accepted, err.
    def launch(self, **kwargs: Any) -> KernelLaunch | None: ...
    # Keyword arguments: state_blocks, num_accepted | device_counts (+ launch_counts), query_lens,
    # seq_lens, block_table, block_size, max_requests, rows, device.
    def commit(
        self, planner: CommitPlanner, bound: BoundTensors | None = None, **kwargs: Any
    ) -> tuple[RawBuffer, KernelLaunch | None]:
        """A whole device commit in one call: plan, checks and launch (rows to stage, launch)."""
    @property
    def device_index(self) -> int: ...

@final
class ErrorWord:
    """The decoded error word (``int32[3]``) of a kernel launch."""

    def __new__(cls, words: Sequence[int], num_requests: int) -> ErrorWord: ...
    @property
    def bits(self) -> int: ...
    @property
    def first_request(self) -> int | None: ...
    @property
    def last_request(self) -> int | None: ...
    @property
    def ok(self) -> bool: ...
    @property
    def names(self) -> list[str]: ...

# Keyword arguments: segments, tiles, first_tile, num_tiles, max_ctas.
def copy_tiles_launch(**kwargs: Any) -> KernelLaunch | None:
    """The launch of one wave of ``rs_copy_tiles``, or ``None`` when it has no tile."""

def state_chunks(max_state_bytes: int) -> int:
    """CTAs per state copy of the fused kernel for states of at most ``max_state_bytes`` bytes."""

def commit_grid(table: Any, threads: int = ...) -> tuple[int, int]:
    """``(rec_ctas, conv_ctas)`` of the commit kernel for a table's bytes."""

def pack_launch(
    name: str, grid: tuple[int, int, int], block: tuple[int, int, int], fields: Mapping[str, int]
) -> KernelLaunch:
    """A launch of kernel ``name`` whose parameter record is given field by field (every field,
    each range-checked)."""

# Keyword arguments: device, tables, groups, rows.
def check_device_tables(**kwargs: Any) -> None:
    """``PlanError`` unless ``tables`` are one integer ``[>= rows, cols]`` CUDA table per group on
    ``device``, of one width and dtype."""

def check_commit_counts(device: str, num_accepted: Any, min_len: int) -> None:
    """``PlanError`` unless ``num_accepted`` is an integer vector on ``device`` of ``min_len``+ counts."""

@final
class BoundTensors:
    """Bound tensors kept alive and checked before every write."""

    def __new__(cls, tensors: Sequence[tuple[Any, str]]) -> BoundTensors: ...
    def check(self) -> None:
        """``BindingError`` naming the first bound tensor or storage whose memory changed."""
    def mark_written(self) -> None: ...
    def guarded(self, write: Callable[[], Any]) -> Any:
        """``check()``, ``write()``, ``mark_written()`` in one call; what ``write`` returns."""
    def __len__(self) -> int: ...

@final
class KimiK3CommitPlanner:
    """The KDA layers of one Kimi-K3 model (vLLM's own tensors), checked once; ``plan`` plans one
    step's RecoverSSM commit (``BindingError`` / ``PlanError`` naming the layer or row otherwise)."""

    def __new__(
        cls,
        *,
        conv: Sequence[Any],
        state: Sequence[Any],
        correction: Sequence[Any],
        key_gate: Sequence[Any],
        a_log: Sequence[Any],
        dt_bias: Sequence[Any],
        gate_lower_bound: Sequence[float | None],
        spec_query_len: int,
    ) -> KimiK3CommitPlanner: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def max_num_reqs(self) -> int: ...
    @property
    def spec_query_len(self) -> int: ...
    @property
    def gate_lower_bound(self) -> float | None:
        """The gate's lower bound (``None``: the softplus gate)."""
    @property
    def conv_history_len(self) -> int: ...
    def plan(
        self,
        num_accepted_tokens: Any,
        state_indices: Any,
        query_start_loc: Any,
        request_indices: Any | None = None,
        block_table: Any | None = None,
        num_computed_tokens: Any | None = None,
        block_size: int | None = None,
    ) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int]]:
        """Per row that writes: (rows, requests, sources, counts, destinations, boundary blocks,
        boundary lengths)."""

def check_cache_sizes(num_layers: int, num_blocks: int, max_requests: int) -> None:
    """``BindingError`` unless a state cache's sizes are in range."""

def recover_geometry(layout: Any) -> dict[str, Any]:
    """``layout.recover_geometry()``; ``LayoutError`` when ``layout`` is not a :class:`Layout`."""

def check_index(what: str, index: int, len: int) -> int:
    """``index`` as an index into ``len`` items (``PlanError`` naming ``what`` otherwise)."""

def kernel_abi() -> dict[str, Any]:
    """The calling convention of every kernel, the record layouts and the shared constants."""

# vLLM's align-mode step (recoverssm_rs.vllm wraps them). Keyword arguments: see rust/python/vllm.rs.
def align_pre_copy(**kwargs: Any) -> RawBuffer: ...
def align_post_process(**kwargs: Any) -> RawBuffer: ...
def vllm_pre_copy(planner: Planner, **kwargs: Any) -> tuple[RawBuffer, CopyPlan]: ...
def vllm_post_process(planner: Planner, **kwargs: Any) -> tuple[RawBuffer, CopyPlan]: ...
def vllm_device_pre_copy(
    planner: Planner, run: Callable[[RawBuffer, KernelLaunch | None], Any] | None = None, **kwargs: Any
) -> tuple[RawBuffer, RawBuffer, KernelLaunch | None]: ...
def vllm_device_post_process(
    planner: Planner, run: Callable[[RawBuffer, KernelLaunch | None], Any] | None = None, **kwargs: Any
) -> tuple[RawBuffer, RawBuffer, KernelLaunch | None]: ...

# Keyword arguments: device, prev_rows, rows, num_accepted_given.
def vllm_check_prev_rows(**kwargs: Any) -> None:
    """``PlanError`` unless ``prev_rows`` is an int32 / int64 ``[>= rows]`` CUDA vector on
    ``device``, given without ``num_accepted``."""

def vllm_step_groups(groups: Any) -> tuple[list[int], list[tuple[Any, Any]]]:
    """vLLM's step groups ``(group id, layout, states)`` split into the ids and the ``(layout,
    states)`` pairs (``BindingError`` naming the group otherwise)."""

def check_vllm_step(planner: Planner, num_spec_blocks: int) -> None:
    """``block_size`` given to the planner and ``num_spec_blocks`` its groups' ``num_spec``."""

@final
class VllmSlots:
    """The rows of vLLM's ``mamba_state_idx``: one slot per live request."""

    def __new__(cls, max_num_reqs: int) -> VllmSlots: ...
    @staticmethod
    def check_capacity(max_num_reqs: int) -> int:
        """``max_num_reqs`` as a table's capacity (``PlanError`` outside ``1 ..= 2**24``)."""
    def assign(self, req_ids: Sequence[str]) -> tuple[list[int], list[str]]:
        """Each request's slot and the ids given one by this call (``PlanError``, nothing
        assigned, for an id listed twice or a full table)."""
    def release(self, req_ids: Iterable[str]) -> list[int]:
        """Frees the slots of ``req_ids``; returns the freed slots."""
    def check(self, slots: Any, req_ids: Sequence[str] | None = None) -> list[int]:
        """``PlanError`` naming the request unless every slot is in the table and its own."""
    @property
    def capacity(self) -> int: ...
    @property
    def live(self) -> int: ...

@final
class VllmSlotStep:
    """The half-steps of vLLM's GPU-resident runner as launches of ``rs_state_copy_slots``
    (``recoverssm_rs.vllm.ModelStateV2`` owns one)."""

    def __new__(
        cls,
        planner: Planner,
        *,
        group_ids: Any,
        num_slots: int,
        state_idx: Any,
        num_accepted: Any,
        scratch: Any,
        ctl: Any,
        err: Any,
        tables: Any,
        commit: Any,
    ) -> VllmSlotStep: ...
    ERR_WORDS: ClassVar[int]
    CTL_WORDS: ClassVar[int]
    @staticmethod
    def commit_stage_len(num_slots: int) -> int:
        """The RecoverSSM commit stage buffer's int32 elements for ``num_slots`` slots."""
    @staticmethod
    def check_group_ids(ids: Any, groups: int) -> list[int]:
        """The KV-cache group id of each planner group (``PlanError``: a count, a negative or a
        repeated id)."""
    def pre(
        self,
        block_tables: Any,
        idx_mapping: Any,
        num_computed_tokens: Any,
        query_start_loc: Any,
        run: Callable[[KernelLaunch, bytes | None, None], Any] | None = None,
    ) -> tuple[KernelLaunch, bytes | None]:
        """The pre-copy's launch over the groups' ``block_tables``, and the groups' table records
        when they moved; with ``run``, one guarded write (``run(launch, records, None)`` after every
        check, before the write is recorded)."""
    def post(
        self,
        idx_mapping: Any,
        num_sampled: Any,
        num_computed_tokens: Any,
        block_tables: Any,
        commit: bool = False,
        run: Callable[[KernelLaunch, bytes | None, Any], Any] | None = None,
    ) -> tuple[KernelLaunch, bytes | None]:
        """The post-process's launch (``num_sampled``: a tensor or one int; ``commit``: run the
        staged RecoverSSM commit, consumed by this launch), and the table records when they
        moved; ``run`` as ``pre``'s, its third argument the staged commit's ``reference``."""
    # Keyword arguments: request_indices, state_blocks, num_computed_tokens, block_table,
    # query_lens, window, num_blocks, max_requests, generation.
    def clear_commit(self) -> None:
        """Forgets the staged commit."""
    def stage_commit(
        self,
        kernel: tuple[CommitLaunch, BoundTensors] | None = None,
        reference: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> bytes:
        """Plans one step's RecoverSSM commit for the next post-process (``kernel``: the cache's
        commit kernel and bound tensors: the commit then runs inside that launch; else
        ``reference``, the host commit handed to the post-process's ``run``); the bytes to copy
        into the front of the stage buffer."""
    @property
    def group_ids(self) -> list[int]: ...

# Transfer beyond one pool (rust/python/transfer.rs; recoverssm_rs.transfer wraps them).
@final
class LayoutFingerprint:
    """One rank's pool as a transfer sees it; exchanged at handshake (``encode`` / ``decode``)."""

    def __new__(
        cls, layout: Layout, *, tp_rank: int | None = None, block_size: int | None = None
    ) -> LayoutFingerprint: ...
    @staticmethod
    def decode(text: str) -> LayoutFingerprint: ...
    def encode(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def tp_rank(self) -> int: ...
    @property
    def num_spec(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def conv_layout(self) -> _ConvLayoutName | None: ...
    @property
    def conv_kernel_size(self) -> int | None: ...
    @property
    def state_names(self) -> list[str]: ...
    @property
    def state_nbytes(self) -> list[int]: ...
    @property
    def conv_geometry(self) -> list[tuple[_ConvLayoutName, int, int] | None]: ...
    def with_rank(self, tp_rank: int) -> LayoutFingerprint: ...
    def request_nbytes(self, num_layers: int) -> int: ...
    def check_compatible(self, destination: LayoutFingerprint) -> None: ...

@final
class TransferPlan:
    """Reads (and staged local copies) moving a batch of requests' states to one destination rank."""

    def reads(self) -> bytes: ...
    def staged(self) -> bytes: ...
    @property
    def num_reads(self) -> int: ...
    @property
    def num_staged(self) -> int: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def staging_bytes(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def source_ranks(self) -> list[int]: ...

def plan_transfer(
    source: LayoutFingerprint,
    source_pools: Sequence[tuple[int, int, Sequence[int]]],
    destination: LayoutFingerprint,
    destination_pool: tuple[int, int, Sequence[int]],
    requests: Sequence[tuple[int, int]] | Any,
) -> TransferPlan: ...

# SGLang's mamba pool (recoverssm_rs.sglang wraps them). Keyword arguments: see rust/python/sglang.rs.
def sglang_commit_selection(**kwargs: Any) -> list[list[int]]:
    """Per pass (commit, then track), the requests that write (``PlanError`` naming the request
    whose step, slot or scratch row is out of range, or a slot written twice)."""

def sglang_slot_table(**kwargs: Any) -> tuple[bytes, int, int]:
    """The slot kernel's records of a pool (``SlotCopy``) as bytes, their count and the largest
    slot's bytes."""

def sglang_slot_launch(**kwargs: Any) -> KernelLaunch | None:
    """The launch of the slot kernel (clear without ``steps``, the commit with them), or ``None``."""

def sglang_check_pool(**kwargs: Any) -> None:
    """``BindingError`` unless ``conv`` (a list), ``temporal`` and the optional verify scratch are
    tensors with one layer count, no two sharing memory."""

def sglang_host_copies(pool: Sequence[Any], mamba_cache_cpu: Any, num_slots: int) -> list[Any]:
    """The host copies of ``mamba_cache_cpu`` in ``pool``'s order, each checked (on the host, the pool
    tensor's dtype and shape for ``num_slots`` slots); ``PlanError`` otherwise."""

def sglang_ids(op: str, arg: str, ids: Any, num_slots: int | None = None, unique: bool = False) -> list[int]:
    """``ids`` as host integers (int32 / int64 only: floats and bools refused); with ``num_slots``,
    checked as slots ``1..num_slots-1`` (with ``unique``, no repeats); ``PlanError`` naming ``op``
    and ``arg`` otherwise."""

def encode_saved_states(
    fingerprint: LayoutFingerprint,
    num_layers: int,
    num_requests: int,
    source_blocks: Sequence[int],
    data: Any,
    *,
    tier: HostCacheIndex | None = None,
    entry: int | None = None,
) -> tuple[list[tuple[str, str]], list[tuple[str, str, list[int], int, int]]]: ...
def check_saved_states(
    metadata: dict[str, str],
    tensors: Sequence[tuple[str, str, Sequence[int], int, int]],
    data: Any,
    *,
    tier: HostCacheIndex | None = None,
    entry: int | None = None,
    key: str = ...,
) -> tuple[LayoutFingerprint, int, int, list[int]]: ...
def write_file(path: str | os.PathLike[str], parts: Sequence[Any]) -> int: ...
def remove_file(path: str | os.PathLike[str]) -> None: ...
def read_saved_file(path: str | os.PathLike[str]) -> tuple[bytes, bytes]: ...
def guarded_write(
    run: Callable[[], _T], *, reads: Sequence[BoundTensors] | None = None, writes: Sequence[BoundTensors] | None = None
) -> _T: ...
def guarded_transfer(
    plan: TransferPlan,
    sources: Mapping[int, BoundTensors],
    tp_size: int,
    destination: BoundTensors,
    run: Callable[[], _T],
) -> _T: ...
def check_pool(pool: Any, what: str = "pool") -> LayoutFingerprint: ...
def source_pools(sources: Any) -> tuple[LayoutFingerprint, list[tuple[int, Any]]]: ...
def restore_sources(states: Any, num_blocks: int) -> tuple[LayoutFingerprint, list[tuple[int, Any]]]: ...
def block_list(blocks: Any, what: str = "blocks") -> list[int]: ...
def check_sources(sources: Sequence[tuple[int, LayoutFingerprint]]) -> LayoutFingerprint: ...
def endpoint_args(
    name: Any, backends: Any, progress_thread: Any, interfaces: Any
) -> tuple[str, list[str], bool, list[str]]: ...
def pull_args(timeout: Any, per_request: Any, restore_failed: Any) -> tuple[float, bool, bool]: ...
def transfer_plan_arg(plan: Any, what: str = "plan") -> TransferPlan: ...

@final
class CacheCounters:
    """A host cache's sizes and counters at one moment."""

    @property
    def bytes_per_request(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...
    @property
    def spill(self) -> bool: ...
    @property
    def used_bytes(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def in_memory(self) -> int: ...
    @property
    def on_disk(self) -> int: ...

@final
class HostCacheIndex:
    """The rules of a host offload tier: bytes per request, capacity, LRU eviction, spill."""

    def __new__(
        cls,
        fingerprint: LayoutFingerprint,
        num_layers: int,
        capacity_bytes: int,
        *,
        disk_dir: str | os.PathLike[str] | None = None,
    ) -> HostCacheIndex: ...
    def counters(self) -> CacheCounters: ...
    def check_key(self, key: object) -> None: ...
    def need(self, num_requests: int) -> int: ...
    def plan_put(self, id: int, num_requests: int) -> list[tuple[int, bool]]: ...
    def put(self, id: int, num_requests: int) -> list[tuple[int, bool]]: ...
    def check_prefetched(self, id: int | None, handle_entry: int | None, key: str) -> None: ...
    def spill_path(self, id: int) -> Path: ...
    def lookup(self, id: int) -> Literal["memory", "disk"] | None: ...
    def touch(self, id: int) -> bool: ...
    def location(self, id: int) -> Literal["memory", "disk"] | None: ...
    def drop(self, id: int) -> Literal["memory", "disk"] | None: ...
    def __len__(self) -> int: ...

@final
class PeerInfo:
    """One rank's handshake message: agent name and metadata, fingerprint, pool geometry, addresses."""

    def __new__(
        cls,
        name: str,
        metadata: bytes,
        fingerprint: LayoutFingerprint,
        geometry: tuple[int, int, Sequence[int]],
        addresses: Sequence[int],
    ) -> PeerInfo: ...
    @staticmethod
    def from_bytes(data: bytes) -> PeerInfo: ...
    def to_bytes(self) -> bytes: ...
    @property
    def name(self) -> str: ...
    @property
    def metadata(self) -> bytes: ...
    @property
    def fingerprint(self) -> LayoutFingerprint: ...
    @property
    def geometry(self) -> tuple[int, int, list[int]]: ...
    @property
    def addresses(self) -> list[int]: ...

# Checkpoint placement and eviction (rust/python/checkpoint.rs)

@final
class CheckpointPlan:
    @property
    def hit_position(self) -> int: ...
    @property
    def hit_handle(self) -> int | None: ...
    @property
    def saves(self) -> list[int]: ...

@final
class CheckpointCache:
    def __new__(
        cls,
        policy: str,
        *,
        block_size: int | None = None,
        granularity: int | None = None,
        budget: int | None = None,
        budget_bytes: int | None = None,
        state_bytes: int | None = None,
    ) -> CheckpointCache: ...
    def plan(self, prompt: Sequence[int]) -> CheckpointPlan: ...
    def finish(
        self, prompt: Sequence[int], output: Sequence[int], plan: CheckpointPlan
    ) -> tuple[list[tuple[int, int]], list[int]]: ...
    def position(self, handle: int) -> int | None: ...
    @property
    def peak(self) -> int: ...
    def __len__(self) -> int: ...

def check_checkpoint_trace(requests: Iterable[tuple[int, str, float, Sequence[int], Sequence[int]]]) -> int: ...
def simulate_checkpoints(
    requests: Iterable[tuple[int, str, float, Sequence[int], Sequence[int]]],
    policy: str,
    *,
    block_size: int | None = None,
    granularity: int | None = None,
    budget: int | None = None,
    budget_bytes: int | None = None,
    state_bytes: int | None = None,
) -> dict[str, Any]: ...
