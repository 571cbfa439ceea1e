"""The command line (``python -m recoverssm_rs`` / ``recoverssm``) and what it runs: the end-to-end
demo (:mod:`.demo`), the benchmarks (:mod:`.bench`), the P/D demo over NIXL (:mod:`.pd_demo`) and the
kernel compile check (:mod:`.check_kernels`). Library code never imports this package.
"""
