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
snap_root() {  # snap_root NAME SRC: a root of its own for the code in SRC/trtforge (later calls recopy the tree)
  local r=$HOME/$1; rm -rf "$r"; mkdir -p "$r"; cp -r "$2/trtforge" "$r/trtforge"
  ln -s "$ROOT/zoo" "$ROOT/calib_data" "$ROOT/configs" "$ROOT/benchmarks" "$r/"; echo "$r"
}
SNAPA=$(snap_root snapA "$ROOT/.gpu/old"); SNAPB=$(snap_root snapB "$ROOT")
TA="cd $SNAPA && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$SNAPA:\$PYTHONPATH \$PY310"
TB="cd $SNAPB && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$SNAPB:\$PYTHONPATH \$PY310"
T=$TB
plugin_build &  # beside the export (CPU), falling back to the carried library
N=$(M minilm); mkdir -p "$W/minilm"
step "export-minilm" 300 "$P312 -m trtforge export --config $CFG/minilm.yaml -o $N.onnx" && step "clean-minilm" 120 "$P312 -m trtforge clean $N.onnx"
wait
step build-fp16_def-minilm 300 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC --plugin-library $PLUG -o $N.fp16_def.engine" &
docs_varied 32 docs32v
mkdir -p "$W/docs128v"; for k in 1 2 3 4; do for f in "$W"/docs32v/*.txt; do cp "$f" "$W/docs128v/${k}_$(basename "$f")"; done; done
step pretokenize-128 180 "$T benchmarks/gpu/pretokenize.py $W/docs128v $N.tokenizer $W/docs128v.jsonl"
wait
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
