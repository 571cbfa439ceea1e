#!/usr/bin/env bash
# Copies the oracles' extracted files (the few modules the tests load from vLLM's and SGLang's
# wheels, about 0.5 MiB) into .oracle-cache/ (ignored by git), so that a machine without network --
# the GPU machine -- runs the oracle-backed GPU tests: carry .oracle-cache with the working tree and
# scripts/gpu_check.sh points the tests at it (RECOVERSSM_VLLM_CACHE, RECOVERSSM_SGLANG_CACHE, no
# download). Run it where the test command has run once (it fills the oracles' cache):
#
#   bash scripts/pack_oracles.sh          (then, e.g., carry .oracle-cache and wheelhouse)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
# Extract every member the oracles load (from the cached wheels; downloads them if needed).
PYTHONPATH=tests "$py" - <<'PY'
from support import sglang_oracle, vllm_oracle, vllm_v2_oracle

for name, load in (("vLLM", vllm_oracle.load), ("vLLM V2", vllm_v2_oracle.load), ("SGLang", sglang_oracle.load)):
    load()
    print(f"pack_oracles: {name} oracle loaded")
PY
root=${XDG_CACHE_HOME:-$HOME/.cache}/recoverssm_rs
for d in "$root"/vllm-* "$root"/sglang-*; do
  [[ -d "$d/extracted" ]] || continue
  dest=.oracle-cache/$(basename "$d")
  rm -rf "$dest"
  mkdir -p "$dest"
  cp -a "$d/extracted" "$dest/extracted"
  echo "pack_oracles: $dest ($(du -sh "$dest" | cut -f1))"
done
