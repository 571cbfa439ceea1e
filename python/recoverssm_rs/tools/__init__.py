"""The command line (``python -m recoverssm_rs`` / ``recoverssm``) and what it runs: the end-to-end
demo (:mod:`.demo`), the layout and preset tables. The development tools (benchmarks, the kernel
compile check, the two-process P/D demo) live in the source checkout, not in the wheel
(:mod:`.dev_commands`). Library code never imports this package.
"""
