#!/usr/bin/env bash
# Sets up a fresh machine for recoverssm_rs: a virtual environment in .venv (it reuses packages
# already installed system-wide, such as torch), the Python dependencies, and the compiled package
# built in release mode with `maturin develop`. Idempotent: a second run only rebuilds what changed.
# Prints what it installs and builds as it goes (pip's and cargo's own progress) and the seconds
# each step took.
#
#   bash scripts/setup.sh          # runtime: numpy, torch
#   bash scripts/setup.sh --test   # also pytest, hypothesis, mypy, ruff, matplotlib and the NVRTC
#                                  # wheel for the kernel checks
set -euo pipefail
cd "$(dirname "$0")/.."

extras=(numpy torch)
if [[ "${1:-}" == "--test" ]]; then
  # cupy-cuda12x imports without a GPU: the kernel checks use CuPy's own NVRTC options.
  # matplotlib: the `bench --plot` tests. ruff: the lint stage of scripts/test.sh.
  # triton: vLLM's own Triton kernels run (interpreted, on the CPU) by the vLLM conformance oracle.
  # nixl-cu12: the P/D transfer tests (its UCX backend moves CPU memory between processes).
  extras+=(pytest hypothesis nvidia-cuda-nvrtc-cu12 cupy-cuda12x mypy==2.4.1 ruff==0.17.5 matplotlib triton
           nixl-cu12==1.5.1)
fi

step_start=$SECONDS
say() { echo "setup: $*"; }
done_step() { say "$1 ($((SECONDS - step_start)) s)"; step_start=$SECONDS; }

if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv (reusing the system's site-packages)"
  python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
missing=()
for pkg in maturin "${extras[@]}"; do
  mod=${pkg//-/_}
  case "$pkg" in
    nvidia-cuda-nvrtc-cu12) probe='import importlib.util,sys; sys.exit(importlib.util.find_spec("nvidia.cuda_nvrtc") is None)' ;;
    cupy-cuda12x) probe='import cupy' ;;
    nixl-cu12==*) probe="import importlib.metadata as m,sys; sys.exit(m.version('nixl-cu12') != '${pkg#*==}')" ;;
    maturin) probe='import shutil,sys; sys.exit(shutil.which("maturin") is None)' ;;
    *==*) probe="import importlib.metadata as m,sys; sys.exit(m.version('${pkg%%==*}') != '${pkg#*==}')" ;;
    *) probe="import $mod" ;;
  esac
  "$py" -c "$probe" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  note=""
  [[ " ${missing[*]} " == *" torch "* ]] && note=" (torch is a download of several hundred MB)"
  say "installing ${missing[*]}$note"
  # pip's own progress (Collecting / Downloading / Installing) shows what is happening.
  "$py" -m pip install "${missing[@]}"
  done_step "installed ${missing[*]}"
else
  say "Python dependencies already installed: maturin ${extras[*]}"
fi
# The extension is abi3 (_core.abi3.so); an interpreter-specific build left by an older checkout
# would shadow it, so remove any.
rm -f python/recoverssm_rs/_core.cpython-*.so
say "building the extension (cargo build --release through maturin develop; minutes on a first run)"
# maturin develop installs into the environment named by VIRTUAL_ENV. Two kinds of its lines are
# dropped, the rest (cargo's Compiling lines, maturin's own) shown: pip's "Ignoring <pkg>: markers
# 'extra == ...' don't match" for every extra, and maturin's warning that `build-backend` is not
# `maturin` (it is maturin, wrapped: build_backend/pep517_backend.py).
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" maturin develop --release 2>&1 \
  | { grep -v -E "^Ignoring [^ ]+: markers '.*' don't match your environment$|Warning: .build-backend. in pyproject.toml is not set to .maturin." || true; }
done_step "built and installed the extension"
"$py" -c "import recoverssm_rs; print('setup: recoverssm_rs', recoverssm_rs.__version__, 'ready in .venv')"
