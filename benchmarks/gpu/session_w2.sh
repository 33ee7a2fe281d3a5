#!/usr/bin/env bash
# One GPU session (2026-12-01, window 2), trimmed to fit ~11 minutes: the attention pass on BERT-base
# (issue 11), INT8 + TensorRT's implicit INT8 anchor on BERT-base (issue 10), the run loop and vs_torch
# (issue 11), then Ray with one actor on the run loop's engine (issue 13). The three first drivers share
# the GPU while they build and time: their timings overlap and are marked so in RESULTS.
#   bash benchmarks/gpu/session_w2.sh W DEADLINE
set -u
ROOT=$(pwd); W=${1:?}; DEADLINE=${2:?}
mkdir -p "$W"
BIG=bert-base SMALL="" bash benchmarks/gpu/attention_h200.sh "$W/attn" "$DEADLINE" > "$W/attn.log" 2>&1 &
BISECT_GROUPS=attention_qk bash benchmarks/gpu/int8_h200.sh "$W/int8" "$DEADLINE" bert-base > "$W/int8.log" 2>&1 &
MODELS="bert-base minilm" COMPILE=0 NOGRAPHS=1 bash benchmarks/gpu/runloop_h200.sh "$W/loop" "$DEADLINE" > "$W/loop.log" 2>&1
MIN_TOKENS=60000 bash benchmarks/gpu/ray_h200.sh "$W/ray" "$DEADLINE" "$W/loop/bert-base/bert-base.fp16.engine" "$W/loop/bert-base/bert-base.clean.onnx" > "$W/ray.log" 2>&1
wait
touch "$W/DONE"
