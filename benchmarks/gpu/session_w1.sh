#!/usr/bin/env bash
# One GPU session (2026-12-01, window 1): plugin probe (issue 11), KV-cache stateful run (issue 12) and the
# INT8 kernel probe (issue 10), overlapped: exports and calibration on the CPU cores while the GPU probes and
# builds; timings only once the other jobs' builds are done.  bash benchmarks/gpu/session_w1.sh W DEADLINE
set -u
ROOT=$(pwd); W=${1:?}; DEADLINE=${2:?}
mkdir -p "$W"; : > "$W/steps.jsonl"
. "$ROOT/benchmarks/gpu/steps.sh"
GPU_FREE=$W/stateful/DONE bash benchmarks/gpu/int8_kernels_h200.sh "$W/int8" "$DEADLINE" > "$W/int8.log" 2>&1 &
step probe-plugins 150 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310 benchmarks/gpu/probe_attention_plugins.py --json $W/plugins.json"
bash benchmarks/gpu/stateful_h200.sh "$W/stateful" "$DEADLINE" > "$W/stateful.log" 2>&1
wait
touch "$W/DONE"
