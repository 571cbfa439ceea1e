#!/usr/bin/env bash
# Sets up a fresh machine for recoverssm_rs: a virtual environment in .venv (it reuses packages
# already installed system-wide, such as torch), the Python dependencies, and the package installed
# editable (`pip install -e`) through its own build backend: a release build of the extension,
# linked with zig for glibc 2.28 and tagged manylinux_2_28 like the wheel (build_backend/). What it
# installs comes from pyproject.toml: the build requirements (maturin, ziglang), then the extras.
# Idempotent: a second run only installs what is missing and rebuilds what changed. Prints what it
# installs and builds as it goes (pip's and cargo's own progress) and the seconds each step took.
#
#   bash scripts/setup.sh          # runtime: numpy, torch (the `torch` extra)
#   bash scripts/setup.sh --test   # also the test extra for torch's CUDA major: `test` (CUDA 13,
#                                  # as PyPI's torch; also a CPU-only torch) or `test-cu12` (CUDA 12)
set -euo pipefail
cd "$(dirname "$0")/.."

testing=0
[[ "${1:-}" == "--test" ]] && testing=1

step_start=$SECONDS
say() { echo "setup: $*"; }
done_step() { say "$1 ($((SECONDS - step_start)) s)"; step_start=$SECONDS; }

if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv (reusing the system's site-packages)"
  python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"

# unmet KIND...: the requirements of pyproject.toml that .venv does not satisfy (KIND: `build`,
# `project` or an extra; scripts/requirements.py).
unmet() { "$py" scripts/requirements.py unmet "$@"; }

# install WHAT REQ...: pip install the requirements, with pip's own progress.
install() {
  local what=$1
  shift
  say "installing $what: $*"
  "$py" -m pip install "$@"
  done_step "installed $what"
}

# The build requirements: the build below runs in .venv (no isolated build environment).
need=$(unmet build)
[[ -z "$need" ]] || install "the build requirements" $need

# torch first: its CUDA major picks the CuPy and NVRTC wheels of the test extra.
need=$(unmet torch)
[[ -z "$need" ]] || install "torch (a download of several hundred MB)" $need
extras=torch
if ((testing)); then
  cuda=$("$py" scripts/requirements.py torch-cuda)
  test_extra=$("$py" scripts/requirements.py test-extra "$cuda")
  extras+=,$test_extra
  say "torch is built for CUDA $cuda: the $test_extra extra"
  # A CuPy wheel for another CUDA major than torch's shadows the right one
  # (recoverssm_rs.backend_check): remove those installed in .venv.
  wrong=$("$py" scripts/requirements.py foreign-cupy "$test_extra")
  if [[ -n "$wrong" ]]; then
    say "removing" $wrong "(built for another CUDA major than torch's)"
    "$py" -m pip uninstall -y $wrong
  fi
fi

need=$(unmet project ${extras//,/ })
if [[ -n "$need" ]]; then
  say "missing Python dependencies:" $need
else
  say "Python dependencies already installed: ${extras}"
fi
# The extension is abi3 (_core.abi3.so); an interpreter-specific build left by an older checkout
# would shadow it, so remove any.
rm -f python/recoverssm_rs/_core.cpython-*.so
say "installing recoverssm_rs[$extras] editable: what is missing, then the extension (cargo build" \
    "--release, linked by zig; minutes on a first run)"
# -v shows the build's own output (cargo's Compiling lines, maturin's); two kinds of its lines are
# dropped: pip's "Ignoring <pkg>: markers 'extra == ...' don't match" for every extra, and maturin's
# warning that `build-backend` is not `maturin` (it is maturin, wrapped: build_backend/).
"$py" -m pip install -v --no-build-isolation -e ".[$extras]" 2>&1 \
  | { grep -v -E "^ *Ignoring [^ ]+: markers '.*' don't match your environment$|Warning: .build-backend. in pyproject.toml is not set to .maturin." || true; }
done_step "installed recoverssm_rs and built the extension"
"$py" -c "import recoverssm_rs; print('setup: recoverssm_rs', recoverssm_rs.__version__, 'ready in .venv')"
if ((testing)); then
  "$py" -c "
from recoverssm_rs import backend_check
problem = backend_check.gpu_stack_problem()
print('setup: warning:', problem) if problem else None"
fi
