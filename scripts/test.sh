#!/usr/bin/env bash
# Runs every test of recoverssm_rs on a fresh machine: sets up .venv (scripts/setup.sh --test),
# then clippy, rustfmt, ruff, the generated stub's check and stubtest, the Rust tests, a build of
# the Rust benchmarks (dev profile), a strict type check of the package (mypy, [tool.mypy] of
# pyproject.toml), and the Python tests (which include the kernel checks that need no GPU; tests
# marked `gpu` skip without one), spread over worker processes (pytest-xdist), with the slowest
# tests listed at their end.
# Each stage prints its command and its seconds; a table of all stages closes the run (also after a
# failure, which stops the run).
#
#   bash scripts/test.sh [PYTEST_ARGS...]    # arguments go to pytest
#   RECOVERSSM_TEST_WORKERS=N                # pytest workers (default: one a core, at most one per
#                                            # 2 GiB of available memory; 1: one process, no xdist)
set -euo pipefail
cd "$(dirname "$0")/.."

pytest_args=("$@")
names=() secs=() results=()

table() {
  echo
  echo "== stages"
  printf '%-12s %8s  %s\n' stage seconds result
  local i total=0
  for i in "${!names[@]}"; do
    printf '%-12s %8s  %s\n' "${names[$i]}" "${secs[$i]}" "${results[$i]}"
  done
  printf '%-12s %8s\n' total "$(awk -v s="${secs[*]}" 'BEGIN { n = split(s, a, " "); t = 0; for (i = 1; i <= n; i++) t += a[i]; printf "%.1f", t }')"
}

# stage NAME COMMAND...: runs COMMAND, records its seconds; a failure prints the table and exits.
stage() {
  local name=$1 rc=0 t0=$EPOCHREALTIME
  shift
  echo "== $name: $*"
  "$@" || rc=$?
  names+=("$name")
  secs+=("$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')")
  results+=("$( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)")")
  echo "== $name: ${secs[-1]} s, ${results[-1]}"
  if ((rc != 0)); then
    table
    exit "$rc"
  fi
}

stage setup bash scripts/setup.sh --test
# Checks that keep the code in shape: clippy (with the bindings; its Checking lines show progress
# through the minutes a fresh machine takes), rustfmt, ruff (lint and format), the _core stub
# regenerated from the bindings and the extension setup built (it must equal the committed one:
# `python scripts/gen_stubs.py` rewrites it), and the stub against the compiled extension.
stage clippy cargo clippy --all-targets --features python -- -D warnings
stage rustfmt cargo fmt --check
stage ruff .venv/bin/ruff check python tests benches build_backend scripts
stage ruff-format .venv/bin/ruff format --check python tests benches build_backend scripts
stage stubs .venv/bin/python scripts/gen_stubs.py --check
stage stubtest .venv/bin/python -m mypy.stubtest recoverssm_rs._core
# Build the tests first with cargo's Compiling lines (minutes on a fresh machine), then run them quietly.
stage cargo-build cargo test --no-run
stage cargo-test cargo test --quiet
# The benchmarks compile and link. In the dev profile: it reuses the dependencies the tests built
# (seconds), where `cargo bench --no-run` rebuilds them all optimised with LTO (minutes) to check the same.
stage cargo-bench cargo build --benches
stage mypy .venv/bin/python -m mypy
# The kernel compile checks must run here, not skip: RECOVERSSM_REQUIRE_NVRTC=1 fails if NVRTC is missing.
# The test files are independent: pytest-xdist runs them in RECOVERSSM_TEST_WORKERS processes (work
# stealing evens out the long oracle traces), each with one torch thread so that the workers do
# not fight over the cores. The oracles' wheels download once whatever the number of workers
# (tests/support/vllm_oracle.py takes a file lock around the download).
workers=${RECOVERSSM_TEST_WORKERS:-$(awk -v cores="$(nproc)" '/^MemAvailable:/ {
  w = int($2 / (2 * 1024 * 1024)); if (w > cores) w = cores; if (w < 1) w = 1; print w }' /proc/meminfo)}
parallel=()
((workers > 1)) && parallel=(-n "$workers" --dist worksteal)
stage pytest env RECOVERSSM_REQUIRE_NVRTC=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q "${parallel[@]}" \
  --durations=15 --durations-min=1 tests "${pytest_args[@]}"
table
