"""``python -m recoverssm_rs bench``: the package's benchmarks, runnable from an installed wheel.

- :mod:`.plan_step` — the Python-visible align step (copies planned per second against the number
  of requests) against a per-copy Python loop and vectorised numpy;
- :mod:`.host_copy` — the host executor's bandwidth against the state size, against torch's
  ``copy_`` and index copies;
- :mod:`.gpu_copy` — ``--gpu``: the GPU copy benchmark of a source checkout (``benches/gpu_copy.py``);
- :mod:`.plot` — ``--plot FILE.png`` (matplotlib, the ``plot`` extra);
- :mod:`.command` — the subcommand: options, progress on stderr, tables on stdout, ``--json``.

The scripts ``benches/plan_step.py`` and ``benches/host_copy.py`` call these modules.
"""

from .command import add_parser

__all__ = ["add_parser"]
