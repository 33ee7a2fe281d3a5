#!/usr/bin/env bash
# A short H200 window on the fourth session's last device minutes (MiniLM only): the stages' cpu_seconds (new) at batch
# 64, host merge vs copy-engine merge: is the merge stage's time work or waiting? Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w20.sh $HOME/w 240 250
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
export_clean minilm
build_fp16 minilm
docs_varied 32 docs32v
for i in 1 2; do
  step "run-minilm-host-$i" 60 "$(run_fp16 minilm docs32v host_b64_docs32v_$i)"
  step "run-minilm-copy-$i" 60 "$(run_fp16 minilm docs32v copy_b64_docs32v_$i --copy-engine-merge)"
done
step "run-minilm-host-b16" 60 "$(run_fp16 minilm docs32v host_b16_docs32v --batch-size 16)"
touch "$W/DONE"
