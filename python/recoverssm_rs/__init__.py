"""recoverssm_rs — recurrent-state layouts, copy plans and RecoverSSM for hybrid SSM serving.

Serving engines for hybrid SSM / linear-attention models keep per-layer recurrent state (conv
windows, temporal / recurrent states) in a block pool and must copy it between blocks for prefix
caching and speculative decoding. This package makes the state-layout contract explicit and checked
(persistent states first, temporary workspace after), plans the copies in a Rust core, executes them
on CPU tensors (a Rust host executor) or CUDA tensors (CuPy kernels), and implements RecoverSSM's
verify-records workspace and commit.

The rules live in the compiled core (:mod:`recoverssm_rs._core`); errors are raised as the classes
of :mod:`recoverssm_rs.errors`.
"""

import logging as _logging

from . import errors
from ._core import Layout, StateSpec, __version__
from .contract import validate_copy_funcs
from .errors import (
    BackendUnavailableError,
    BindingError,
    LayoutError,
    PlanError,
    RecoverSSMError,
)
from .planner import CopyPlan, Planner

_logging.getLogger("recoverssm_rs").addHandler(_logging.NullHandler())


def __getattr__(name: str) -> object:
    # StateCache needs torch; import it on first use so the rest of the package works without.
    if name == "StateCache":
        from .speculative.state_cache import StateCache

        return StateCache
    raise AttributeError(f"module 'recoverssm_rs' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public names (StateCache included, though it is imported lazily) and the submodules
    # already imported; not the module's own helpers.
    submodules = [k for k, v in globals().items() if type(v) is type(errors) and not k.startswith("_")]
    return sorted(set(__all__) | set(submodules))


__all__ = [
    "__version__",
    "Layout",
    "StateSpec",
    "validate_copy_funcs",
    "Planner",
    "CopyPlan",
    "StateCache",
    "errors",
    "RecoverSSMError",
    "LayoutError",
    "BindingError",
    "PlanError",
    "BackendUnavailableError",
]
