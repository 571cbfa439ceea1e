"""Type stubs for the compiled core, ``recoverssm_rs._core`` (hand-kept: update with the bindings)."""

from collections.abc import Sequence
from typing import Any, Literal, final

__version__: str
__all__ = [
    "BackendUnavailableError",
    "BindingError",
    "CommitLaunch",
    "CommitPlanner",
    "ErrorWord",
    "FusedCopy",
    "GroupPlan",
    "GroupPlanner",
    "KernelLaunch",
    "Layout",
    "LayoutError",
    "LayoutFingerprint",
    "Plan",
    "PlanError",
    "Planner",
    "RawBuffer",
    "RecoverSSMError",
    "StateSpec",
    "StorageGuard",
    "TransferPlan",
    "__version__",
    "_validate_copy_funcs",
    "align_post_process",
    "align_pre_copy",
    "check_cache_sizes",
    "check_commit_counts",
    "check_fused_step",
    "check_device_tables",
    "check_index",
    "commit_grid",
    "commit_meta_table",
    "copy_tiles_launch",
    "describe_arg",
    "gdn_layout",
    "kda_layout",
    "kernel_abi",
    "linear_attention_layout",
    "mamba1_layout",
    "mamba2_layout",
    "pack_launch",
    "plan_transfer",
    "short_conv_layout",
    "state_chunks",
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

    def __new__(cls, backend: str, states: Sequence[StateSpec], num_spec: int = 0) -> Layout: ...
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

def _validate_copy_funcs(
    groups: Sequence[
        tuple[str, Sequence[Sequence[int]], Sequence[str] | None, int | None, int | None, str | None]
    ],
    copy_funcs: Sequence[tuple[str, Sequence[str]]],
) -> dict[str, int]: ...
def mamba1_layout(
    *,
    intermediate_size: int,
    state_size: int,
    conv_kernel: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: _ConvLayoutName = "SD",
    dtype: Any = None,
    ssm_dtype: Any = None,
) -> Layout: ...
def mamba2_layout(
    *,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: _ConvLayoutName = "SD",
    dtype: Any = None,
    ssm_dtype: Any = None,
    logical_window: int | None = None,
    mamba_backend: Literal["triton", "flashinfer", "cpu"] = "triton",
) -> Layout: ...
def short_conv_layout(
    *,
    intermediate_size: int,
    conv_kernel: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: _ConvLayoutName = "SD",
    dtype: Any = None,
) -> Layout: ...
def linear_attention_layout(
    *, num_heads: int, head_dim: int, tp_size: int = 1, num_spec: int = 0, ssm_dtype: Any = None
) -> Layout: ...
def gdn_layout(
    *,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    conv_kernel_size: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: _ConvLayoutName = "SD",
    dtype: Any = None,
    ssm_dtype: Any = None,
    recover_ssm: bool = False,
) -> Layout: ...
def kda_layout(
    *,
    num_heads: int,
    head_dim: int,
    num_k_heads: int | None = None,
    head_k_dim: int | None = None,
    conv_kernel_size: int = 4,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: _ConvLayoutName = "SD",
    dtype: Any = None,
    ssm_dtype: Any = None,
    recover_ssm: bool = False,
) -> Layout: ...

@final
class RawBuffer:
    """Read-only bytes of plan records (supports the buffer protocol; view with numpy)."""

    def __len__(self) -> int: ...

@final
class Plan:
    """One step's copy plan (see :class:`recoverssm_rs.planner.CopyPlan`)."""

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
    @property
    def planner(self) -> Planner: ...
    def execute_host(self) -> None: ...

@final
class Planner:
    """The core planner bound to state tensors (see :class:`recoverssm_rs.planner.CopyPlanner`)."""

    def __new__(
        cls,
        layout: Layout,
        states: Sequence[Sequence[tuple[int, Any, Sequence[int], Sequence[int], str, bool, bool]]],
        keepalive: Any,
    ) -> Planner: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def layout(self) -> Layout: ...
    def plan_align(self, block_table: Any, src_col: Any, dst_col: Any, num_accepted: Any) -> Plan: ...
    def plan_copy(self, src_blocks: Any, dst_blocks: Any) -> Plan: ...
    def state_meta(self) -> RawBuffer: ...

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
    def plan(
        self,
        state_blocks: Any,
        num_accepted: Any,
        query_lens: Any,
        seq_lens: Any = None,
        block_table: Any = None,
        block_size: int | None = None,
        max_requests: int | None = None,
    ) -> RawBuffer:
        """A commit plan (``COMMIT_ROW_DTYPE`` records); ``PlanError`` naming the request otherwise."""
    def check_state_blocks(self, state_blocks: Any, max_requests: int | None = None) -> None: ...

_TensorDesc = tuple[int, Any, Sequence[int], Sequence[int], str, bool, bool]

def commit_meta_table(
    recurrent: Sequence[_TensorDesc],
    corrections: Sequence[_TensorDesc],
    keygate: Sequence[_TensorDesc],
    conv: Sequence[_TensorDesc] | None,
    conv_window: Sequence[_TensorDesc] | None,
    kind: str,
    conv_layout: str,
    conv_kernel_size: int,
) -> RawBuffer:
    """The RecoverSSM commit kernel's table (128-byte ``CommitMeta`` records, one per layer) for
    per-layer tensor descriptions ``(data_ptr, dtype, shape, byte_strides, device, writable)``;
    raises ``BindingError`` naming the layer and tensor the kernel cannot take."""

_DeviceArg = tuple[int, str, Sequence[int], Sequence[int], str]

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
    """The fused state copy of one bound planner (constants checked once)."""

    def __new__(
        cls,
        device_name: str,
        metas: int,
        num_meta: int,
        max_accepted: int,
        num_blocks: int,
        has_temporal: bool,
        chunks: int,
        err: int,
        groups: int = 1,
    ) -> FusedCopy: ...
    def launch(
        self,
        block_table: Any,
        src_col: Any,
        second: Any,
        num_accepted: Any,
        err: Any = None,
        block_size: int | None = None,
        pre_copy: bool = False,
        num_accepted_out: Any = None,
    ) -> KernelLaunch | None:
        """The launch of one step (tensors, CuPy arrays or description tuples; int32)."""
    def step(
        self,
        block_table: Any,
        src_col: Any,
        second: Any,
        num_accepted: Any,
        err: Any = None,
        block_size: int | None = None,
        pre_copy: bool = False,
        num_accepted_out: Any = None,
    ) -> tuple[KernelLaunch | None, int, bool]:
        """``(launch, requests, narrow)``: the launch, or ``narrow`` when inputs must be narrowed first."""
    def check(
        self,
        block_table: Any,
        src_col: Any,
        second: Any,
        num_accepted: Any,
        err: Any = None,
        block_size: int | None = None,
        num_accepted_out: Any = None,
    ) -> int: ...
    @property
    def device_index(self) -> int: ...
    @property
    def groups(self) -> int: ...
    @property
    def chunks(self) -> int: ...
    @property
    def num_meta(self) -> int: ...
    @property
    def has_temporal(self) -> bool: ...

@final
class CommitLaunch:
    """The commit kernel of one state cache (constants and grid checked once)."""

    def __new__(
        cls,
        device_name: str,
        metas: int,
        table: Any,
        num_blocks: int,
        max_requests: int,
        err: int = 0,
        threads: int = ...,
    ) -> CommitLaunch: ...
    def launch(
        self,
        rows: Any,
        num_rows: int | None = None,
        num_accepted: Any = None,
        err: Any = None,
    ) -> KernelLaunch | None: ...
    @property
    def ctas(self) -> tuple[int, int]: ...
    @property
    def num_layers(self) -> int: ...
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

def copy_tiles_launch(
    segments: int, tiles: int, first_tile: int, num_tiles: int, max_ctas: int | None = None
) -> KernelLaunch | None:
    """The launch of one wave of ``rs_copy_tiles``, or ``None`` when it has no tile."""

def state_chunks(max_state_bytes: int) -> int:
    """CTAs per state copy of the fused kernel for states of at most ``max_state_bytes`` bytes."""

def commit_grid(table: Any, threads: int = ...) -> tuple[int, int]:
    """``(rec_ctas, conv_ctas)`` of the commit kernel for a table's bytes."""

def pack_launch(
    name: str, grid: tuple[int, int, int], block: tuple[int, int, int], values: Sequence[int]
) -> KernelLaunch:
    """A launch of kernel ``name`` with raw, range-checked argument values."""

def check_fused_step(
    device_name: str,
    block_table: Any,
    src_col: Any,
    second: Any,
    num_accepted: Any,
    err: Any = None,
    block_size: int | None = None,
    groups: int = 1,
    num_accepted_out: Any = None,
) -> int:
    """Checks a fused step's inputs (int32 or int64); returns the number of requests."""

def check_device_tables(device_name: str, tables: list[Any], groups: int, rows: int) -> None:
    """``PlanError`` unless ``tables`` are one integer ``[>= rows, cols]`` CUDA table per group on
    ``device_name``, of one width and dtype."""

def describe_arg(obj: Any) -> tuple[int, str, list[int], list[int], str] | None:
    """``(data_ptr, dtype, shape, byte_strides, device)`` of a torch tensor, a CuPy array or a numpy
    array; ``None`` for anything else."""

def check_commit_counts(device_name: str, a: Any, min_len: int) -> None:
    """``PlanError`` unless ``a`` is an integer vector on ``device_name`` of ``min_len``+ counts."""

@final
class StorageGuard:
    """Bound tensors and storages with the addresses (and storage sizes) they were bound at."""

    def __new__(
        cls,
        tensors: Sequence[tuple[Any, str, int, str]],
        storages: Sequence[tuple[Any, int, int, str]],
    ) -> StorageGuard: ...
    def check(self) -> None:
        """``BindingError`` naming the first bound tensor or storage whose memory changed."""
    def __len__(self) -> int: ...

def check_cache_sizes(num_layers: int, num_blocks: int, max_requests: int) -> None:
    """``BindingError`` unless a state cache's sizes are in range."""

def check_index(what: str, index: int, len: int) -> int:
    """``index`` as an index into ``len`` items (``PlanError`` naming ``what`` otherwise)."""

def kernel_abi() -> dict[str, Any]:
    """The calling convention of every kernel, the record layouts and the shared constants."""

# Engine-step decisions and the multi-group planner (recoverssm_rs.groups wraps them).
def align_pre_copy(
    block_tables: list[Any], num_computed: Any, num_scheduled: Any, num_accepted: Any,
    running_col: Any, block_size: int, num_spec_blocks: int, fresh: Any = None,
    req_ids: Sequence[Any] | None = None,
) -> bytes: ...
def align_post_process(
    block_tables: list[Any], state_col: Any, num_computed: Any, num_scheduled: Any,
    num_draft: Any, num_accepted: Any, block_size: int, num_spec_blocks: int,
    req_ids: Sequence[Any] | None = None,
) -> bytes: ...

@final
class GroupPlan:
    @property
    def num_copies(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def num_segments(self) -> int: ...
    def group_stats(self) -> list[tuple[int, int, int, int]]: ...
    def execute_host(self) -> None: ...

@final
class GroupPlanner:
    def __new__(
        cls, layouts: Sequence[Layout], states: Sequence[Sequence[Sequence[Any]]], keepalive: Any,
        block_size: int, num_spec_blocks: int,
    ) -> GroupPlanner: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_spec_blocks(self) -> int: ...
    @property
    def device(self) -> str: ...
    def group_sizes(self) -> list[tuple[int, int]]: ...
    def layouts(self) -> list[Layout]: ...
    def state_meta(self) -> RawBuffer: ...
    @property
    def max_blocks(self) -> int: ...
    def plan(
        self, block_tables: list[Any], src_col: Any, dst_col: Any, num_accepted: Any, semantics: str
    ) -> GroupPlan: ...
    def pre_copy(
        self, block_tables: list[Any], num_computed: Any, num_scheduled: Any, num_accepted: Any,
        running_col: Any, fresh: Any = None, req_ids: Sequence[Any] | None = None,
    ) -> tuple[bytes, GroupPlan]: ...
    def post_process(
        self, block_tables: list[Any], state_col: Any, num_computed: Any, num_scheduled: Any,
        num_draft: Any, num_accepted: Any, req_ids: Sequence[Any] | None = None,
    ) -> tuple[bytes, GroupPlan]: ...
    def device_pre_copy(
        self, block_tables: list[Any], num_computed: Any, num_scheduled: Any, running_col: Any,
        fresh: Any = None, req_ids: Sequence[Any] | None = None, num_accepted: Any = None,
        stage_table: bool = True,
    ) -> tuple[bytes, bytes, tuple[int, int, int]]:
        """Host columns (int64 ``prev, curr, src_col``) and the int32 staged step, with the table's shape."""
    def device_post_process(
        self, block_tables: list[Any], state_col: Any, num_computed: Any, num_scheduled: Any,
        num_draft: Any, req_ids: Sequence[Any] | None = None, num_accepted: Any = None,
        stage_table: bool = True,
    ) -> tuple[bytes, bytes, tuple[int, int, int]]:
        """Host ``running`` (int64) and the int32 staged step, with the table's shape."""

# Transfer beyond one pool (rust/python/transfer.rs; recoverssm_rs.transfer wraps them).
@final
class LayoutFingerprint:
    """One rank's pool as a transfer sees it; exchanged at handshake (``encode`` / ``decode``)."""

    def __new__(cls, layout: Layout, *, tp_rank: int = 0, block_size: int = 0) -> LayoutFingerprint: ...
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
    requests: Sequence[tuple[int, int]],
) -> TransferPlan: ...
