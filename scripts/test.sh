#!/usr/bin/env bash
# Runs every test of recoverssm_rs on a fresh machine: sets up .venv (scripts/setup.sh --test),
# then the Rust tests, a build of the Rust benchmarks, a type check of the package (mypy), and the
# Python tests (which include the kernel checks that need no GPU; tests marked `gpu` skip without
# one).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "== cargo test"
cargo test --quiet
echo "== cargo bench --no-run"
cargo bench --quiet --no-run
echo "== mypy (the package's type annotations and the _core stub)"
.venv/bin/python -m mypy python/recoverssm_rs --ignore-missing-imports
echo "== pytest"
# The kernel compile checks must run here, not skip: fail if NVRTC is missing.
RECOVERSSM_REQUIRE_NVRTC=1 .venv/bin/python -m pytest -q tests "$@"
