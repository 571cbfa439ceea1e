"""Type stubs of ``recoverssm_rs._core``, generated from the bindings (rust/python/*.rs): do not edit.

Regenerate after changing a binding: ``python scripts/gen_stubs.py`` (after ``bash scripts/setup.sh``);
``python scripts/gen_stubs.py --check`` fails when this file differs (scripts/test.sh runs it)."""

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, final

_T = TypeVar("_T")

_Role = Literal["persistent", "workspace"]
_CopyKindName = Literal["conv", "temporal"]
_ConvLayoutName = Literal["SD", "DS"]
_Location = Literal["memory", "disk"]
# A tensor or array the core describes without reading it (a torch tensor, a CuPy array, a host
# array); an int32 / int64 host vector or table (a numpy array, a CPU tensor, a list of ints).
_Tensor = Any
_IntArray = Any
# A dtype the core reads by name: a torch or numpy dtype.
_DType = Any
# Bytes the core reads through the buffer protocol (bytes, a numpy uint8 array, a memoryview).
_Buffer = Any

__version__: str
__all__ = [
    "BackendUnavailableError",
    "BindingError",
    "BoundTensors",
    "CacheCounters",
    "CheckpointCache",
    "CheckpointPlan",
    "CommitLaunch",
    "CommitPlanner",
    "CopyPlan",
    "ErrorWord",
    "FusedCopy",
    "HostCacheIndex",
    "KernelLaunch",
    "KimiK3CommitPlanner",
    "Layout",
    "LayoutError",
    "LayoutFingerprint",
    "PeerInfo",
    "PlanError",
    "Planner",
    "RawBuffer",
    "RecoverSSMError",
    "SglangPool",
    "StateSpec",
    "TransferPlan",
    "VllmSlotStep",
    "VllmSlots",
    "__version__",
    "_validate_copy_funcs",
    "align_post_process",
    "align_pre_copy",
    "block_list",
    "check_cache_sizes",
    "check_checkpoint_trace",
    "check_commit_counts",
    "check_device_tables",
    "check_index",
    "check_pool",
    "check_saved_states",
    "check_sources",
    "check_vllm_step",
    "commit_grid",
    "commit_meta_table",
    "copy_func_kind",
    "copy_tiles_launch",
    "encode_saved_states",
    "endpoint_args",
    "gdn_layout",
    "guarded_transfer",
    "guarded_write",
    "kda_layout",
    "kernel_abi",
    "linear_attention_layout",
    "load_args",
    "mamba1_layout",
    "mamba2_layout",
    "pack_launch",
    "plan_transfer",
    "pull_args",
    "read_saved_file",
    "recover_geometry",
    "restore_sources",
    "saved_request_blocks",
    "sglang_ids",
    "sglang_layout",
    "short_conv_layout",
    "simulate_checkpoints",
    "source_pools",
    "state_chunks",
    "transfer_plan_arg",
    "vllm_check_prev_rows",
    "vllm_device_post_process",
    "vllm_device_pre_copy",
    "vllm_mamba_groups",
    "vllm_post_process",
    "vllm_pre_copy",
    "vllm_request_values",
    "vllm_runner_groups",
    "vllm_step_groups",
    "write_file",
]

class BackendUnavailableError(RecoverSSMError, RuntimeError):
    """The tensors need an executor this machine lacks (for example CUDA tensors without CuPy)."""

class BindingError(RecoverSSMError, ValueError):
    """State tensors do not match the layout they are bound to (dtype, shape, strides, device), or
    no longer own the memory they had when they were bound.
    """

@final
class BoundTensors:
    """Tensors bound by a state cache or a transfer pool, guarded as a planner guards its own."""

    def __new__(cls, tensors: Sequence[tuple[_Tensor, str]]) -> BoundTensors: ...
    def __len__(self) -> int:
        """Return len(self)."""
    def check(self) -> None:
        """Raises `BindingError` when a bound tensor or storage no longer has the memory it was bound
        with (nothing has been written then).
        """
    def guarded(self, write: Callable[[], _T]) -> _T:
        """One guarded write: `check()`, then `write()`, then `mark_written()`, in one call (`write`
        is not called when a tensor moved). Returns what `write` returns.
        """
    def mark_written(self) -> None:
        """Bumps autograd's version counters of the bound torch tensors (after a write)."""

