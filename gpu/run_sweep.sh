#!/bin/bash
# On a GPU host, from the repository root, after gpu/host_setup.sh installed the bundles into $DEST:
#   bash gpu/run_sweep.sh start PLAN...  register the installed vLLM runtimes with tunelab (gpu-<version>),
#                                        link the model(s), start `tunelab run PLAN` detached (survives this shell);
#                                        several plans run one after the other in that one detached job
#   bash gpu/run_sweep.sh wait SECONDS   wait until the sweep ends (or SECONDS pass), print progress; with OUT set
#                                        it then collects (below) what has finished so far, so that a machine
#                                        given back before the next call loses only the trials after this one
#   bash gpu/run_sweep.sh stop           end the sweep early (its process group and any vLLM server left)
#   bash gpu/run_sweep.sh collect        pack the warehouse export, report.md + plots (tunelab evidence-report),
#                                        logs and bundles into $OUT/evidence.tar.gz (RESULTS=0: without bundles)
# Everything runs with the host's python3 + PYTHONPATH (orchestrator bundle + this repository).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST=${DEST:-/tmp/tunelab-rt}
PY=${PYTHON:-python3}
export TUNELAB_HOME=${TUNELAB_HOME:-$REPO/.tunelab}
ORCH=$(ls -d "$DEST"/orchestrator-*/site 2>/dev/null | head -1)
export PYTHONPATH="$ORCH:$REPO"
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false PYTHONUNBUFFERED=1
RUN=$DEST/sweep
mkdir -p "$RUN" "$TUNELAB_HOME/models"
# the Llama-3.1-8B-shaped model, when gpu/host_setup.sh built it (MODEL_SHAPE=llama-3.1-8b): plans name it
# ../.tunelab/models/llama-8b (the ~1.1B one is linked as llama-1b by `start`)
[ -f "$DEST/model-llama-3.1-8b/model.safetensors.index.json" ] && [ ! -e "$TUNELAB_HOME/models/llama-8b" ] && \
  ln -s "$DEST/model-llama-3.1-8b" "$TUNELAB_HOME/models/llama-8b"
# A detached sweep whose parent shell has ended is reparented; where PID 1 does not reap (a minimal init), it stays a
# zombie after it exits and `kill -0` still succeeds: the 2026-12-02 H200 run waited 2 minutes past the sweep's end.
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$s" ] && [ "${s#Z}" = "$s" ]; }

case "${1:-}" in
start)
  shift; [ $# -ge 1 ] || { echo "usage: $0 start PLAN..."; exit 2; }
  $PY -m tunelab.host.offline_register "$DEST" || exit 1
  [ -e "$TUNELAB_HOME/models/llama-1b" ] || ln -s "$DEST/model" "$TUNELAB_HOME/models/llama-1b"
  $PY -m tunelab.cli runtime list
  # every plan is checked before the first server boots
  for PLAN in "$@"; do $PY -m tunelab.cli plan check "$PLAN" || exit 1; done
  # append: a second sweep on the same host keeps the first one's log; back-to-back plans share the machine's
  # state (compile cache), which is the point of running them in one job
  setsid nohup bash -c 'for p in "$@"; do '"$PY"' -m tunelab.cli run "$p"; done' _ "$@" >> "$RUN/sweep.log" 2>&1 < /dev/null &
  echo $! > "$RUN/pid"
  echo "sweep started (pid $(cat "$RUN/pid")), log $RUN/sweep.log"
  ;;
wait)
  T=${2:-540}; t0=$(date +%s)
  while alive "$(cat "$RUN/pid")" && [ $(( $(date +%s) - t0 )) -lt "$T" ]; do sleep 5; done
  grep -a -E "trial [0-9]+/|ready in|boot failed|: ok;|: boot_failed|: failed|loaded|Finished in state" "$RUN/sweep.log" | grep -av "Task run" | tail -40
  alive "$(cat "$RUN/pid")" && echo "STILL RUNNING" || echo "SWEEP DONE"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  # Why: on 2026-12-07 a machine was given back between a `wait` that ended with the sweep still running and the
  # next call, and the three finished trials went with it. Every wait now brings back what it can.
  [ -n "${OUT:-}" ] && bash "$REPO/gpu/run_sweep.sh" collect | tail -2
  ;;
collect)
  OUTD=${OUT:?set OUT}
  E=$RUN/evidence; rm -rf "$E"; mkdir -p "$E/logs"
  cp "$RUN/sweep.log" "$E/" 2>/dev/null
  cp "$TUNELAB_HOME"/logs/*/*.log "$E/logs/" 2>/dev/null
  [ -f "$TUNELAB_HOME/warehouse.duckdb" ] && $PY -m tunelab.cli export --out "$E/warehouse" 2>&1 | tail -3
  # the same report.md + plots as the committed evidence runs, from the exported Parquet
  [ -d "$E/warehouse" ] && $PY -m tunelab.cli evidence-report "$E" 2>&1 | tail -3
  # RESULTS=0 leaves the result bundles out (the Parquet export holds the same rows; keeps the archive small)
  [ "${RESULTS:-1}" = 1 ] && cp -r "$TUNELAB_HOME/results" "$E/results" 2>/dev/null
  $PY -m tunelab.cli runtime list > "$E/runtimes.txt" 2>&1
  nvidia-smi > "$E/nvidia-smi.txt" 2>&1
  tar -C "$RUN" -czf "$OUTD/evidence.tar.gz" evidence && ls -la "$OUTD"
  ;;
stop)
  # End a sweep early (the device time is running out): its process group (the detached job and `tunelab run`),
  # then any vLLM server left (started in sessions of their own). Finished trials are on disk and in the warehouse;
  # `collect` next. Never `pkill -f` a pattern typed on the same command line: it matches that shell too (the
  # 2026-12-03 session lost a call that way).
  P=$(cat "$RUN/pid" 2>/dev/null)
  [ -n "$P" ] && kill -TERM -- "-$P" 2>/dev/null
  sleep 2
  pkill -TERM -f 'vllm[.]entrypoints[.]cli[.]main' 2>/dev/null
  alive "${P:-0}" && echo "sweep still stopping (pid $P)" || echo "SWEEP STOPPED"
  ;;
*) echo "usage: $0 start PLAN... | wait SECONDS | stop | collect"; exit 2;;
esac
