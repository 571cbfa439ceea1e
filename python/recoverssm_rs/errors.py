"""The package's exception family.

Every error the package raises on purpose derives from :class:`RecoverSSMError`. Errors caused by
the caller's input (a bad layout, bad tensors, a bad step) are also :class:`ValueError` subclasses,
so code that already catches ``ValueError`` keeps working; :class:`BackendUnavailableError` is also
a :class:`RuntimeError`.

The classes are created by the compiled core (``rust/python/errors.rs``), which raises them for
every rule it enforces; this module re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ._core import BackendUnavailableError, BindingError, LayoutError, PlanError, RecoverSSMError

__all__ = [
    "RecoverSSMError",
    "LayoutError",
    "BindingError",
    "PlanError",
    "BackendUnavailableError",
]


@contextmanager
def _reading(what: str, error: type[RecoverSSMError]) -> Iterator[None]:
    """Around the reads of a caller's or an engine's objects (by attribute, key, iteration): an
    object of the wrong kind -- a missing attribute, not iterable, not a mapping, a missing key --
    raises ``error`` naming ``what`` and the reason, not Python's own exception. The package's
    errors pass through unchanged."""
    try:
        yield
    except RecoverSSMError:
        raise
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as e:
        raise error(f"{what}: {type(e).__name__}: {e}") from e
