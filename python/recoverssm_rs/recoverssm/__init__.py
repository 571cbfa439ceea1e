"""Deprecated: the old import path of :mod:`recoverssm_rs.speculative` (renamed in 0.2.0).

``recoverssm_rs.recoverssm`` and each module under it (``.state_cache``, ``.memory_report``,
``.recurrence`` and its modules) still import in 0.2.0, with a :class:`DeprecationWarning`, and give
the very same classes and functions as ``recoverssm_rs.speculative``. The old path is removed in
0.3.0.
"""

import warnings

warnings.warn(
    "recoverssm_rs.recoverssm is renamed recoverssm_rs.speculative; import recoverssm_rs.speculative"
    " instead (the old path is removed in 0.3.0)",
    DeprecationWarning,
    stacklevel=2,
)
