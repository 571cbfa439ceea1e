#!/usr/bin/env bash
# Builds the recoverssm_rs wheel into wheelhouse/ (release build, abi3: one wheel for CPython 3.11
# and newer on x86-64 Linux). Use it to take the package to a machine without a Rust toolchain,
# such as a GPU machine that runs scripts/gpu_check.sh.
#
#   bash scripts/build_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null   # the .venv with maturin
rm -rf wheelhouse
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" maturin build --release --quiet --out wheelhouse
# The commit the wheel was built from, for the records of a run elsewhere (scripts/gpu_check.sh).
echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo -dirty)" \
  >wheelhouse/COMMIT
ls wheelhouse/*.whl
cat wheelhouse/COMMIT
