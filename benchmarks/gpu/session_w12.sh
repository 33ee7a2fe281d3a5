#!/usr/bin/env bash
# A short H200 window (staging as in session_w4.sh; the real MiniLM as .whl2/gtpkg). Run from the project root:
#   bash benchmarks/gpu/session_w12.sh W DEADLINE_EPOCH   then  poll.sh W 540
# Issue 11 (`run` wall <= 1.1x GPU): w11 found the merge path the loop's bottleneck (the submitting thread waiting for
# slots held by batches being merged, while the collector rarely waited for the GPU). --overlap-merges (default) merges
# each batch on one merge thread while the collector goes on; --no-overlap-merges is the previous loop. MiniLM fp16 on
# docs32v, three runs each, interleaved.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
N=$(M minilm)

export_clean minilm
step build-fp16-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine"
docs_varied 32 docs32v
RUN() { echo "$T -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check ${2:-} --report $W/minilm/$1.json"; }
for i in 1 2 3; do
  step "run-overlap-$i" 120 "$(RUN overlap_docs32v_$i)"
  step "run-waiting-$i" 120 "$(RUN waiting_docs32v_$i --no-overlap-merges)"
done
step "run-overlap-slots4" 120 "$(RUN overlap_slots4_docs32v_1 '--slots 4')"
step stalls 60 "python3 benchmarks/run_stalls.py $W/minilm/*docs*.json --json $W/stalls.json > $W/stalls.md"
touch "$W/DONE"
