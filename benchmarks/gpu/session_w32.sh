#!/usr/bin/env bash
# GPU window w32 (issue 11: run wall <= 1.1x GPU on MiniLM), at most 420 s of driver: MiniLM only, the plugins' library
# built beside the export. A = a517296 (planning on the thread feeding the GPU, the new default; carried in
# .gpu/old), B = this checkout (the same with leaner planning: plan_windows by C calls, wrap_spans' runs by numpy,
# text_feeds without the ids copy and with shared masks), BS = B with --switch-interval-us 50 (with one thread planning
# and feeding the GPU, a numpy copy that drops the GIL may wait up to the interval to get it back from a merging thread).
# Four rounds in rotated order over docs128v.jsonl, then host_profile.py on B.
# Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w32.sh $HOME/w 420 410   (carry .whl2 .native .trtinc .whl .whl4 .gpu/old)
# with .gpu/old: `rm -rf .gpu/old && mkdir -p .gpu/old && git archive a517296 trtforge | tar -x -C .gpu/old`
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 420 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
ab_roots
minilm_docs128v
NR="--no-precision-check --no-chunking-check"
declare -A CODE=([A]="$TA" [B]="$TB" [BS]="$TB") FLAGS=([A]="" [B]="" [BS]="--switch-interval-us 50")
ORDERS=("A B BS" "BS B A" "B A BS" "BS A B")
for i in 1 2 3 4; do
  for v in ${ORDERS[$((i - 1))]}; do
    step "run-minilm-ids128-$v-$i" 120 "${CODE[$v]} -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl $NR ${FLAGS[$v]} --report $W/minilm/ids128_${v}_$i.json"
  done
done
step host-profile-minilm-B 150 "$TB benchmarks/host_profile.py $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl --runs 1 --out $W/minilm/host_profile_B.json"
step "run-ref-minilm-B" 150 "$TB -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --reference $N.clean.onnx --report $W/minilm/run_ref_B.json"
rm -rf "$W/docs32v" "$W/docs128v"
touch "$W/DONE"
