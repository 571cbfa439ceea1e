"""Descriptions of tensors for the core: what the compiled core needs to check a tensor without
touching its memory. These functions only read attributes (never data, never device memory); every
rule about what they describe lives in the core.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["describe_arg", "require_arg", "describe_tensor", "host_ints"]

#: ``(data_ptr, dtype, shape, byte_strides, device)``
ArgDesc = tuple[int, str, list[int], list[int], str]


def describe_arg(x: Any) -> ArgDesc | None:
    """``(data_ptr, dtype, shape, byte_strides, device)`` of a torch tensor, a
    ``__cuda_array_interface__`` object (a CuPy array) or a numpy array; ``None`` for anything
    else."""
    if hasattr(x, "data_ptr") and hasattr(x, "element_size"):  # torch.Tensor
        es = x.element_size()
        return (int(x.data_ptr()), str(x.dtype), list(x.shape), [int(st) * es for st in x.stride()], str(x.device))
    iface = getattr(x, "__cuda_array_interface__", None)
    if iface is not None:
        dt = np.dtype(iface["typestr"])
        shape = [int(n) for n in iface["shape"]]
        strides = iface.get("strides")
        if strides is None:  # C order
            strides, acc = [0] * len(shape), dt.itemsize
            for i in range(len(shape) - 1, -1, -1):
                strides[i], acc = acc, acc * max(shape[i], 1)
        dev = getattr(getattr(x, "device", None), "id", None)
        return (int(iface["data"][0]), dt.name, shape, [int(st) for st in strides],
                f"cuda:{int(dev)}" if dev is not None else "cuda")
    if isinstance(x, np.ndarray):
        return (int(x.ctypes.data), x.dtype.name, list(x.shape), list(x.strides), "cpu")
    return None


def require_arg(x: Any, what: str) -> ArgDesc:
    """:func:`describe_arg` of ``x``, or :class:`~recoverssm_rs.errors.BindingError` naming ``what``
    when ``x`` is none of the kinds it describes."""
    d = describe_arg(x)
    if d is None:
        from .errors import BindingError

        raise BindingError(f"{what}: expected a CUDA tensor, a CuPy array or a device address, got {type(x).__name__}")
    return d


def describe_tensor(t: Any) -> tuple[int, str, list[int], list[int], str, bool, bool]:
    """``(data_ptr, dtype, shape, byte_strides, device, writable, requires_grad)`` of a state tensor:
    a torch tensor or a numpy array (``writable`` is False for a read-only numpy array; torch does
    not record whether the memory under a tensor is writable, see :doc:`the integration guide
    <integration>`).

    Raises:
        TypeError: ``t`` is neither, or is a torch tensor that is not dense (sparse, nested, ...).
    """
    if isinstance(t, np.ndarray):
        d = describe_arg(t)
        assert d is not None
        return (*d, bool(t.flags.writeable), False)
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):
        layout = getattr(t, "layout", None)
        if layout is not None and str(layout) != "torch.strided":
            raise TypeError(f"a {layout} tensor cannot be bound: state tensors must be dense (torch.strided)")
        d = describe_arg(t)
        assert d is not None
        return (*d, True, bool(getattr(t, "requires_grad", False)))
    raise TypeError(f"state tensors must be torch tensors or numpy arrays, got {type(t).__name__}")


def host_ints(x: Any, name: str) -> Any:
    """A host integer array for the core: numpy arrays pass through without a copy, CPU tensors
    become numpy views; the core checks the dtype and shape.

    Raises:
        PlanError: ``x`` is a tensor in device memory (reading it would synchronise the device), or
            a tensor of a dtype numpy lacks.
    """
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "device") and hasattr(x, "numpy"):  # torch.Tensor
        from .errors import PlanError

        if x.device.type != "cpu":
            raise PlanError(
                f"{name} is on {x.device}; host plans read host inputs (copying them to the host "
                "would synchronise the device). Pass CPU arrays, or launch the device-side copy "
                "with the GPU executor, which reads its inputs in device memory."
            )
        try:
            return x.detach().numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): never an integer array
            raise PlanError(f"{name} must be an int32 or int64 array, got {x.dtype}") from None
    return np.asarray(x)
