"""The development tools of the recoverssm_rs checkout: code the wheel does not ship.

- :mod:`.bench` — the planner and host-executor benchmarks (``benches/bench.py``);
- :mod:`.check_kernels` — the kernels compiled with this machine's NVRTC (``scripts/check_kernels.py``);
- :mod:`.pd_demo`, :mod:`.pd_demo_cli`, :mod:`.pd_processes` — prefill and decode in two processes
  over NIXL (``scripts/pd_demo.py``).

Each runs from a checkout after ``bash scripts/setup.sh`` with ``.venv/bin/python SCRIPT``; the
installed package's command line (``recoverssm bench``, ``check-kernels``, ``pd-demo``) says so in
one line. The tools use the installed ``recoverssm_rs`` like any other program.
"""
