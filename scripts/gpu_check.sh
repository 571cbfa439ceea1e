#!/usr/bin/env bash
# The GPU checks in one go, for a machine with a CUDA GPU, torch and CuPy (cupy-cuda12x or
# cupy-cuda13x), which may have no Rust toolchain and no network:
#
#   bash scripts/gpu_check.sh [RESULTS_DIR]        (default: gpu-results)
#
# 1. env.txt        GPU, driver, Python and package versions
# 2. gpu_tests.log  `pytest -m gpu tests` (kernels against the host executor, one launch per step,
#    gpu_tests.xml  CUDA-graph capture, no host sync, the commit kernel, the demo on CUDA; the
#                   oracle-backed ones -- vLLM's V2 runner -- need .oracle-cache/, made by
#                   scripts/pack_oracles.sh and carried, on a machine without network)
# 3. gpu_copy.txt   benches/gpu_copy.py: kernels against device-to-device copy bandwidth
#    gpu_copy.json
# 4. commit_gpu.txt benches/commit_gpu.py: the RecoverSSM commit kernel (and .json)
# 5. launch_host.txt benches/launch_host.py: host time per launch (and .json)
# 6. v2_host.txt    benches/vllm_v2_step.py --cuda: the V2 half-step's host time on CUDA tensors
# 7. summary.txt    exit status and wall time of every stage
#
# The package: the recoverssm_rs that $PYTHON (default python3) already imports, else the wheel in
# wheelhouse/ (made anywhere by scripts/build_wheel.sh) installed into $RECOVERSSM_SITE (default: a
# private folder made for this run by mktemp -d, mode 0700, removed at exit; CuPy's kernel cache
# goes there too unless $CUPY_CACHE_DIR is set). Every stage runs even when an earlier one failed;
# the exit status is non-zero when any did. Stage time limits (seconds): $GPU_TESTS_TIMEOUT (240),
# $GPU_BENCH_TIMEOUT (200), $COMMIT_BENCH_TIMEOUT (120), $LAUNCH_HOST_TIMEOUT (60), $V2_HOST_TIMEOUT (90); extra benchmark arguments: $GPU_BENCH_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-gpu-results}
mkdir -p "$results"
results=$(cd "$results" && pwd)
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# A GPU run must not pass by skipping its GPU tests (tests/conftest.py turns a missing GPU, torch or
# CuPy into an error).
export RECOVERSSM_REQUIRE_GPU=1
# The oracles' files carried in .oracle-cache/ (scripts/pack_oracles.sh): the oracle-backed GPU
# tests read them there, with no download (a GPU machine may have no network).
for d in .oracle-cache/vllm-*; do [[ -d "$d/extracted" ]] && export RECOVERSSM_VLLM_CACHE=${RECOVERSSM_VLLM_CACHE:-$PWD/$d}; done
for d in .oracle-cache/sglang-*; do [[ -d "$d/extracted" ]] && export RECOVERSSM_SGLANG_CACHE=${RECOVERSSM_SGLANG_CACHE:-$PWD/$d}; done
[[ -n "${RECOVERSSM_VLLM_CACHE:-}${RECOVERSSM_SGLANG_CACHE:-}" ]] && export RECOVERSSM_NO_DOWNLOAD=${RECOVERSSM_NO_DOWNLOAD:-1}
# This run's own folder (no fixed /tmp path another user could have made first): the installed
# wheel, which goes first on PYTHONPATH, and CuPy's kernel cache, where it can surely write.
work=$(mktemp -d "${TMPDIR:-/tmp}/recoverssm_gpu_check.XXXXXXXX") || { echo "gpu_check: mktemp -d failed" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$work/cupy_cache}
summary="$results/summary.txt"
: >"$summary"
failed=0

stage() {  # stage NAME TIMEOUT COMMAND...
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  echo "== $name" >&2
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  echo "$name: rc=$rc, $(( $(date +%s) - t0 )) s$( ((rc == 124 || rc == 137)) && echo ' (time limit)')" | tee -a "$summary" >&2
  ((rc == 0)) || failed=1
}

# The package.
if ! "$py" -c "import recoverssm_rs._core" >/dev/null 2>&1; then
  site=${RECOVERSSM_SITE:-$work/site}
  wheel=$(ls -t wheelhouse/recoverssm_rs-*.whl 2>/dev/null | head -n 1)
  if [[ -z "$wheel" ]]; then
    echo "gpu_check: recoverssm_rs is not importable and wheelhouse/ holds no wheel (bash scripts/build_wheel.sh)" | tee -a "$summary" >&2
    exit 2
  fi
  "$py" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" "$wheel" || {
    echo "gpu_check: installing $wheel failed" | tee -a "$summary" >&2
    exit 2
  }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  # The commit the wheel was built from (a copied checkout's own git metadata may be stale).
  [[ -f wheelhouse/COMMIT ]] && export RECOVERSSM_COMMIT="$(cat wheelhouse/COMMIT)"
fi

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo -dirty)"
  echo "wheel built from: ${RECOVERSSM_COMMIT:-(no wheel used)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
  "$py" - <<'PY'
import platform
import importlib
print("python", platform.python_version(), platform.machine())
for name in ("numpy", "torch", "cupy", "recoverssm_rs"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"), getattr(m, "__file__", ""))
    except Exception as exc:  # report, do not stop: the stages below say what fails
        print(name, "NOT IMPORTABLE:", exc)
try:
    import torch
    print("torch cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    import cupy
    print("cupy runtime", cupy.cuda.runtime.runtimeGetVersion(), "driver", cupy.cuda.runtime.driverGetVersion())
except Exception as exc:
    print("CUDA probe failed:", exc)
PY
} >"$results/env.txt" 2>&1
cat "$results/env.txt" >&2

stage gpu-tests "${GPU_TESTS_TIMEOUT:-240}" \
  "$py" -m pytest -m gpu tests -p no:cacheprovider -rs -v --durations=15 \
  --junitxml="$results/gpu_tests.xml" >"$results/gpu_tests.log" 2>&1
tail -n 25 "$results/gpu_tests.log" >&2

# shellcheck disable=SC2086
stage gpu-bench "${GPU_BENCH_TIMEOUT:-200}" \
  "$py" benches/gpu_copy.py --json ${GPU_BENCH_ARGS:-} >"$results/gpu_copy.json" 2>"$results/gpu_copy.txt"
cat "$results/gpu_copy.txt" >&2

stage commit-bench "${COMMIT_BENCH_TIMEOUT:-120}" \
  "$py" benches/commit_gpu.py --json "$results/commit_gpu.json" >"$results/commit_gpu.txt" 2>&1
cat "$results/commit_gpu.txt" >&2

# The V2 half-step's host time on real CUDA tensors bound as vLLM binds them (issue: <= 12 us at 48
# layers), then where it goes.
stage v2-host "${V2_HOST_TIMEOUT:-90}" \
  bash -c '"$0" benches/vllm_v2_step.py --cuda --requests 1 64 256 1024 --reps 500 &&
    "$0" benches/vllm_v2_step.py --cuda --split --requests 64' "$py" >"$results/v2_host.txt" 2>&1
cat "$results/v2_host.txt" >&2

stage launch-host "${LAUNCH_HOST_TIMEOUT:-60}" \
  "$py" benches/launch_host.py --repeat 1000 --json "$results/launch_host.json" >"$results/launch_host.txt" 2>&1
cat "$results/launch_host.txt" >&2

cat "$summary" >&2
exit $failed
