#!/usr/bin/env bash
# GPU window w33 (issue 11: run wall <= 1.1x GPU on MiniLM), at most 400 s of driver: MiniLM only. w32 saw the leaner
# planning (B) run in bursts of 10-21 ms batches in 2 of 4 runs, where a517296 (A) ran none; a full pass of Python's cyclic
# collector stops every thread for that long. A = a517296 (.gpu/old), G = this checkout (leaner planning, the collector off
# while the loop runs), B = G with --no-gc-pause (the leaner planning alone). Four rounds in rotated order over
# docs128v.jsonl, then host_profile.py on G.
# Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w33.sh $HOME/w 400 395   (carry .whl2 .native .trtinc .whl .whl4 .gpu/old)
# with .gpu/old: `rm -rf .gpu/old && mkdir -p .gpu/old && git archive a517296 trtforge | tar -x -C .gpu/old`
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 400 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
ab_roots
minilm_docs128v
NR="--no-precision-check --no-chunking-check"
declare -A CODE=([A]="$TA" [B]="$TB" [G]="$TB") FLAGS=([A]="" [B]="--no-gc-pause" [G]="")
ORDERS=("A G B" "B G A" "G A B" "B A G")
for i in 1 2 3 4; do
  for v in ${ORDERS[$((i - 1))]}; do
    step "run-minilm-ids128-$v-$i" 120 "${CODE[$v]} -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl $NR ${FLAGS[$v]} --report $W/minilm/ids128_${v}_$i.json"
  done
done
step host-profile-minilm-G 150 "$TB benchmarks/host_profile.py $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl --runs 1 --out $W/minilm/host_profile_G.json"
rm -rf "$W/docs32v" "$W/docs128v"
touch "$W/DONE"
