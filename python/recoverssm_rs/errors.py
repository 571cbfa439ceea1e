"""The package's exception family.

Every error the package raises on purpose derives from :class:`RecoverSSMError`. Errors caused by
the caller's input (a bad layout, bad tensors, a bad step) are also :class:`ValueError` subclasses,
so code that already catches ``ValueError`` keeps working. The compiled core raises these same
classes: the rules live in Rust, the classes live here.
"""

from __future__ import annotations

__all__ = [
    "RecoverSSMError",
    "LayoutError",
    "BindingError",
    "PlanError",
    "BackendUnavailableError",
]


class RecoverSSMError(Exception):
    """Base class of every error raised by recoverssm_rs."""


class LayoutError(RecoverSSMError, ValueError):
    """A state layout (or an engine's copy-function registration) breaks the layout contract.

    The message names the backend, the state (index and name), what is wrong and how to fix it.
    """


class BindingError(RecoverSSMError, ValueError):
    """State tensors do not match the layout they are bound to (dtype, shape, strides, device)."""


class PlanError(RecoverSSMError, ValueError):
    """A copy or commit step is invalid: bad block ids, columns, accepted counts, or a hazard.

    Raised before anything moves: a rejected step leaves every state unchanged.
    """


class BackendUnavailableError(RecoverSSMError, RuntimeError):
    """The tensors need an executor this machine lacks (for example CUDA tensors without CuPy)."""
