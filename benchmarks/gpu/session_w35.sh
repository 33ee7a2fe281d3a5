#!/usr/bin/env bash
# GPU window w35, for a short H200 window (issue 11's MiniLM `run` wall <= 1.1x GPU, so far measured only on H100s,
# w31-w33), at most 300 s of driver: MiniLM only, this checkout. Six runs from ids over docs128v.jsonl, then
# `run --reference` (the accuracy gate), then two more runs.
# Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w35.sh $HOME/w SECONDS POLL   (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 300 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
minilm_docs128v
NR="--no-precision-check --no-chunking-check"
for i in 1 2 3 4 5 6; do
  step "run-minilm-ids128-G-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl $NR --report $W/minilm/ids128_G_$i.json"
done
step run-ref-minilm 150 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --reference $N.clean.onnx --report $W/minilm/run_ref.json"
for i in 7 8; do
  step "run-minilm-ids128-G-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl $NR --report $W/minilm/ids128_G_$i.json"
done
rm -rf "$W/docs32v" "$W/docs128v"
touch "$W/DONE"
