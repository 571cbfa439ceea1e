"""The vLLM-compatible copy-function check, as an engine calls it at start-up.

vLLM's ``validate_mamba_state_copy_funcs(mamba_groups, copy_funcs)`` accepts any non-empty copyable
prefix so that RecoverSSM's 4-state layout (2 persistent + 2 workspace) can start; this version keeps
that and restores what the relaxed check lost: each copy function must apply to the state at its
index, and the groups must agree on block size, speculative blocks and cache mode. The rules are
applied by the compiled core; this module only reads the engine's objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._core import _validate_copy_funcs
from .errors import LayoutError, _reading

__all__ = ["validate_copy_funcs", "copy_func_name"]


def _backend_name(value: Any) -> str:
    """A backend given as a string or as an enum member (``MambaAttentionBackendEnum.GDN_ATTN``)."""
    if isinstance(value, str):
        return value
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)


def _field(group: Any, *names: str) -> Any:
    for name in names:
        if isinstance(group, Mapping):
            if name in group:
                return group[name]
        elif hasattr(group, name):
            return getattr(group, name)
    return None


def _probe_copy_spec(func: Any) -> str | None:
    """``"conv"`` or ``"temporal"`` from what a copy-spec function does (vLLM's
    ``MambaStateCopyFunc``: ``func(state, block_ids, cur_block_idx, num_accepted_tokens)`` returns
    a spec with ``start_addr`` and ``num_elements``), called on a small probe tensor; ``None`` when
    it does not behave like either (or torch is missing).

    With one accepted token both kinds copy block ``block_ids[cur]`` whole. With two, a temporal
    copy takes block ``block_ids[cur + 1]`` whole; a conv copy stays in block ``block_ids[cur]``
    (its window shifted by one row in the SD layout; in the DS layout vLLM refuses the offset with
    an ``AssertionError``, the shift being fused into its kernel)."""
    try:
        import torch
    except ImportError:
        return None
    state = torch.zeros((3, 2, 4), dtype=torch.float32)
    block, numel = 2 * 4 * 4, 2 * 4
    base = state.data_ptr()

    def spec(accepted: int) -> tuple[int, int] | None:
        out = func(state, [0, 1, 2], 0, accepted)
        addr, n = getattr(out, "start_addr", None), getattr(out, "num_elements", None)
        return (addr, n) if isinstance(addr, int) and isinstance(n, int) else None

    try:
        if spec(1) != (base, numel):
            return None
    except Exception:  # noqa: BLE001  # not a copy-spec function
        return None
    try:
        two = spec(2)
    except AssertionError:
        return "conv"
    except Exception:  # noqa: BLE001
        return None
    if two == (base + block, numel):
        return "temporal"
    if two == (base + 4 * 4, numel - 4):
        return "conv"
    return None


def copy_func_name(func: Any) -> str:
    """The name the core's contract takes for an engine's copy function: a string as it is; a
    function by what it does (:func:`_probe_copy_spec`: ``"conv"`` or ``"temporal"``), else by its
    ``__name__`` (a ``functools.partial`` by its function's), which the core's table must know."""
    if isinstance(func, str):
        return func
    kind = _probe_copy_spec(func) if callable(func) else None
    if kind is not None:
        return kind
    name = getattr(func, "__name__", None)
    if name is None and hasattr(func, "func"):  # functools.partial
        name = getattr(func.func, "__name__", None)
    return name if isinstance(name, str) else repr(func)


def _copy_func_names(backend: Any, seq: Any) -> list[str]:
    """The names of one backend's copy functions, a sequence; a string (or bytes) would be read
    character by character, so it is refused naming the backend."""
    if isinstance(seq, (str, bytes)):
        raise LayoutError(
            f"copy_funcs[{_backend_name(backend)!r}] must be a sequence of copy functions, got the string {seq!r}; "
            f"wrap a single one in a list"
        )
    return [copy_func_name(f) for f in seq]


def _group_tuple(group: Any) -> tuple[Any, ...]:
    backend = _field(group, "mamba_type", "backend")
    shapes = _field(group, "shapes")
    if backend is None or shapes is None:
        raise LayoutError(f"each group needs a backend ('mamba_type' or 'backend') and 'shapes'; got {group!r}")
    dtypes = _field(group, "dtypes")
    mode = _field(group, "mamba_cache_mode", "cache_mode")
    block_size = _field(group, "block_size")
    spec_blocks = _field(group, "num_speculative_blocks")
    name = _backend_name(backend)
    # A field of the wrong kind is named with its backend (a string would be read character by
    # character).
    for field_name, value in (("shapes", shapes), ("dtypes", dtypes)):
        if isinstance(value, (str, bytes)):
            raise LayoutError(f"{name}: {field_name} must be a list, one entry per state, got the string {value!r}")
    with _reading(f"{name}: shapes (a list of shapes, each a sequence of integers)", LayoutError):
        shape_lists = [list(shape) for shape in shapes]  # integers, converted (never truncated) by the core
    with _reading(f"{name}: dtypes (a list of dtypes)", LayoutError):
        dtype_names = None if dtypes is None else [str(d) for d in dtypes]
    return (
        name,
        shape_lists,
        dtype_names,
        block_size,
        spec_blocks,
        None if mode is None else str(_backend_name(mode)),
    )


def validate_copy_funcs(
    groups: Iterable[Any] | Mapping[Any, Any],
    copy_funcs: Mapping[Any, Sequence[Any]],
) -> dict[str, int]:
    """Check an engine's copy-function registration against the copyable-prefix contract.

    Args:
        groups: the engine's recurrent groups: vLLM's ``mamba_groups`` mapping (its keys are the
            ``MambaSpec`` objects), or any iterable of objects / dicts with ``mamba_type`` (or
            ``backend``), ``shapes`` and optionally ``dtypes``, ``block_size``,
            ``num_speculative_blocks`` and ``mamba_cache_mode``.
        copy_funcs: per backend (a name or an enum member), the copy functions it registers in state
            order: ``"conv"`` / ``"temporal"`` or vLLM's own copy-spec functions, recognised by name.

    Returns:
        ``{backend: number of leading states covered by copy functions}``.

    Raises:
        LayoutError: a backend without an entry, an empty registration, more copy functions than
            states ("expected a non-empty copyable prefix"), a copy kind that cannot apply to the
            state at its index, or groups disagreeing on block size / speculative blocks / cache
            mode. The message names the backend and the state.
    """
    with _reading("groups", LayoutError):
        group_list = list(groups.keys()) if isinstance(groups, Mapping) else list(groups)
        tuples = [_group_tuple(g) for g in group_list]
    with _reading("copy_funcs (a mapping: backend -> copy functions)", LayoutError):
        funcs = [(_backend_name(backend), _copy_func_names(backend, seq)) for backend, seq in copy_funcs.items()]
    return dict(_validate_copy_funcs(tuples, funcs))
