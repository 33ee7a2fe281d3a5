#!/usr/bin/env bash
# Second H200 window of 2026-12-02 (fourth session). w17 showed the copy-engine merge bit-equal to the host merge but no
# faster at batch 16: with the bytes gone, the merge stage still took 2-3 ms per batch (GIL waits), so the loop is bound by
# Python per batch, not by copies. This window measures the loop per batch size (16 / 32 / 64 windows a batch; the zoo
# engines' profiles take up to 64): per-batch Python is paid once per batch, the GPU's time grows with it.
# Staging as in session_w4.sh, started with benchmarks/gpu/start.sh carrying .whl, .whl2 and .whl3:
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w18.sh $HOME/w SECONDS 540
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
fp16_engines_and_docs
for i in 1 2; do
  for m in minilm bert-base; do
    for b in 16 32 64; do
      step "run-$m-host-b$b-$i" 120 "$(run_fp16 $m docs32v host_b${b}_docs32v_$i --batch-size $b --no-copy-engine-merge)"
      step "run-$m-copy-b$b-$i" 120 "$(run_fp16 $m docs32v copy_b${b}_docs32v_$i --batch-size $b --copy-engine-merge)"
    done
  done
done
for m in minilm bert-base; do
  step "run-$m-host-b64-docs128v" 180 "$(run_fp16 $m docs128v host_b64_docs128v --batch-size 64 --no-copy-engine-merge)"
  step "run-$m-copy-b64-docs128v" 180 "$(run_fp16 $m docs128v copy_b64_docs128v --batch-size 64 --copy-engine-merge)"
  step "run-$m-copytp8-b64-docs128v" 180 "$(run_fp16 $m docs128v copytp8_b64_docs128v --batch-size 64 --copy-engine-merge --tokenize-processes 8)"
done
step stalls 60 "python3 benchmarks/run_stalls.py $W/*/*docs*.json --json $W/stalls.json > $W/stalls.md"
touch "$W/DONE"
