"""The CUDA launch layer: kernel loading (:mod:`.module`), the copy kernels (:mod:`.copy`) and the
RecoverSSM commit kernel (:mod:`.commit`).

Every launch is built by the Rust core (grid, block and the packed argument buffer, after checking
every argument); this layer only compiles the kernels once, finds the caller's stream and hands the
core's buffer to ``cuLaunchKernel``. Importing it needs neither CuPy nor a GPU: CuPy is imported on
first use, and a missing CuPy or GPU raises :class:`~recoverssm_rs.errors.BackendUnavailableError`.
:mod:`recoverssm_rs.gpu` is the public face of this package.
"""
