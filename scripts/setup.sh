#!/usr/bin/env bash
# Sets up a fresh machine for recoverssm_rs: a virtual environment in .venv (it reuses packages
# already installed system-wide, such as torch), the Python dependencies, and the package installed
# editable (`pip install -e`) through its own build backend: a release build of the extension,
# linked with zig for glibc 2.28 and tagged manylinux_2_28 like the wheel (build_backend/). What it
# installs comes from pyproject.toml: the build requirements (maturin, ziglang), then the extras.
# Idempotent: a second run only installs what is missing and rebuilds what changed. Prints what it
# installs and builds as it goes (pip's and cargo's own progress) and the seconds each step took.
#
# Before it downloads anything it says what and about how big; a torch already installed (in .venv
# or system-wide) is reused, never downloaded again.
#
#   bash scripts/setup.sh             # runtime: numpy, torch (the `torch` extra)
#   bash scripts/setup.sh --no-torch  # numpy only: layouts, copy plans and the host executor on
#                                     # numpy arrays, `recoverssm layout` / `presets`; no demo
#   bash scripts/setup.sh --test      # also the test extra for torch's CUDA major: `test` (CUDA 13,
#                                     # as PyPI's torch; also a CPU-only torch) or `test-cu12` (CUDA 12)
set -euo pipefail
cd "$(dirname "$0")/.."

testing=0 with_torch=1
for arg in "$@"; do
  case $arg in
    --test) testing=1 ;;
    --no-torch) with_torch=0 ;;
    *)
      echo "setup: unknown argument $arg (usage: bash scripts/setup.sh [--test | --no-torch])" >&2
      exit 2
      ;;
  esac
done
if ((testing && !with_torch)); then
  echo "setup: --test needs torch (the tests run on torch tensors): drop --no-torch" >&2
  exit 2
fi

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

# The installer of the dependencies: uv (a pip-compatible installer, itself installed into .venv
# by pip on the first run) links what it installs out of its cache (~/.cache/uv) instead of
# unpacking the wheels again, so the next checkout's .venv gets torch in seconds where pip takes
# minutes. RECOVERSSM_INSTALLER=pip keeps to pip; so does a uv that cannot be installed.
installer=${RECOVERSSM_INSTALLER:-uv}
if [[ $installer == uv && ! -x .venv/bin/uv ]]; then
  say "installing uv, the installer of the dependencies (about 40 MB in .venv)"
  "$py" -m pip install -q uv || { say "uv could not be installed: pip installs the dependencies"; installer=pip; }
  done_step "installed uv"
fi

# install WHAT REQ...: install the requirements into .venv, with the installer's own progress.
install() {
  local what=$1
  shift
  say "installing $what: $*"
  if [[ $installer == uv ]]; then
    .venv/bin/uv pip install --python "$py" "$@"
  else
    "$py" -m pip install "$@"
  fi
  done_step "installed $what"
}

# The build requirements: the build below runs in .venv (no isolated build environment).
need=$(unmet build)
if [[ -n "$need" ]]; then
  say "the build requirements are missing: zig, the linker, takes about 0.4 GB in .venv"
  install "the build requirements" $need
fi

# torch first: its CUDA major picks the CuPy and NVRTC wheels of the test extra. The sizes below
# were measured with torch 2.15.0 from PyPI on Linux x86-64 (its wheel and every dependency it pulls).
extras=torch
if ((!with_torch)); then
  extras=
  say "--no-torch: torch is not installed; layouts, copy plans and the host executor work on numpy" \
      "arrays, the demo and the benchmarks need torch"
elif [[ -z "$(unmet torch)" ]]; then
  say "reusing the installed torch: $("$py" scripts/requirements.py installed torch)"
else
  need=$(unmet torch)
  say "torch is not installed (not in .venv, not system-wide): it comes from PyPI next ($need)."
  say "  PyPI's torch for Linux x86-64 brings NVIDIA's CUDA libraries and Triton, whether or not this"
  say "  machine has a GPU: about 3.0 GB to download and 5.3 GB in .venv (torch 1.2 GB, CUDA"
  say "  libraries 3.0 GB, Triton 1.0 GB). Free space where .venv is: $(df -Ph .venv | awk 'NR == 2 { print $4 }')."
  say "  Without a GPU, a CPU-only torch installed beforehand (system-wide or in .venv) is reused"
  say "  instead; \`bash scripts/setup.sh --no-torch\` installs no torch at all (no demo then)."
  install "torch" $need
fi
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
  ((testing)) && say "the test extra's CuPy, NIXL, matplotlib and linters take about 0.6 GB in .venv"
  install "the missing Python dependencies" $need
else
  say "Python dependencies already installed: ${extras:-numpy}"
fi
# The extension is abi3 (_core.abi3.so); an interpreter-specific build left by an older checkout
# would shadow it, so remove any.
rm -f python/recoverssm_rs/_core.cpython-*.so
target=recoverssm_rs${extras:+[$extras]}
say "installing $target editable (pip, through the package's build backend): the extension (cargo build" \
    "--release, linked by zig; minutes on a first run)"
# -v shows the build's own output (cargo's Compiling lines, maturin's); two kinds of its lines are
# dropped: pip's "Ignoring <pkg>: markers 'extra == ...' don't match" for every extra, and maturin's
# warning that `build-backend` is not `maturin` (it is maturin, wrapped: build_backend/).
"$py" -m pip install -v --no-deps --no-build-isolation -e ".${extras:+[$extras]}" 2>&1 \
  | { grep -v -E "^ *Ignoring [^ ]+: markers '.*' don't match your environment$|Warning: .build-backend. in pyproject.toml is not set to .maturin." || true; }
done_step "installed recoverssm_rs and built the extension"
"$py" -c "import recoverssm_rs; print('setup: recoverssm_rs', recoverssm_rs.__version__, 'ready in .venv')"
say "run it with .venv/bin/python -m recoverssm_rs COMMAND or .venv/bin/recoverssm COMMAND (or" \
    "\`recoverssm COMMAND\` after \`source .venv/bin/activate\`)"
if ((testing)); then
  "$py" -c "
from recoverssm_rs import backend_check
problem = backend_check.gpu_stack_problem()
print('setup: warning:', problem) if problem else None"
fi
