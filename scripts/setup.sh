#!/usr/bin/env bash
# Sets up a fresh machine for recoverssm_rs: a virtual environment in .venv (it reuses packages
# already installed system-wide, such as torch), the Python dependencies, and the compiled package
# built in release mode with `maturin develop`. Idempotent: a second run only rebuilds what changed.
#
#   bash scripts/setup.sh          # runtime: numpy, torch
#   bash scripts/setup.sh --test   # also pytest, hypothesis, mypy and the NVRTC wheel for kernel checks
set -euo pipefail
cd "$(dirname "$0")/.."

extras=(numpy torch)
if [[ "${1:-}" == "--test" ]]; then
  # cupy-cuda12x imports without a GPU: the kernel checks use CuPy's own NVRTC options.
  extras+=(pytest hypothesis nvidia-cuda-nvrtc-cu12 cupy-cuda12x mypy==2.4.1)
fi

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
missing=()
for pkg in maturin "${extras[@]}"; do
  mod=${pkg//-/_}
  case "$pkg" in
    nvidia-cuda-nvrtc-cu12) probe='import importlib.util,sys; sys.exit(importlib.util.find_spec("nvidia.cuda_nvrtc") is None)' ;;
    cupy-cuda12x) probe='import cupy' ;;
    maturin) probe='import shutil,sys; sys.exit(shutil.which("maturin") is None)' ;;
    mypy==*) probe="import importlib.metadata as m,sys; sys.exit(m.version('mypy') != '${pkg#mypy==}')" ;;
    *) probe="import $mod" ;;
  esac
  "$py" -c "$probe" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  "$py" -m pip install --quiet "${missing[@]}"
fi
# The extension is abi3 (_core.abi3.so); an interpreter-specific build left by an older checkout
# would shadow it, so remove any.
rm -f python/recoverssm_rs/_core.cpython-*.so
# maturin develop installs into the environment named by VIRTUAL_ENV.
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" maturin develop --release --quiet
"$py" -c "import recoverssm_rs; print('setup: recoverssm_rs', recoverssm_rs.__version__, 'ready in .venv')"
