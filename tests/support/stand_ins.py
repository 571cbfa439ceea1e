"""Stand-ins for the modules an oracle's code imports but the paths it runs never call (kernels,
servers, distributed groups, ...), shared by the checkpoint oracles: a stand-in module answers every
attribute with a stand-in class (:func:`module_attr`), and a stand-in class answers every attribute,
call and subscript with another."""

from __future__ import annotations

from typing import Any


class StandInMeta(type):
    """Stand-in classes: any attribute is another stand-in, calls and subscripts give stand-ins,
    ``X | Y`` works in annotations evaluated at import, decorators return what they decorate."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> StandInMeta:
        return super().__new__(mcs, name, bases, ns)

    def __init__(cls, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> None:
        super().__init__(name, bases, ns)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return StandInMeta(name, (StandIn,), {})

    def __call__(cls, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return type.__call__(cls)

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls


class StandIn(metaclass=StandInMeta):
    """An instance of a stand-in class: attributes are stand-in classes; called, it returns the one
    callable it is given (a decorator) or another stand-in."""

    def __init_subclass__(cls, **kw: Any) -> None:
        pass

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return StandInMeta(name, (StandIn,), {})

    def __call__(self, *a: Any, **k: Any) -> Any:
        return a[0] if len(a) == 1 and callable(a[0]) and not k else StandIn()


def module_attr(name: str) -> Any:
    """A stand-in module's ``__getattr__``: every public name is a stand-in class."""
    if name.startswith("__"):
        raise AttributeError(name)
    return StandInMeta(name, (StandIn,), {})
