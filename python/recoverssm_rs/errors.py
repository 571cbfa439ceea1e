"""The package's exception family.

Every error the package raises on purpose derives from :class:`RecoverSSMError`. Errors caused by
the caller's input (a bad layout, bad tensors, a bad step) are also :class:`ValueError` subclasses,
so code that already catches ``ValueError`` keeps working; :class:`BackendUnavailableError` is also
a :class:`RuntimeError`.

The classes are created by the compiled core (``rust/python/errors.rs``), which raises them for
every rule it enforces; this module re-exports them.
"""

from __future__ import annotations

from ._core import BackendUnavailableError, BindingError, LayoutError, PlanError, RecoverSSMError

__all__ = [
    "RecoverSSMError",
    "LayoutError",
    "BindingError",
    "PlanError",
    "BackendUnavailableError",
]
