"""Type stubs for the compiled core, ``recoverssm_rs._core`` (hand-kept: update with the bindings)."""

from typing import Any, Literal, Sequence

__version__: str

Role = Literal["persistent", "workspace"]
CopyKindName = Literal["conv", "temporal"]
ConvLayoutName = Literal["SD", "DS"]

class StateSpec:
    """One state tensor of a layer (per block if persistent, per request if workspace)."""

    def __init__(
        self,
        name: str,
        shape: Sequence[int],
        dtype: Any,
        role: Role = "persistent",
        copy: CopyKindName | None = None,
        conv_layout: ConvLayoutName | None = None,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def role(self) -> Role: ...
    @property
    def copy(self) -> CopyKindName | None: ...
    @property
    def conv_layout(self) -> ConvLayoutName | None: ...
    @property
    def nbytes(self) -> int | None: ...
    def to_dict(self) -> dict[str, Any]: ...

class Layout:
    """A validated per-layer layout: persistent states first, workspace after."""

    def __init__(self, backend: str, states: Sequence[StateSpec], num_spec: int = 0) -> None: ...
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
    conv_kernel_size: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: ConvLayoutName = "SD",
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
    conv_kernel_size: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: ConvLayoutName = "SD",
    dtype: Any = None,
    ssm_dtype: Any = None,
    replay_ring: int | None = None,
) -> Layout: ...
def short_conv_layout(
    *,
    hidden_size: int,
    conv_kernel_size: int,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: ConvLayoutName = "SD",
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
    conv_layout: ConvLayoutName = "SD",
    dtype: Any = None,
    ssm_dtype: Any = None,
    recover_ssm: bool = False,
) -> Layout: ...
def kda_layout(
    *,
    num_heads: int,
    head_dim: int,
    conv_kernel_size: int,
    num_k_heads: int | None = None,
    head_k_dim: int | None = None,
    tp_size: int = 1,
    num_spec: int = 0,
    conv_layout: ConvLayoutName = "SD",
    dtype: Any = None,
    ssm_dtype: Any = None,
    recover_ssm: bool = False,
) -> Layout: ...

class RawBuffer:
    """Read-only bytes of plan records (supports the buffer protocol; view with numpy)."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Plan:
    """One step's copy plan (see :class:`recoverssm_rs.planner.CopyPlan`)."""

    def segments(self) -> RawBuffer: ...
    def rows(self) -> RawBuffer: ...
    def wave_starts(self) -> RawBuffer: ...
    def tiles(self, tile_bytes: int = 65536) -> tuple[RawBuffer, RawBuffer]: ...
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

class Planner:
    """The core planner bound to state tensors (see :class:`recoverssm_rs.planner.CopyPlanner`)."""

    def __init__(
        self,
        layout: Layout,
        states: Sequence[Sequence[tuple[int, Any, Sequence[int], Sequence[int], str, bool]]],
        keepalive: Any,
    ) -> None: ...
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
    def plan_commit(
        self,
        state_blocks: Any,
        num_accepted: Any,
        query_lens: Any,
        seq_lens: Any = None,
        block_table: Any = None,
        block_size: int | None = None,
        max_requests: int | None = None,
    ) -> RawBuffer: ...
    def check_state_blocks(self, state_blocks: Any, max_requests: int | None = None) -> None: ...
    def state_meta(self) -> RawBuffer: ...

_TensorDesc = tuple[int, Any, Sequence[int], Sequence[int], str, bool]

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

def check_device_address(a: _DeviceArg, what: str) -> None:
    """``BindingError`` unless the described argument lives in CUDA memory."""

def device_vector(a: _DeviceArg, what: str, min_len: int) -> tuple[int, int]:
    """``(ptr, len)`` of a contiguous 1-D int32 CUDA vector of at least ``min_len`` elements."""

def device_block_table(a: _DeviceArg) -> tuple[int, int, int, int]:
    """``(ptr, rows, cols, row_stride_elements)`` of a 2-D int32 CUDA block table."""

def check_step_args(
    device_name: str,
    block_table: _DeviceArg,
    vectors: Sequence[tuple[str, _DeviceArg]],
    err: _DeviceArg | None = None,
    block_size: int | None = None,
) -> int:
    """The number of requests of a fused-kernel step whose device inputs pass the core's checks
    (``PlanError`` otherwise)."""

def check_commit_counts(device_name: str, a: _DeviceArg, min_len: int) -> None:
    """``PlanError`` unless ``a`` is an integer vector on ``device_name`` of ``min_len``+ counts."""

def check_commit_rows(device_name: str, a: _DeviceArg, num_rows: int | None = None) -> int:
    """The number of 32-byte commit rows in a contiguous row buffer on ``device_name`` (``PlanError``
    when it is elsewhere, strided, or holds fewer than ``num_rows``)."""

def check_fused_launch(
    num_meta: int,
    num_requests: int,
    max_accepted: int,
    num_blocks: int,
    chunks: int,
    block_size: int | None,
    bt_rows: int,
) -> None:
    """Ranges of the fused state-copy kernels' scalar parameters."""

def check_tile_range(first_tile: int, num_tiles: int) -> None:
    """A wave's tile range of ``rs_copy_tiles`` (32-bit indices)."""

def check_commit_launch(
    num_layers: int, num_rows: int, num_blocks: int, max_requests: int, rec_ctas: int, conv_ctas: int
) -> None:
    """Ranges of the commit kernel's scalar parameters."""

# --- transfer (rust/python/transfer.rs) ---

class LayoutFingerprint:
    """One rank's pool as a transfer sees it; exchanged at handshake (``encode`` / ``decode``)."""

    def __init__(self, layout: Layout, *, tp_rank: int = 0, block_size: int = 0) -> None: ...
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
    def conv_layout(self) -> ConvLayoutName | None: ...
    @property
    def conv_kernel_size(self) -> int | None: ...
    @property
    def state_names(self) -> list[str]: ...
    @property
    def state_nbytes(self) -> list[int]: ...
    @property
    def conv_geometry(self) -> list[tuple[ConvLayoutName, int, int] | None]: ...
    def with_rank(self, tp_rank: int) -> LayoutFingerprint: ...
    def check_compatible(self, destination: LayoutFingerprint) -> None: ...

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
