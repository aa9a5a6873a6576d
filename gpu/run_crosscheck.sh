#!/bin/bash
# On a GPU host, from the repository root, after gpu/host_setup.sh installed the bundles into $DEST:
#   bash gpu/run_crosscheck.sh start RUNTIME [ARGS...]  register the runtimes, link the model, start
#        benchmarks/crosscheck_vllm_bench.py --runtime RUNTIME --model <the host's model> ARGS detached
#   bash gpu/run_crosscheck.sh wait SECONDS             wait until it ends (or SECONDS pass), print its tail
#   bash gpu/run_crosscheck.sh collect                  copy its table, JSON and logs to $OUT
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST=${DEST:-/tmp/tunelab-rt}
PY=${PYTHON:-python3}
export TUNELAB_HOME=${TUNELAB_HOME:-$REPO/.tunelab}
ORCH=$(ls -d "$DEST"/orchestrator-*/site 2>/dev/null | head -1)
export PYTHONPATH="$ORCH:$REPO"
export DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
RUN=$DEST/crosscheck
mkdir -p "$RUN" "$TUNELAB_HOME/models"

case "${1:-}" in
start)
  RT=$2; shift 2
  $PY -m tunelab.host.offline_register "$DEST" || exit 1
  [ -e "$TUNELAB_HOME/models/llama-1b" ] || ln -s "$DEST/model" "$TUNELAB_HOME/models/llama-1b"
  setsid nohup $PY benchmarks/crosscheck_vllm_bench.py --runtime "$RT" --model "$TUNELAB_HOME/models/llama-1b" \
    --json "$RUN/xcheck.json" "$@" > "$RUN/xcheck.txt" 2>&1 < /dev/null &
  echo $! > "$RUN/pid"
  echo "cross-check started (pid $(cat "$RUN/pid")), output $RUN/xcheck.txt"
  ;;
wait)
  T=${2:-540}; t0=$(date +%s)
  while kill -0 "$(cat "$RUN/pid")" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$T" ]; do sleep 5; done
  grep -a -E "round .*/|^concurrency|verdict|server up|Traceback|Error" "$RUN/xcheck.txt" | tail -25
  kill -0 "$(cat "$RUN/pid")" 2>/dev/null && echo "STILL RUNNING" || echo "CROSS-CHECK DONE"
  ;;
collect)
  OUTD=${OUT:?set OUT}
  cp "$RUN/xcheck.txt" "$RUN/xcheck.json" "$OUTD/" 2>/dev/null
  nvidia-smi > "$OUTD/nvidia-smi.txt" 2>&1
  ls -la "$OUTD"
  ;;
*) echo "usage: $0 start RUNTIME [ARGS...] | wait SECONDS | collect"; exit 2;;
esac
