#!/usr/bin/env bash
# A short window on the 2026-12-02 session's last ~330 s of device time (staging as in session_w4.sh):
#   bash benchmarks/gpu/session_w10b.sh W DEADLINE_EPOCH   then  poll.sh W 200
# Does `start()` waiting for every worker (bccb9d8) remove the start-up stall that --tokenize-processes 8 showed in
# session_w10? MiniLM fp16 on docs32v (192 documents of distinct lengths), threads and 8 processes alternating.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
N=$(M minilm)
export_clean minilm
step build-fp16-minilm 300 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine"
docs_varied 32 docs32v
RUN() { echo "$T -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/docs32v --no-precision-check ${2:-} --report $W/minilm/$1.json"; }
for i in 1 2; do
  step "run-threads-$i" 60 "$(RUN threads_docs32v_$i)"
  step "run-tp8-$i" 60 "$(RUN tp8_docs32v_$i "--tokenize-processes 8")"
done
step stalls 30 "python3 benchmarks/run_stalls.py $W/minilm/*docs32v*.json --json $W/stalls.json > $W/stalls.md"
rm -rf "$W/docs32v"
touch "$W/DONE"
