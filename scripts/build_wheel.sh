#!/usr/bin/env bash
# Builds the recoverssm_rs wheel into wheelhouse/ (release build, abi3: one wheel for CPython 3.11
# and newer; tagged manylinux_2_28_x86_64, linked by zig for glibc 2.28 and newer). Use it to take
# the package to a machine without a Rust toolchain, such as a GPU machine that runs
# scripts/gpu_check.sh. It is `pip wheel .` through the package's build backend (build_backend/),
# in the .venv of scripts/setup.sh, which has the build requirements (maturin, ziglang).
#
#   bash scripts/build_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null   # the .venv with maturin and ziglang
rm -rf wheelhouse
# -v shows cargo's and maturin's output; pip's lines about the extras' markers and maturin's note
# that the build backend is not plain `maturin` (it is maturin, wrapped) are dropped.
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
  .venv/bin/python -m pip wheel -v --no-deps --no-build-isolation --wheel-dir wheelhouse . 2>&1 \
  | { grep -v -E "^ *Ignoring [^ ]+: markers '.*' don't match your environment$|Warning: .build-backend. in pyproject.toml is not set to .maturin." || true; }
# The commit the wheel was built from, for the records of a run elsewhere (scripts/gpu_check.sh).
echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo -dirty)" \
  >wheelhouse/COMMIT
ls wheelhouse/*.whl
cat wheelhouse/COMMIT