@final
class CacheCounters:
    """The rules of a host offload tier (see `HostCache`): bytes per request from the fingerprint,
    capacity accounting, least-recently-used eviction and spill. Entries are named by integer
    ids; the caller holds the bytes.
    A host cache at one moment: the host bytes one request's states take (every layer's persistent
    states), the capacity, whether evicted entries spill to disk, the bytes held, entries pushed out
    of host memory, restores that found or missed their key, entries in memory and on disk.
    """

    @property
    def bytes_per_request(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def in_memory(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def on_disk(self) -> int: ...
    @property
    def spill(self) -> bool: ...
    @property
    def used_bytes(self) -> int: ...

@final
class CheckpointCache:
    """A checkpoint cache under one policy; see the core's `checkpoint` module."""

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
    def __len__(self) -> int:
        """Return len(self)."""
    @staticmethod
    def check_reserved_blocks(planner: Planner, blocks: Iterable[int], *, group: int | None = None) -> list[int]:
        """Checks the blocks a checkpoint store reserves for its checkpoints (any iterable of block
        ids): each an int naming a block of `planner`'s group `group` (default 0) other than the
        null block 0, none twice, none published (the store copies checkpoints into them). Returns
        them as a list.
        """
    @staticmethod
    def check_running_block(
        planner: Planner, running_block: int, *, group: int | None = None, reserved: Sequence[int] | None = None
    ) -> int:
        """Checks the block a request is to run in before a checkpoint store starts it: an int naming
        a block of `planner`'s group `group` (default 0) other than the null block 0, and not
        published. The request's prefill writes its running block, so a published block (another
        checkpoint, a block shared by requests, or the very checkpoint the request starts from:
        copied onto itself it would then be written in place) is refused, and so is one of
        `reserved` (a store's free reserved blocks: the next checkpoint would be copied into the
        block the request is writing). Returns the block.
        """
    def discard(self, handles: Sequence[int]) -> None:
        """Forgets live checkpoints that `finish` placed but the engine could not materialise (its
        copy of their state failed): as if they had not been written. A handle that is not live
        is a PlanError naming it, and nothing changes.
        """
    def finish(
        self, prompt: Sequence[int], output: Sequence[int], plan: CheckpointPlan
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """Ends a request planned by `plan`: returns `(written, evicted)`, `written` as
        `[(position, handle)]`, `evicted` as the handles the request's end evicted (those evicted
        when it was planned are the plan's `evicted`). A plan is finished once, by the cache that
        made it, with the prompt it was made for (its length is checked); anything else is a
        PlanError and nothing changes.
        """
    @property
    def peak(self) -> int:
        """The most checkpoints held at once so far."""
    def peek(self, prompt: Sequence[int]) -> int | None:
        """The handle of the checkpoint `plan(prompt)` would start from, or None; changes nothing (no
        use is counted, nothing is evicted), so an engine can prepare the hit's copy and plan only
        once the copy is accepted.
        """
    def plan(self, prompt: Sequence[int]) -> CheckpointPlan:
        """The checkpoint to start `prompt` from and the positions to save during its prefill; the
        checkpoints evicted to admit it (`sglang-lru`) are the plan's `evicted`.
        """
    def position(self, handle: int) -> int | None:
        """The position of a live checkpoint, or None. A handle that is not an int in
        `0 ..= 2**64 - 1` is a PlanError naming it.
        """

@final
class CheckpointPlan:
    """The plan of one request: the checkpoint to start from and the positions its prefill saves."""

    @property
    def evicted(self) -> list[int]:
        """Checkpoints the cache evicted when it planned the request (`sglang-lru` at a full budget:
        the request takes a state slot of its own), in eviction order: they are no longer live, so
        their storage is free now; `finish` does not report them again.
        """
    @property
    def hit_handle(self) -> int | None:
        """The checkpoint's handle, or None on a miss."""
    @property
    def hit_position(self) -> int:
        """Prompt tokens covered by the checkpoint started from (0 on a miss)."""
    @property
    def saves(self) -> list[int]:
        """Positions (ascending) whose state the prefill saves."""

@final
class CommitLaunch:
    """The commit kernel of one state cache (constants and grid checked once)."""

    def __new__(
        cls,
        table: _Buffer,
        *,
        device: str | _Tensor,
        metas: int,
        num_blocks: int,
        max_requests: int,
        err: int | None = None,
        threads: int | None = None,
    ) -> CommitLaunch: ...
    def commit(
        self,
        planner: CommitPlanner,
        bound: BoundTensors | None = None,
        *,
        state_blocks: _IntArray,
        num_accepted: _IntArray | None = None,
        device_counts: _Tensor | None = None,
        launch_counts: _Tensor | None = None,
        query_lens: _IntArray | None = None,
        seq_lens: _IntArray | None = None,
        block_table: _IntArray | None = None,
        block_size: int | None = None,
        max_requests: int,
        rows: _Tensor,
        device: str | _Tensor,
    ) -> tuple[RawBuffer, KernelLaunch | None]:
        """A whole device commit in one call: the bound tensors' check, the plan, the device counts'
        check and the launch over `rows`. Returns the plan's rows (to stage into `rows` before the
        launch) and the launch (`None`: nothing to commit). `bound`: the cache's `BoundTensors`,
        checked first and marked written once a launch is packed. Nothing is written when it raises.
        """
    @property
    def device_index(self) -> int:
        """The CUDA device index of the cache."""
    def launch(
        self,
        *,
        rows: _Tensor,
        num_rows: int | None = None,
        num_accepted: _Tensor | None = None,
        err: _Tensor | None = None,
    ) -> KernelLaunch | None:
        """The launch of one commit (`None`: no rows)."""

@final
class CommitPlanner:
    """Commit planning for one RecoverSSM layout over a pool of `num_blocks` blocks: which requests
    fold how many verified tokens into which block and, in align mode, which prefix-cache block
    receives the state at the crossed block boundary. Every input is checked before anything moves.
    """

    def __new__(cls, layout: Layout, num_blocks: int) -> CommitPlanner: ...
    def check_state_blocks(self, state_blocks: _IntArray, max_requests: int | None = None) -> int:
        """Checks running-state blocks (`<= 0` padding): in range, one request per block, and at most
        `max_requests` requests when given (the workspace rows). Returns the number of requests.
        """
    @property
    def num_blocks(self) -> int: ...
    def plan(
        self,
        *,
        state_blocks: _IntArray,
        num_accepted: _IntArray,
        query_lens: _IntArray,
        seq_lens: _IntArray | None = None,
        block_table: _IntArray | None = None,
        block_size: int | None = None,
        max_requests: int | None = None,
    ) -> RawBuffer:
        """A commit plan (`CommitRow` records): per request the tokens to fold in, its state block
        and, in align mode, the boundary block.
        """
    @property
    def window(self) -> int: ...

@final
class CopyPlan:
    """One step's plan. Holds its planner, and so the state tensors, alive."""

    def __len__(self) -> int:
        """Return len(self)."""
    def execute_host(self) -> None:
        """Runs the plan over CPU tensors with the host executor (GIL released). The planner's guard
        and every segment are checked first: either all of it runs or nothing does.
        """
    def group_stats(self) -> list[tuple[int, int, int, int]]:
        """Per group: `(copies, segments, waves, bytes)`."""
    @property
    def nbytes(self) -> int:
        """Bytes the plan moves."""
    @property
    def num_copies(self) -> int:
        """(group, layer, state, request) copies planned, before coalescing."""
    @property
    def num_requests(self) -> int:
        """Requests (per group) that move something."""
    @property
    def num_segments(self) -> int: ...
    @property
    def num_waves(self) -> int:
        """Ordered waves (group 0's first)."""
    @property
    def planner(self) -> Planner: ...
    def rows(self) -> RawBuffer:
        """Compact per-request records (40 bytes each), by group, then request."""
    def segments(self) -> RawBuffer:
        """Segment records (32 bytes each), wave by wave."""
    def tiles(self, tile_bytes: int = ...) -> tuple[RawBuffer, RawBuffer]:
        """Tiles of about `tile_bytes` bytes and where each wave's tiles start."""
    def wave_starts(self) -> RawBuffer:
        """Segment index where each wave starts, plus the total (`num_waves + 1` u32 values)."""

@final
class ErrorWord:
    """The decoded error word (`int32[3]`) of a kernel launch."""

    def __new__(cls, words: Sequence[int], num_requests: int) -> ErrorWord: ...
    @property
    def bits(self) -> int:
        """The OR of the error bits of every rejected request (or row)."""
    @property
    def first_request(self) -> int | None:
        """The first rejected request, `None` when nothing was rejected."""
    @property
    def last_request(self) -> int | None:
        """The last rejected request."""
    @property
    def names(self) -> list[str]:
        """Names of the error kinds seen."""
    @property
    def ok(self) -> bool:
        """True when no request was rejected."""

@final
class FusedCopy:
    """The fused state copy over a table of state metas the caller built (tools and tests; a planner
    builds its own, `Planner.bind_device`).
    """

    def __new__(
        cls,
        *,
        device: str | _Tensor,
        metas: int,
        num_meta: int,
        max_accepted: int,
        num_blocks: int,
        has_temporal: bool,
        chunks: int,
        err: int,
        groups: int | None = None,
    ) -> FusedCopy: ...
    @property
    def device_index(self) -> int:
        """The CUDA device index of the states."""
    def launch(
        self,
        block_table: _Tensor,
        src_col: _Tensor,
        second: _Tensor,
        num_accepted: _Tensor,
        err: _Tensor | None = None,
        num_accepted_out: _Tensor | None = None,
        *,
        block_size: int | None = None,
        pre_copy: bool | None = None,
    ) -> KernelLaunch | None:
        """The launch of one step (arguments as `Planner.device_step`; int32 inputs)."""

@final
class HostCacheIndex:
    def __new__(
        cls,
        fingerprint: LayoutFingerprint,
        num_layers: int,
        capacity_bytes: int,
        *,
        disk_dir: str | os.PathLike[str] | None = None,
    ) -> HostCacheIndex: ...
    def __len__(self) -> int:
        """Return len(self)."""
    def check_key(self, key: object) -> None:
        """Refuses a key the tier cannot hold (PlanError naming it): a key must be hashable and equal
        to itself, and so must each item of a tuple or frozenset in it (a NaN, found by no other
        NaN, could be put but never found or dropped by a key built again).
        """
    def check_prefetched(self, id: int | None, handle_entry: int | None, key: str) -> None:
        """PlanError unless a prefetch handle of entry `handle_entry` may finish the restore of entry
        `id` (None: a key the tier does not hold), named `key` in the error.
        """
    def counters(self) -> CacheCounters:
        """The cache's sizes and counters now."""
    def drop(self, id: int) -> Literal["memory", "disk"] | None:
        """Forgets `id`; returns where it was held."""
    def location(self, id: int) -> Literal["memory", "disk"] | None:
        """Where `id` is held (`"memory"`, `"disk"`, None), without marking it used."""
    def lookup(self, id: int) -> Literal["memory", "disk"] | None:
        """`"memory"`, `"disk"` or None for a restore of `id`, counting a hit or a miss; an
        in-memory entry becomes the most recently used.
        """
    def need(self, num_requests: int) -> int:
        """Host bytes `num_requests` requests take; PlanError when more than the whole capacity."""
    def plan_put(self, id: int, num_requests: int, *, replaces: int | None = None) -> list[tuple[int, bool]]:
        """`(id, spill)` of each entry that `put(id, num_requests, replaces=)` would evict, least
        recently used first, changing nothing; PlanError when the requests need more than the
        capacity.
        """
    def put(self, id: int, num_requests: int, *, replaces: int | None = None) -> list[tuple[int, bool]]:
        """Records `id` as a new in-memory entry of `num_requests` requests (replacing one of that
        id, and forgetting entry `replaces` first: a key's previous version, whose prefetch
        handles then no longer match); returns `(id, spill)` of each entry evicted to make room,
        least recently used first. PlanError (nothing changed) when the requests need more than
        the capacity.
        """
    def remove_spill(self, id: int) -> None:
        """Removes entry `id`'s spill file if it has one (BindingError naming it when it cannot be
        removed: then the tier still holds it), and forgets its name, so a tier that spills for as
        long as it runs keeps no name of a file it removed.
        """
    def spill_path(self, id: int) -> Path:
        """The path of entry `id`'s spill file, in this tier's private directory (made on first use:
        mode 0700, an exclusive create under a random name inside `disk_dir`; removed with the
        spill files in it when the tier is dropped).
        """
    def touch(self, id: int) -> bool:
        """Marks an in-memory `id` most recently used, no hit counted; False when not in memory."""

@final
class KernelLaunch:
    """One ready launch: kernel, grid, block and the argument buffer (the kernel's parameter record)."""

    @property
    def args(self) -> bytes:
        """The packed argument buffer (a copy)."""
    @property
    def args_ptr(self) -> int:
        """Address of the packed arguments (valid while this object lives)."""
    @property
    def args_size(self) -> int:
        """Bytes of the packed arguments."""
    @property
    def block(self) -> tuple[int, int, int]: ...
    @property
    def extra_ptr(self) -> int:
        """Address of the `extra` array for `cuLaunchKernel` (valid while this object lives)."""
    @property
    def grid(self) -> tuple[int, int, int]: ...
    @property
    def kernel(self) -> str:
        """The kernel's entry point name."""
    def values(self) -> list[tuple[str, int]]:
        """`(field, value)` of the parameter record, in declaration order, read from the buffer."""

@final
class KimiK3CommitPlanner:
    """The KDA layers of one Kimi-K3 model (each layer's dim-first conv state, recurrent state,
    verify records and gate parameters), checked once; [`Self::plan`] plans one step's commit.
    """

    def __new__(
        cls,
        *,
        conv: Sequence[_Tensor],
        state: Sequence[_Tensor],
        correction: Sequence[_Tensor],
        key_gate: Sequence[_Tensor],
        a_log: Sequence[_Tensor],
        dt_bias: Sequence[_Tensor],
        gate_lower_bound: Sequence[float | None],
        spec_query_len: int,
    ) -> KimiK3CommitPlanner: ...
    @property
    def conv_history_len(self) -> int: ...
    @property
    def gate_lower_bound(self) -> float | None:
        """The gate's lower bound (`None`: the softplus gate)."""
    @property
    def max_num_reqs(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    def plan(
        self,
        num_accepted_tokens: _IntArray,
        state_indices: _IntArray,
        query_start_loc: _IntArray,
        request_indices: _IntArray | None = None,
        block_table: _IntArray | None = None,
        num_computed_tokens: _IntArray | None = None,
        block_size: int | None = None,
    ) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int]]:
        """One step's plan (the rows that write), every input checked: a `PlanError` naming the row,
        its request and the value otherwise. Align mode takes `block_table`, `num_computed_tokens`
        and `block_size` together.
        """
    @property
    def spec_query_len(self) -> int: ...

@final
class Layout:
    """A validated per-layer state layout: persistent states (copied between cache blocks) first,
    workspace states (rewritten every step, never copied) after.
    """

    def __new__(cls, backend: str, states: Sequence[StateSpec], num_spec: int | None = None) -> Layout: ...
    def __len__(self) -> int:
        """Return len(self)."""
    @property
    def backend(self) -> str: ...
    @property
    def copyable_prefix_len(self) -> int:
        """Number of leading states that are copied between blocks."""
    @property
    def num_spec(self) -> int:
        """Draft tokens per step."""
    @property
    def persistent(self) -> tuple[StateSpec, ...]: ...
    @property
    def persistent_bytes_per_block(self) -> int:
        """Bytes of one layer's persistent states in one cache block."""
    def recover_geometry(self) -> dict[str, Any]:
        """The RecoverSSM geometry of this layout (state indices, heads, head dims, window, gate
        kind, conv geometry); raises LayoutError when the layout cannot serve RecoverSSM.
        """
    def state(self, name: str) -> StateSpec:
        """The state called `name`."""
    @property
    def states(self) -> tuple[StateSpec, ...]: ...
    def to_dict(self) -> dict[str, Any]: ...
    @property
    def workspace(self) -> tuple[StateSpec, ...]: ...
    @property
    def workspace_bytes_per_request(self) -> int:
        """Bytes of one layer's workspace states for one request."""

class LayoutError(RecoverSSMError, ValueError):
    """A state layout (or an engine's copy-function registration) breaks the layout contract.

    The message names the backend, the state (index and name), what is wrong and how to fix it.
    """

@final
class LayoutFingerprint:
    """What one rank's pool holds, as a transfer sees it: family, model dims, persistent-state
    dtypes and conv geometry, TP size and rank, block size. Exchanged at handshake in its text
    form (`encode` / `decode`).
    """

    def __new__(
        cls, layout: Layout, *, tp_rank: int | None = None, block_size: int | None = None
    ) -> LayoutFingerprint: ...
    @property
    def block_size(self) -> int:
        """Tokens per cache block (informational)."""
    def check_compatible(self, destination: LayoutFingerprint) -> None:
        """Raises LayoutError, naming every incompatible state with both values, unless states can
        move from this (source) rank to `destination`.
        """
    @property
    def conv_geometry(self) -> list[tuple[_ConvLayoutName, int, int] | None]:
        """`(layout, width, dim)` of each conv state, None for head-sliced states."""
    @property
    def conv_kernel_size(self) -> int | None: ...
    @property
    def conv_layout(self) -> _ConvLayoutName | None: ...
    @staticmethod
    def decode(text: str) -> LayoutFingerprint:
        """Parses the text form of `encode` (LayoutError for any defect, sizes checked for overflow)."""
    def encode(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def num_spec(self) -> int: ...
    def request_nbytes(self, num_layers: int) -> int:
        """Bytes one request's persistent states take in a pool of `num_layers` layers (what the
        host tier and saved states count); LayoutError on overflow.
        """
    @property
    def state_names(self) -> list[str]:
        """Names of the persistent states, in order."""
    @property
    def state_nbytes(self) -> list[int]:
        """Bytes of each persistent state in one block."""
    @property
    def tp_rank(self) -> int: ...
    @property
    def tp_size(self) -> int: ...
    def with_rank(self, tp_rank: int) -> LayoutFingerprint:
        """This fingerprint with another TP rank (the same pool layout on a sibling rank)."""

@final
class PeerInfo:
    """One rank's handshake message: its transport agent's name and metadata, its layout
    fingerprint, its pool geometry `(num_layers, num_blocks, block_strides)` and the address of
    block 0 of each (layer, state) tensor. `to_bytes` / `from_bytes` give its wire form;
    `from_bytes` checks every field (LayoutError for a malformed, truncated or overflowing message).
    """

    def __new__(
        cls,
        name: str,
        metadata: bytes,
        fingerprint: LayoutFingerprint,
        geometry: tuple[int, int, Sequence[int]],
        addresses: Sequence[int],
    ) -> PeerInfo: ...
    @property
    def addresses(self) -> list[int]: ...
    @property
    def fingerprint(self) -> LayoutFingerprint: ...
    @staticmethod
    def from_bytes(data: bytes) -> PeerInfo:
        """Reads and checks a peer's message (LayoutError naming the defect)."""
    @property
    def geometry(self) -> tuple[int, int, list[int]]:
        """`(num_layers, num_blocks, block_strides)` of the peer's pool."""
    @property
    def metadata(self) -> bytes:
        """The transport agent's metadata."""
    @property
    def name(self) -> str: ...
    def to_bytes(self) -> bytes:
        """The wire form, for a pipe, a queue or a side channel."""

class PlanError(RecoverSSMError, ValueError):
    """A copy or commit step is invalid: bad block ids, columns, accepted counts, or a hazard.

    Raised before anything moves: a rejected step leaves every state unchanged.
    """

@final
class Planner:
    """The core planner over one or more recurrent groups, bound to their state tensors."""

    def __new__(
        cls,
        groups: Sequence[tuple[Layout, Sequence[Sequence[_Tensor]]]],
        *,
        block_size: int | None = None,
        persistent_only: bool = False,
        also_guard: SglangPool | None = None,
    ) -> Planner: ...
    def bind_device(self, metas: int, err: int) -> None:
        """Prepares the device path: the state metas (`state_meta()`) are at device address `metas`,
        the planner's own error word (int32[3]) at `err`. Once per planner.
        """
    @property
    def block_size(self) -> int | None:
        """Tokens per block, for vLLM's step decisions."""
    def check(self) -> None:
        """Raises `BindingError` when a bound tensor (or one of `also_guard`'s) no longer owns the
        memory it was bound with.
        """
    def check_device_step(
        self,
        block_table: _Tensor,
        src_col: _Tensor,
        second: _Tensor,
        num_accepted: _Tensor,
        err: _Tensor | None = None,
        num_accepted_out: _Tensor | None = None,
        *,
        block_size: int | None = None,
        pre_copy: bool | None = None,
    ) -> int:
        """Checks a device step whose inputs may be int32 or int64 (before anything is bound or
        narrowed); returns the number of requests. Arguments as [`device_step`].
        """
    @property
    def device(self) -> str:
        """`cpu` or `cuda:N`."""
    @property
    def device_bound(self) -> bool:
        """Whether [`bind_device`] has run."""
    def device_step(
        self,
        block_table: _Tensor,
        src_col: _Tensor,
        second: _Tensor,
        num_accepted: _Tensor,
        err: _Tensor | None = None,
        num_accepted_out: _Tensor | None = None,
        *,
        block_size: int | None = None,
        pre_copy: bool | None = None,
    ) -> tuple[KernelLaunch | None, int, bool]:
        """One device step from the caller's tensors: `(launch, requests, narrow)`. With `narrow` false
        the launch is ready (`None`: nothing to launch); with `narrow` true every input passed the
        checks but some must first be narrowed to int32 or made contiguous on the device (then call
        again with the converted tensors). The guard is checked first.

        Arguments: `block_table`, `src_col`, `second` (`dst_col`, or `running` with a
        `block_size`), `num_accepted`, optionally `err` and `num_accepted_out` (positionally in this
        order, the launch path: no keyword dictionary per step, or by keyword), and the keyword
        options `block_size` and `pre_copy`.
        """
    def group_sizes(self) -> list[tuple[int, int]]:
        """Per group: `(layers, blocks)`."""
    def guarded(self, write: Callable[[], _T]) -> _T:
        """One guarded write: the bound tensors are checked (a `BindingError`, and `write` is not
        called, when one moved), `write()` runs, and what was written is recorded (autograd's
        version counters). Returns what `write` returns.
        """
    def holders(self, block: int, *, group: int | None = None) -> int:
        """The holders of `block` in `group` (0: not published)."""
    def launch_step(
        self,
        launch: Callable[[KernelLaunch | None, int], object],
        block_table: _Tensor,
        src_col: _Tensor,
        second: _Tensor,
        num_accepted: _Tensor,
        err: _Tensor | None = None,
        num_accepted_out: _Tensor | None = None,
        *,
        block_size: int | None = None,
        pre_copy: bool | None = None,
    ) -> tuple[int, bool]:
        """One guarded device step: the guard and the inputs are checked as by `device_step`; when the
        launch is ready, `launch(kernel_launch_or_None, requests)` runs and the states are recorded
        as written, all in this call. Returns `(requests, narrow)`: with `narrow` true nothing ran
        (narrow the inputs to int32 on the device and call again). Arguments after `launch` as
        `device_step`'s.
        """
    @property
    def layouts(self) -> list[Layout]: ...
    def mark_written(self) -> None:
        """Bumps autograd's version counters of the bound tensors (after a write on the device)."""
    @property
    def num_blocks(self) -> int:
        """Blocks of the largest pool."""
    @property
    def num_groups(self) -> int: ...
    @property
    def num_layers(self) -> int:
        """Layers of every group."""
    @property
    def num_spec(self) -> int:
        """Speculative blocks after the running column, shared by every group."""
    def plan(
        self,
        *,
        tables: Sequence[_IntArray] | _IntArray | None = None,
        block_table: _IntArray | None = None,
        src_col: _IntArray,
        dst_col: _IntArray,
        num_accepted: _IntArray,
        semantics: Literal["post_process", "pre_copy"] | None = None,
    ) -> CopyPlan:
        """Plans `dst_col <- src_col` moves carrying `num_accepted` in every group (`tables`: one
        block table per group, or one table for one group) under `semantics` (`"post_process"`,
        the default, or `"pre_copy"`).
        """
    def plan_copy(self, *, src_blocks: _IntArray, dst_blocks: _IntArray) -> CopyPlan:
        """Plans whole-block copies `dst_blocks[i] <- src_blocks[i]` of every persistent state."""
    def publish(self, blocks: _IntArray, *, group: int | None = None) -> None:
        """Publishes `blocks` of `group` (one more holder each; a checkpoint in the prefix index is
        one holder, each request sharing the block another): until retracted, a plan that would
        write one is refused with a `PlanError` naming the request, state and block. Ids in
        `1..num_blocks`; on an error nothing changes.
        """
    def published(self, group: int | None = None) -> list[int]:
        """The published blocks of `group`, ascending."""
    def retract(self, blocks: _IntArray, *, group: int | None = None) -> None:
        """Drops one holder of each of `blocks` of `group`; a block left without holders may be
        written again. A block not published (as often as listed) is a `PlanError`, and nothing
        changes.
        """
    def state_meta(self) -> RawBuffer:
        """The fused kernel's table of every (group, layer, persistent state)."""
    @property
    def states(self) -> tuple[tuple[tuple[_Tensor, ...], ...], ...]:
        """`states[group][layer][state]`: the bound persistent tensors (an immutable copy)."""

@final
class RawBuffer:
    """A read-only byte buffer over core records; numpy views it without copying."""

    def __len__(self) -> int:
        """Return len(self)."""

class RecoverSSMError(Exception):
    """Base class of every error raised by recoverssm_rs."""

@final
class SglangPool:
    """The tensors of an SGLang pool, checked and guarded: SGLang's `mamba_cache.conv` (a list of
    tensors), `temporal` and the optional verify scratch (`intermediate_ssm`, a list
    `intermediate_conv_window`), every one a tensor, with one layer count and no two sharing
    memory (`BindingError` naming them); `conv_layout` the conv windows' layout (`"DS"`, `"SD"`).
    """

    def __new__(
        cls,
        *,
        conv: Sequence[_Tensor],
        temporal: _Tensor,
        intermediate_ssm: _Tensor | None = None,
        intermediate_conv_window: Sequence[_Tensor] | None = None,
        conv_layout: _ConvLayoutName | None = None,
    ) -> SglangPool: ...
    def check(self) -> None:
        """Raises `BindingError` naming the first tensor of the pool that moved (re-pointed, its
        storage resized or freed).
        """
    def clear_slots(self, indices: _IntArray) -> None:
        """`clear_slots` on host states, one guarded write run by the core: the slots `indices`
        checked (slots of the pool other than the dummy slot 0; one may repeat), the pool's tensors
        checked, every state's slots zeroed, the write recorded.
        """
    def commit(
        self,
        *,
        slots: _IntArray,
        steps: _IntArray,
        rows: _IntArray | None = None,
        track_slots: _IntArray | None = None,
        track_steps: _IntArray | None = None,
    ) -> None:
        """The commit on host states, one guarded write run by the core: its moves, `(slot, row, step)`
        per request that writes, the commit pass then the track pass (with `track_slots`), after
        every index is checked (`PlanError` naming the argument by SGLang's name, or the request):
        `slots` (SGLang's `state_indices`), `steps` (`last_correct_step_indices`), `rows`
        (`src_indices`, default each request's own index), `track_slots` (`track_indices`) and
        `track_steps` (`steps_to_track`), as `slot_launch` takes them on CUDA; then the pool's
        tensors checked, each state's slots written from its verify scratch, the write recorded.
        """
    def copy_from(self, planner: Planner, src_indices: _IntArray, dst_indices: _IntArray) -> None:
        """`copy_from` on host states, one call: `src_indices` and `dst_indices` checked as slots of
        the pool (`PlanError` naming the argument), then `planner`'s (the planner built over the
        pool's layers, as for `copy_launch`) copy plan of them run by the
        host executor (the pool's tensors checked first; every copy checked before the first byte).
        """
    def copy_launch(
        self,
        planner: Planner,
        runner: Callable[[str], Callable[[KernelLaunch | None, int], object]],
        upload: Callable[[bytes], _Tensor],
        src_indices: _Tensor,
        dst_indices: _Tensor,
    ) -> None:
        """`copy_from` on CUDA, one guarded launch of the fused copy of `planner` (the planner built
        over the pool's layers, with `also_guard` the pool; another is a `PlanError`) in one call: the copy of
        slot `src_indices[i]` into `dst_indices[i]` in every layer, over a block table whose every
        row is the slot ids (each request's columns are its slots), with pre-copy semantics.
        `src_indices` and `dst_indices` are int32 vectors of one length on the pool's device
        (`PlanError` naming them; more copies than the pool has slots past the dummy slot 0 would
        write one slot twice). Only then `runner("copy_from")` (`Planner.launch_runner`: makes the
        planner's device path on first use) gives the `run(launch, requests)` of the launch, and the
        first call hands the slot ids and ones to `upload(bytes)`, which returns them on the device
        (checked as `slot_launch`'s records): a refused call prepares nothing. Then the guards,
        the uploaded constants and the slot ids (still held by their storage: `BindingError`,
        `PlanError`), `run`, the write recorded. The kernel
        checks each slot and skips a bad one (the planner's error word).
        """
    def guarded(self, write: Callable[[], _T]) -> _T:
        """One guarded write: the pool's tensors checked (`write` not called when one moved),
        `write()` run, the write recorded (autograd's version counters). Returns what `write` returns.
        """
    def host_copy(
        self,
        op: str,
        indices: _IntArray,
        *,
        alloc: Callable[[int], _Tensor],
        run: Callable[[_Tensor, bytes, int, KernelLaunch | None, int], object] | None = None,
        err: _Tensor | None = None,
        mamba_cache_cpu: Sequence[Sequence[_Tensor] | _Tensor] | None = None,
    ) -> tuple[_Tensor, list[tuple[int, int, list[int], str]]] | None:
        """HiCache's host copy `op` (`"get_cpu_copy"` or `"load_cpu_copy"`) of the slots `indices`, in
        one call: the slots checked (for a load none twice), then the pool's tensors (`BindingError`
        naming the one that moved), then a load's host copies `mamba_cache_cpu` (SGLang's
        `(conv_cpu, temporal_cpu)`, or a historical triple whose third element is ignored), each
        against its pool tensor as bound: on the host, the pool tensor's dtype, shape `[layers,
        len(indices), ...]` (`PlanError` naming the state), and held by its storage. A get lays its
        states out in one buffer (`alloc(n)` returns a writable, contiguous int32 vector of `n`
        elements on the pool's device, of its own and held by its storage: a `PlanError` naming the
        operation and the alloc otherwise, nothing run or written; a load on CUDA stages its copies
        in one too) and returns it
        with, per state tensor, its block `(offset, bytes, shape, dtype)` (the shape and dtype the
        pool tensor was bound with, whatever its Python object says now); a load returns `None`.

        Host states: the core gathers (get) or writes (load: every host copy read whole first) the
        slots itself. CUDA: the core stages the call (a load's host copies, the slot table, the index
        vectors) and hands `run(buffer, staged, at, launch, requests)` the bytes to copy into the
        buffer from int32 element `at` and the slot kernel's launch over `requests` slots reporting
        into `err` (`None`: nothing to launch). A load's write is recorded.
        """
    def layer_groups(self) -> list[tuple[Layout, list[list[_Tensor]]]]:
        """The planner's groups: one per conv tensor that holds bytes, the temporal state riding on
        the first; each one's layout and, per layer, the views of its tensors (`[conv[k][layer],
        temporal[layer]]` or `[conv[k][layer]]`).
        """
    @property
    def num_slots(self) -> int:
        """Slots, the dummy slot 0 included (SGLang's `size + 1`)."""
    def slot_launch(
        self,
        run: Callable[[KernelLaunch | None], object],
        commit: bool,
        upload: Callable[[bytes], _Tensor],
        *,
        slots: _Tensor,
        steps: _Tensor | None = None,
        rows: _Tensor | None = None,
        track_slots: _Tensor | None = None,
        track_steps: _Tensor | None = None,
        err: _Tensor,
    ) -> None:
        """One guarded launch of the slot kernel, in one call: clear `slots` (`commit` false) or the
        commit (`steps`, optional `rows` and track pair), every vector checked by the core (int64,
        one length, on the pool's device; `err` an int32 error word of 3). The first launch of
        each use builds its records and hands them to `upload(bytes)`, which returns them on the
        device (contiguous uint8 of that size on the pool's device, held by its storage: a
        `PlanError` otherwise). Then: the pool's tensors checked, the uploaded records, the vectors
        and `err` (still held by their storage: `BindingError`, `PlanError`), `run(launch)`
        (`None`: nothing to launch), the write recorded.
        """
    def state_tensors(self) -> list[_Tensor]:
        """The state tensors that hold bytes, in SGLang's order (every such conv tensor, then the
        temporal state).
        """
    def transfer_layers(self) -> list[list[_Tensor]]:
        """What a transfer pool binds, per layer: `[conv[k][layer], temporal[layer]]`, `conv[k]` the
        conv tensor that holds bytes (`conv[0]` when none does), after checking that they cover the
        pool (`LayoutError` for several conv tensors holding bytes) and that the pool's tensors have
        not moved (`BindingError` naming the one that did: the views are of the memory bound).
        """
    def verify_scratch(self) -> list[tuple[_Tensor, _Tensor]]:
        """`(state, its verify scratch)` for every state tensor that holds bytes, the temporal state
        first (`PlanError` for a pool without the verify scratch).
        """

@final
class StateSpec:
    """One state tensor of a layer: its per-block (persistent) or per-request (workspace) shape, dtype,
    role and, for persistent states, how it is copied between cache blocks.
    """

    def __new__(
        cls,
        name: str,
        shape: Sequence[int],
        dtype: str | _DType,
        role: _Role = "persistent",
        copy: _CopyKindName | None = None,
        conv_layout: _ConvLayoutName | None = None,
    ) -> StateSpec: ...
    @property
    def conv_layout(self) -> _ConvLayoutName | None: ...
    @property
    def copy(self) -> _CopyKindName | None: ...
    @property
    def dtype(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def nbytes(self) -> int | None:
        """Bytes per block (persistent) or per request (workspace); None if it overflows 64 bits."""
    @property
    def role(self) -> _Role: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class TransferPlan:
    """The reads (and staged local copies) that move a batch of requests' persistent states to one
    destination rank.
    """

    @property
    def blocks(self) -> list[tuple[int, int]]:
        """The batch's `(source block, destination block)` pairs, in request order, as the core read
        them (plain ints, whatever integer table the requests were given as).
        """
    @property
    def nbytes(self) -> int:
        """Bytes read over the transport."""
    @property
    def num_reads(self) -> int: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def num_staged(self) -> int: ...
    def reads(self) -> bytes:
        """Reads as packed u64 rows `(request, src_rank, src_tensor, src_offset, dst_tensor,
        dst_offset, len)`; `dst_tensor == 2**64 - 1` is the staging buffer.
        """
    @property
    def source_ranks(self) -> list[int]:
        """The source ranks the destination rank reads from, ascending."""
    def staged(self) -> bytes:
        """Staged copies as packed u64 rows `(request, src_offset, src_row_stride, src_col_stride,
        dst_tensor, dst_offset, dst_row_stride, dst_col_stride, rows, cols, elem)`.
        """
    @property
    def staging_bytes(self) -> int:
        """Bytes of staging buffer the plan needs."""

@final
class VllmSlotStep:
    """The half-steps of one `ModelStateV2` as launches of `rs_state_copy_slots`."""

    def __new__(
        cls,
        planner: Planner,
        *,
        group_ids: _IntArray,
        num_slots: int,
        state_idx: _Tensor,
        num_accepted: _Tensor,
        scratch: _Tensor,
        ctl: _Tensor,
        err: _Tensor,
        tables: _Tensor,
        commit: _Tensor,
    ) -> VllmSlotStep: ...
    CTL_WORDS: ClassVar[int]
    ERR_WORDS: ClassVar[int]
    @staticmethod
    def buffers(
        planner: Planner, group_ids: Sequence[int], max_num_reqs: int
    ) -> tuple[list[int], int, int, list[tuple[int, int, bool]]]:
        """Checks `ModelStateV2`'s arguments against `planner` (made with a `block_size` the kernel
        takes, `1 ..= 2**31 - 1`; one KV-cache group id per group, each `>= 0`, none twice;
        `max_num_reqs` in `1 ..= 2**24`) and sizes its buffers: `(group ids, max_num_reqs,
        block_size, buffers)`, each buffer `(fill, elements, int64)` in the constructor's order
        (`state_idx`, `num_accepted`, `scratch`, `ctl`, `err`, `tables`, `commit`).
        """
    def clear_commit(self) -> None:
        """Forgets the staged commit (the stage buffer is the caller's: e.g. after its copy failed)."""
    @property
    def group_ids(self) -> list[int]:
        """The KV-cache group id of each planner group."""
    @staticmethod
    def new_request(slot: int, num_computed_tokens: int, num_slots: int, block_size: int) -> tuple[int, int]:
        """`ModelStateV2.add_request`'s slot and the running column it seeds
        (`crate::vllm::slot_step::new_request`), for `num_slots` slots of `block_size` tokens.
        """
    def post(
        self,
        idx_mapping: _Tensor,
        num_sampled: _Tensor | int,
        num_computed_tokens: _Tensor | None,
        block_tables: Sequence[_Tensor] | Mapping[int, _Tensor],
        commit: bool = False,
        run: Callable[[KernelLaunch, bytes | None], object] | None = None,
        launch_arg: Callable[[_Tensor], _Tensor] | None = None,
    ) -> tuple[KernelLaunch, bytes | None]:
        """The post-process: `num_sampled` a tensor (one count per request row) or a Python int (one
        for every row); `num_computed_tokens` `None` (a pipeline-parallel rank that is not the
        last): no aligned save; `commit`: run the staged RecoverSSM commit (`stage_commit`).
        Refused without a pre-copy since the last post-process (one post-process per step), and
        before the first pre-copy unless it has no rows (a step's pre-copy runs before its
        post-process). A post-process the core builds forgets the staged commit (with `commit` or
        not); a refused one keeps it (a host commit that ran before a failed `run` is kept as run:
        the retry launches the stage without calling `reference` again). `(launch, table records or None)`; `run` and `launch_arg` as
        `pre`'s; with `run`, a commit staged without a kernel runs first as
        `reference(num_sampled)` (the caller's own `num_sampled`), inside the same guarded write.
        """
    def pre(
        self,
        block_tables: Sequence[_Tensor] | Mapping[int, _Tensor],
        idx_mapping: _Tensor,
        num_computed_tokens: _Tensor,
        query_start_loc: _Tensor,
        run: Callable[[KernelLaunch, bytes | None], object] | None = None,
        launch_arg: Callable[[_Tensor], _Tensor] | None = None,
    ) -> tuple[KernelLaunch, bytes | None]:
        """The pre-copy over the groups' `block_tables` and the runner's `idx_mapping`,
        `num_computed_tokens`, `query_start_loc` (positional: no keyword dict per step):
        `(launch, table records or None)`. With `run`, one guarded write: after every check
        `run(launch, table records or None)` queues the upload and the launch, and the states are
        recorded as written, in this call. `launch_arg`: the adapter's launch-argument hook
        (`CudaOps.launch_arg`), applied here to each runner tensor (the tables of the groups only)
        before it is described.
        """
    def stage_commit(
        self,
        kernel: tuple[CommitLaunch, BoundTensors] | None = None,
        reference: Callable[[_Tensor], object] | None = None,
        *,
        request_indices: _IntArray,
        state_blocks: _IntArray,
        num_computed_tokens: _IntArray,
        block_table: _IntArray,
        query_lens: _IntArray | None = None,
        window: int,
        num_blocks: int,
        max_requests: int,
        generation: int,
    ) -> bytes:
        """Plans one step's RecoverSSM commit (keywords: `request_indices`, `state_blocks`,
        `num_computed_tokens` per request row, `block_table`, `query_lens`, the cache's `window`,
        `num_blocks`, `max_requests`, and the stage's `generation`) for the next post-process; `kernel`: the cache's commit
        kernel, which then runs inside that post-process's launch (`None`: the commit runs before
        it, the launch sets the committed rows' columns and counts) and `bound` the cache's
        `BoundTensors`; `reference`: without a kernel, the caller's host commit, kept with the stage
        and called by the post-process as `reference(num_sampled)` inside its guarded write, before
        its `run`.
        Returns the bytes to copy into the front of the stage buffer;
        nothing is staged when the core refuses the commit.
        """
    @staticmethod
    def step_word(words: Sequence[int]) -> list[int]:
        """The step's error word `[bits, first, last]` (`crate::vllm::slot_step::step_word`) from a
        host copy of the error buffer.
        """

@final
class VllmSlots:
    """The rows of vLLM's `mamba_state_idx`: one slot per live request (`slots.rs` in the core)."""

    def __new__(cls, max_num_reqs: int) -> VllmSlots: ...
    def assign(self, req_ids: Sequence[str]) -> tuple[list[int], list[str]]:
        """Each request's slot in batch order (new requests get a free one) and the ids given a slot
        by this call. Nothing changes on an error (an id listed twice, the table full).
        """
    @property
    def capacity(self) -> int:
        """Slots in the table (`max_num_reqs`)."""
    def check(self, slots: _IntArray, req_ids: Sequence[str] | None = None) -> list[int]:
        """Checks one step's slots (each inside the table, one request per slot); `req_ids` name the
        requests in errors.
        """
    @staticmethod
    def check_capacity(max_num_reqs: int) -> int:
        """`max_num_reqs` checked as a table's capacity (`PlanError` outside `1 ..= 2**24`)."""
    @property
    def live(self) -> int:
        """Requests holding a slot."""
    def release(self, req_ids: Iterable[str]) -> list[int]:
        """Frees the slots of `req_ids` (ids without one are skipped); returns the freed slots."""
    def release_all(self, lists: Sequence[tuple[str, Iterable[str]]]) -> list[int]:
        """Frees the slots of several named lists of ids at once (`(name, req_ids)` pairs: vLLM's
        finished, preempted and resumed requests): every list is read first, so a malformed one is
        a `PlanError` naming it and nothing is freed; returns the freed slots.
        """

def _validate_copy_funcs(
    groups: Sequence[tuple[str, Sequence[Sequence[int]], Sequence[str] | None, int | None, int | None, str | None]],
    copy_funcs: Sequence[tuple[str, Sequence[str]]],
) -> dict[str, int]: ...
def align_post_process(
    *,
    tables: Sequence[_IntArray] | _IntArray,
    state_col: _IntArray,
    num_computed: _IntArray,
    num_scheduled: _IntArray,
    num_draft: _IntArray,
    num_accepted: _IntArray,
    req_ids: Sequence[str] | None = None,
    block_size: int | None = None,
    num_spec_blocks: int | None = None,
) -> RawBuffer:
    """vLLM's post-process decision (no copies): int64 rows `running, aligned, dest, bias, src_col,
    num_accepted`.
    """

def align_pre_copy(
    *,
    tables: Sequence[_IntArray] | _IntArray,
    num_computed: _IntArray,
    num_scheduled: _IntArray,
    num_accepted: _IntArray,
    mamba_state_idx: _IntArray,
    fresh: _IntArray | None = None,
    req_ids: Sequence[str] | None = None,
    block_size: int | None = None,
    num_spec_blocks: int | None = None,
) -> RawBuffer:
    """vLLM's pre-copy decision (no copies): int64 rows `prev, curr, src_col, bias, num_accepted`."""

def block_list(blocks: _IntArray, what: str = "blocks", *, offload: bool = False) -> list[int]:
    """The block ids `blocks` (the argument `what`): a 1-D list or array of host integers (PlanError
    naming the argument otherwise). Their values are the plan's to check (a negative block is
    refused naming its request). `offload`: the blocks of an offload, which must name at least
    one (PlanError otherwise: an offload of no request holds nothing).
    """

def check_cache_sizes(num_layers: int, num_blocks: int, max_requests: int) -> None:
    """Checks a state cache's sizes (layers, blocks, workspace rows) before anything is allocated."""

def check_checkpoint_trace(
    requests: Iterable[tuple[int, str, float, Sequence[int], Sequence[int]]], *, source: str | None = None
) -> int:
    """Checks a trace's requests (`[(line, id, arrival, prompt, output)]`) as `simulate_checkpoints`
    does; returns their number. `source`: the trace's name in errors (its path), when given.
    """

def check_commit_counts(device: str, num_accepted: _Tensor, min_len: int) -> None:
    """Checks the accepted counts of a device commit: an integer vector on the cache's device with at
    least `min_len` counts.
    """

def check_device_tables(*, device: str | _Tensor, tables: Sequence[_Tensor], groups: int, rows: int) -> None:
    """Checks the engine's device block tables of a multi-group step (`args::check_group_tables`)."""

def check_index(what: str, index: int, len: int) -> int:
    """`index` as an index into `len` items named `what` (a `PlanError` otherwise)."""

def check_pool(pool: object, what: str = "pool") -> LayoutFingerprint:
    """Checks that `pool` (the argument `what`) is a StatePool; returns its fingerprint."""

def check_saved_states(
    metadata: dict[str, str],
    tensors: Sequence[tuple[str, str, list[int], int, int]],
    data: _Buffer,
    *,
    tier: HostCacheIndex | None = None,
    entry: int | None = None,
    key: str = ...,
    path: str | os.PathLike[str] | None = None,
) -> tuple[LayoutFingerprint, int, int, list[int], list[tuple[int, int]]]:
    """Checks a saved-states file: its metadata and tensor entries (as the JSON header holds them:
    types and ranges are checked here) against the fingerprint it names, every request's bytes in
    `data` (the data section) against its checksum and the whole record's digest; with `tier` and
    `entry`, that it is that tier's spill file of that entry (named `key` in errors). Returns
    `(fingerprint, num_layers, num_requests, source_blocks, ranges)`, `ranges` the byte range in
    `data` of each (layer, persistent state) tensor, layer-major; LayoutError names the defect, and
    the file by `path` (and `key`) when given.
    """

def check_sources(sources: Sequence[tuple[int, LayoutFingerprint]]) -> LayoutFingerprint:
    """Checks the source ranks an executor was given, `(rank it is used as, its fingerprint)`: each
    fingerprint holds that rank (BindingError for swapped shards) and all are ranks of one
    instance (BindingError for an SD pool with a DS pool, or two TP sizes). Returns the first.
    """

def check_vllm_step(planner: Planner, num_spec_blocks: int) -> None:
    """Checks a step's scheduling parameters against its planner (`vllm::check_step`): `block_size`
    given to the planner, `num_spec_blocks` its groups' `num_spec`.
    """

def commit_grid(table: _Buffer, threads: int | None = None) -> tuple[int, int]:
    """`(rec_ctas, conv_ctas)`: CTAs per (layer, row) of the commit kernel for a table's bytes, with
    `threads` threads per CTA.
    """

def commit_meta_table(
    *,
    recurrent: Sequence[_Tensor],
    corrections: Sequence[_Tensor],
    keygate: Sequence[_Tensor],
    conv: Sequence[_Tensor] | None = None,
    conv_window: Sequence[_Tensor] | None = None,
    kind: str,
    conv_layout: str | None = None,
    conv_kernel_size: int | None = None,
) -> RawBuffer:
    """The commit kernel's table (`CommitMeta` records, 128 bytes per layer)."""

def copy_func_kind(name: str) -> Literal["conv", "temporal"]:
    """The copy kind (`"conv"` or `"temporal"`) a copy function's name or kind names (the core's
    table of vLLM's copy-spec functions); `LayoutError` for any other name.
    """

def copy_tiles_launch(
    *, segments: int, tiles: int, first_tile: int, num_tiles: int, max_ctas: int | None = None
) -> KernelLaunch | None:
    """The launch of one wave of `rs_copy_tiles`, or `None` when it has no tile."""

def encode_saved_states(
    fingerprint: LayoutFingerprint,
    num_layers: int,
    num_requests: int,
    source_blocks: Sequence[int],
    data: _Buffer,
    *,
    tier: HostCacheIndex | None = None,
    entry: int | None = None,
) -> tuple[list[tuple[str, str]], list[tuple[str, str, list[int], int, int]]]:
    """The header of a saved-states file of `num_requests` requests saved from `source_blocks` of a
    pool of `fingerprint` with `num_layers` layers, whose data section is `data`: its metadata
    (string pairs: checksums and the record digest filled in; with `tier` and `entry`, bound to
    that entry of that host tier and sealed with its keys) and its tensors `(name, safetensors
    dtype, shape, begin, end)`.
    """

def endpoint_args(
    name: str, backends: Sequence[str], progress_thread: bool, interfaces: str | Sequence[str]
) -> tuple[str, list[str], bool, list[str]]:
    """An endpoint's arguments, checked: `name` (a string: the agent's name, as a handshake checks
    it), `backends` (a list of backend names), `progress_thread` (a bool) and `interfaces` (a
    comma-separated string or a list of interface names or addresses). Returns them converted,
    the interfaces without blank items (BindingError naming the argument otherwise).
    """

def gdn_layout(
    *,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    conv_kernel_size: int,
    tp_size: int,
    num_spec: int,
    conv_layout: str,
    dtype: str | _DType | None = None,
    ssm_dtype: str | _DType | None = None,
    recover_ssm: bool | None = None,
) -> Layout:
    """Gated DeltaNet layout: conv window + temporal state (+ RecoverSSM verify records)."""

def guarded_transfer(
    plan: TransferPlan,
    sources: Mapping[int, BoundTensors],
    tp_size: int,
    destination: BoundTensors,
    run: Callable[[], _T],
) -> _T:
    """[`guarded_write`] of a transfer plan between pools of this process: `sources` (rank ->
    guard of that source pool) must hold every source rank `plan` reads (BindingError naming
    the missing ranks, of `tp_size`, otherwise); the guards of those ranks and of `destination`
    are checked, a plan in which one request writes memory another reads (pools sharing memory)
    is a PlanError, `run()` moves the bytes, and the destination's writes are recorded.
    """

def guarded_write(
    run: Callable[[], _T], *, reads: Sequence[BoundTensors] | None = None, writes: Sequence[BoundTensors] | None = None
) -> _T:
    """A guarded write of a transfer tier, in one call: checks every guard of `reads` (the pools
    read) and `writes` (the pools written) -- BindingError naming the first tensor freed, resized
    or re-pointed, before anything runs --, runs `run()` (the copies), then bumps the version
    counters of what `writes` holds. Returns what `run` returns.
    """

def kda_layout(
    *,
    num_heads: int,
    head_dim: int,
    num_k_heads: int | None = None,
    head_k_dim: int | None = None,
    conv_kernel_size: int | None = None,
    tp_size: int,
    num_spec: int,
    conv_layout: str,
    dtype: str | _DType | None = None,
    ssm_dtype: str | _DType | None = None,
    recover_ssm: bool | None = None,
) -> Layout:
    """Kimi Delta Attention layout: conv window + recurrent state (+ RecoverSSM verify records)."""

def kernel_abi() -> dict[str, Any]:
    """The calling convention of every kernel, the record layouts and the shared constants:
    `{"kernels": [{"name", "file", "record", "params": [(field, c_type)]}], "kernel_files": [...],
    "records": {name: {"size", "fields": [(name, offset, numpy_type, c_type)]}},
    "constants": {name: value}, "error_bits": [(bit, name, meaning)]}`.
    """

def linear_attention_layout(
    *,
    num_heads: int,
    head_dim: int,
    tp_size: int,
    num_spec: int,
    conv_layout: str,
    dtype: str | _DType | None = None,
    ssm_dtype: str | _DType | None = None,
) -> Layout:
    """Linear-attention layout: one temporal state."""

def load_args(pin_memory: bool) -> bool:
    """`load_states`' arguments other than the file's, checked before the file is read:
    `pin_memory` (a bool; PlanError naming it otherwise). Returns it converted.
    """

def mamba1_layout(
    *,
    intermediate_size: int,
    state_size: int,
    conv_kernel: int,
    tp_size: int,
    num_spec: int,
    conv_layout: str,
    dtype: str | _DType | None = None,
    ssm_dtype: str | _DType | None = None,
) -> Layout:
    """Mamba1 layout: conv window + temporal state."""

def mamba2_layout(
    *,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    tp_size: int,
    num_spec: int,
    conv_layout: str,
    dtype: str | _DType | None = None,
    ssm_dtype: str | _DType | None = None,
    logical_window: int | None = None,
    mamba_backend: str | None = None,
) -> Layout:
    """Mamba2 layout: conv window + temporal state (+ the three ReplaySSM rings as workspace)."""

def pack_launch(
    name: str, grid: tuple[int, int, int], block: tuple[int, int, int], fields: Mapping[str, int]
) -> KernelLaunch:
    """A launch of kernel `name` whose parameter record is given field by field (`fields`: every field
    of the record, each range-checked against its C type) with the given grid and block; for
    tools and tests that launch with arguments of their own.
    """

def plan_transfer(
    source: LayoutFingerprint,
    source_pools: Sequence[tuple[int, int, Sequence[int]]],
    destination: LayoutFingerprint,
    destination_pool: tuple[int, int, Sequence[int]],
    requests: Sequence[tuple[int, int]] | _IntArray,
) -> TransferPlan:
    """Plans moving `requests` (source block, destination block) from the source instance (`source`:
    any of its ranks) to the destination rank `destination`. `source_pools`: one geometry
    `(num_layers, num_blocks, block_strides)` shared by every source rank, or one per rank.
    """

def pull_args(timeout: float, per_request: bool, restore_failed: bool) -> tuple[float, bool, bool]:
    """A pull's arguments, checked: `timeout` (seconds: a Python or numpy int or float, finite, > 0,
    at most a week),
    `per_request` and `restore_failed` (bools). Returns them converted (PlanError naming the
    argument otherwise).
    """

def read_saved_file(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """Reads a saved-states file: `(header, data)`, the JSON header's bytes (the framing checked: a
    length inside the file, no deeper nesting than a header has) and the data section's.
    BindingError naming the path when it cannot be read; LayoutError for bad framing.
    """

def recover_geometry(layout: object) -> dict[str, Any]:
    """Applies the copyable-prefix contract to an engine's groups; returns `{backend: prefix_len}`.
    `layout.recover_geometry()` of any object: a `LayoutError` naming `layout` when it is not a
    `Layout`.
    """

def restore_sources(states: object, num_blocks: int) -> tuple[LayoutFingerprint, list[tuple[int, Any]]]:
    """The saved states of a restore, checked: `states` is one HostStates or a list of them (one
    per source rank), each with a StatePool `pool` and `num_requests` equal to `num_blocks`
    (PlanError otherwise); returns their `(rank, pool)` pairs after the source checks of
    [`source_pools`] (BindingError).
    """

def saved_request_blocks(states: object) -> tuple[int, list[int]]:
    """The request count and source blocks of `states` (HostStates) for a save, checked: a StatePool
    `pool` holding `num_requests >= 1` requests in its blocks `1..=num_requests`, and
    `source_blocks` None (then `1..=num_requests`) or one block id `>= 0` per request (PlanError
    naming the field otherwise).
    """

def sglang_ids(
    op: str, arg: str, ids: _IntArray, num_slots: int | None = None, unique: bool | None = None
) -> list[int]:
    """The index vector `ids`, the argument `arg` of operation `op`, as host int64 values
    ([`host_ints`]). With `num_slots`, every id is checked as a slot of the pool other than the
    dummy slot 0 (negative ids refused), and with `unique` no slot twice.
    """

def sglang_layout(
    *,
    tp_size: int,
    dtype: str | _DType,
    ssm_dtype: str | _DType,
    num_heads: int,
    head_dim: int,
    conv_kernel: int,
    state_size: int | None = None,
    intermediate_size: int | None = None,
    conv_dim: int | None = None,
    num_k_heads: int | None = None,
    head_k_dim: int | None = None,
    conv_shard_groups: Sequence[int] | None = None,
) -> Layout:
    """The family layout of one rank of `tp_size` for SGLang's cache parameters: `dtype` and
    `ssm_dtype` its `dtype.conv` / `dtype.temporal`, the rest its `shape`'s fields of the same
    names (`None` where the shape has none). Kimi-Linear (`num_k_heads`) is KDA, three
    `conv_shard_groups` GDN, any other Mamba2.
    """

def short_conv_layout(
    *,
    intermediate_size: int,
    conv_kernel: int,
    tp_size: int,
    num_spec: int,
    conv_layout: str,
    dtype: str | _DType | None = None,
    ssm_dtype: str | _DType | None = None,
) -> Layout:
    """Short-conv layout: one conv window."""

def simulate_checkpoints(
    requests: Iterable[tuple[int, str, float, Sequence[int], Sequence[int]]],
    policy: str,
    *,
    block_size: int | None = None,
    granularity: int | None = None,
    budget: int | None = None,
    budget_bytes: int | None = None,
    state_bytes: int | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """Replays a trace. `requests`: `[(line, id, arrival, prompt, output)]` in arrival order (`line`
    names the request in errors; `source`, when given, the trace). Returns a dict of totals plus per-request lists `reused`,
    `bound` and `writes`.
    """

def source_pools(sources: object) -> tuple[LayoutFingerprint, list[tuple[int, Any]]]:
    """The source pools of a transfer, checked: `sources` is a mapping rank -> StatePool or a list of
    StatePools (each used as the rank it holds); every pool holds the rank it is given as, no rank
    is given twice, and all are ranks of one instance (BindingError naming the defect). Returns
    the first source's fingerprint and the `(rank, pool)` pairs.
    """

def state_chunks(max_state_bytes: int) -> int:
    """CTAs per state copy of the fused kernel for states of at most `max_state_bytes` bytes."""

def transfer_plan_arg(plan: object, what: str = "plan") -> TransferPlan:
    """`plan` (the argument `what`) as a TransferPlan (PlanError naming it otherwise)."""

def vllm_check_prev_rows(*, device: str | _Tensor, prev_rows: _Tensor, rows: int, num_accepted_given: bool) -> None:
    """Checks `prev_rows` of a device pre-copy (`device_step::check_prev_rows`)."""

def vllm_device_post_process(
    planner: Planner,
    run: Callable[[RawBuffer, KernelLaunch | None, int], object] | None = None,
    *,
    max_num_reqs: int,
    step: Any,
    buffers: Callable[[int, int], tuple[_Tensor, _Tensor | None]],
    err: _Tensor,
    out: _Tensor,
    device_tables: Sequence[_Tensor] | None = None,
    prev_rows: _Tensor | None = None,
) -> tuple[RawBuffer, RawBuffer, KernelLaunch | None]:
    """The post-process for the device of `step` (a `PostProcessInputs`; decided by the kernel from
    the counts, written to `out[max_num_reqs:][:rows]`): returns `running`, the staged step and the
    launch, as `vllm_device_pre_copy`.
    """

def vllm_device_pre_copy(
    planner: Planner,
    run: Callable[[RawBuffer, KernelLaunch | None, int], object] | None = None,
    *,
    max_num_reqs: int,
    step: Any,
    buffers: Callable[[int, int], tuple[_Tensor, _Tensor | None]],
    err: _Tensor,
    out: _Tensor,
    device_tables: Sequence[_Tensor] | None = None,
    prev_rows: _Tensor | None = None,
) -> tuple[RawBuffer, RawBuffer, KernelLaunch | None]:
    """The pre-copy for the device of `step` (a `PreCopyInputs`): its requests checked against
    `max_num_reqs` first; the host decides the columns (every check that needs no count; with host
    counts every check), stages the step as int32 and packs the launch that reads it from the
    staging buffer `buffers` returns; int64 device counts are narrowed to int32 on the device.
    Returns `curr` (store it per request), the staged step (copy it into the staging buffer, then
    launch), and the launch (`None` without requests); the counts after the reset are written to
    `out[:rows]`. With `run`, one guarded write in this call: after every check,
    `run(staged, launch, rows)` queues the copy and the launch, and the states are recorded as
    written.
    """

def vllm_mamba_groups(kv_cache_config: Any) -> list[tuple[int, Any, list[str]]]:
    """vLLM's mamba groups in `kv_cache_config` (its `KVCacheConfig`, read by attribute) as `(group
    id, spec, layer names)` in group order; a group whose layers use several specs
    (`UniformTypeKVCacheSpecs.kv_cache_specs`) gives one entry per spec, compared by value (vLLM's
    are frozen dataclasses; plain objects by identity). A spec is one with `mamba_type` and
    `shapes`; attention groups are skipped. No mamba group, or a config that cannot be read, is a
    `LayoutError`.
    """

def vllm_post_process(
    planner: Planner,
    *,
    host_only: str | None = None,
    tables: Sequence[_IntArray] | _IntArray,
    state_col: _IntArray,
    num_computed: _IntArray,
    num_scheduled: _IntArray,
    num_draft: _IntArray,
    num_accepted: _IntArray,
    req_ids: Sequence[str] | None = None,
    block_size: int | None = None,
    num_spec_blocks: int | None = None,
) -> tuple[RawBuffer, CopyPlan]:
    """The post-process decision (rows as `align_post_process`) and its plan; `host_only` as for
    `vllm_pre_copy`.
    """

def vllm_pre_copy(
    planner: Planner,
    *,
    host_only: str | None = None,
    tables: Sequence[_IntArray] | _IntArray,
    num_computed: _IntArray,
    num_scheduled: _IntArray,
    num_accepted: _IntArray,
    mamba_state_idx: _IntArray,
    fresh: _IntArray | None = None,
    req_ids: Sequence[str] | None = None,
    block_size: int | None = None,
    num_spec_blocks: int | None = None,
) -> tuple[RawBuffer, CopyPlan]:
    """The pre-copy decision (rows as `align_pre_copy`) and its plan over every group of `planner`.
    `host_only`: the caller's name for a call of the host path, refused on CUDA states.
    """

def vllm_request_values(
    req_ids: Sequence[str],
    requests: Mapping[str, Any],
    num_scheduled_tokens: Mapping[str, int],
    spec_tokens: Mapping[str, Sequence[Any]],
) -> RawBuffer:
    """A step's per-request values, read from vLLM's objects for each request id `r` of `req_ids` (a
    list of strings) in row order: `requests[r].num_computed_tokens`, `num_scheduled_tokens[r]` and
    the draft tokens `len(spec_tokens.get(r, ()))`; `int64 [3, R]` in that order. A request missing
    from `requests` or `num_scheduled_tokens`, or a value that is not an integer, is a `PlanError`
    naming the request and its row.
    """

def vllm_runner_groups(
    groups: Sequence[
        tuple[
            int,
            tuple[str, str, Sequence[Sequence[int]], Sequence[object], int, int],
            Sequence[str],
            Sequence[tuple[str, Sequence[_Tensor] | None]],
        ]
    ],
    conv_layout: str,
) -> tuple[list[tuple[int, Layout, list[list[_Tensor]]]], int, int]:
    """The step's groups from the record of vLLM's mamba groups (one per group id and spec, as the
    package reads them): every spec in align mode, every layer in the forward context with a
    tensor per copy function (the leading ones kept), the layouts in `conv_layout` (`"SD"` /
    `"DS"`). Returns the groups and the first spec's `block_size` and `num_speculative_blocks`.
    A spec's field or a layer name of the wrong type is a `LayoutError` naming it.
    """

def vllm_step_groups(
    groups: Sequence[tuple[int, Layout, Sequence[Sequence[_Tensor]]]],
) -> tuple[list[int], list[tuple[Layout, Sequence[Sequence[_Tensor]]]]]:
    """The step's groups `(vLLM group id, layout, states)` split into the ids and the planner's
    `(layout, states)` pairs (the planner checks those); anything else is a `BindingError` naming
    the group.
    """

def write_file(path: str | os.PathLike[str], parts: Sequence[_Buffer]) -> int:
    """Writes `parts` (byte buffers) back to back to `path`, atomically: a temporary that cannot be
    pre-placed (random name, exclusive create, mode 0600), synced, renamed over `path`. The
    directory must exist and not be world-writable without the sticky bit. Returns the bytes
    written; BindingError naming the path for any failure (the target is then unchanged).
    """
