"""The benchmarks of ``benches/bench.py``.

- :mod:`.plan_step` — the Python-visible align step (copies planned per second against the number
  of requests) against a per-copy Python loop and vectorised numpy;
- :mod:`.host_copy` — the host executor's bandwidth against the state size, against torch's
  ``copy_`` and index copies;
- :mod:`.gpu_copy` — ``--gpu``: the GPU copy benchmark of the checkout (``benches/gpu_copy.py``);
- :mod:`.plot` — ``--plot FILE.png`` (matplotlib, the ``plot`` extra);
- :mod:`.timing`, :mod:`.progress` — interleaved timing with the spread of its rounds, progress lines;
- :mod:`.command` — the program: options, progress on stderr, tables on stdout, ``--json``.
"""
