"""The adapter for SGLang's mamba pool: :class:`SglangMambaPool` (SGLang's ``MambaPool``
operations -- copy-on-write, fork, slot clearing, HiCache host copies, the speculative commit
after verify -- over the package's planner), :func:`install` (route a running pool through it) and
:func:`layout_for` (the family layout of a rank, for transfers).

SGLang itself is never imported: every SGLang object is read by attribute.
"""

from .params import layout_for
from .pool import SglangMambaPool, install

__all__ = ["SglangMambaPool", "install", "layout_for"]
