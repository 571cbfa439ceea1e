"""`Forward`: a read-only attribute that a thin Python class forwards to the compiled object it wraps."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

__all__ = ["Forward"]


class Forward(Generic[T]):
    """A read-only attribute read from the wrapped object: ``Forward("core")`` on a class attribute
    ``name`` makes ``obj.name`` return ``obj.core.name``. The class annotation gives its type::

        class Planner:
            num_blocks: Forward[int] = Forward("core", "Blocks of the pool.")
    """

    def __init__(self, via: str, doc: str | None = None) -> None:
        self.via = via
        self.name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forward[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.via), self.name)

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{type(obj).__name__}.{self.name} is read-only")

    def __repr__(self) -> str:
        return f"Forward({self.via!r}, name={self.name!r})"
