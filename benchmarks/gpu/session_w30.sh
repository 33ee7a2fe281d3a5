#!/usr/bin/env bash
# H200 window w30 (issue 11: run wall <= 1.1x GPU on MiniLM; 1.5x torch eager at 64x512), two phases.
# Phase A, this checkout's code (snapshotted into $HOME/snapA at the start: later calls copy the dev tree over $ROOT):
# - w29's questions, never run: a merged batch's windows let go (this code) against baf12a4 (.gpu/old), MiniLM from ids;
#   text planned in worker processes (--plan-processes 8) against the planning threads;
# - the loop's minor page faults (runtime.host.loop_minor_faults, new), every run;
# - MiniLM at --chunk 512 (an engine with one seq <= 512 profile): the GPU's time per window doubles while the host's
#   stays, so it says how far the host's cost per window is the bound;
# - py-spy (GIL, 500 Hz) over docs128v.jsonl (4x docs32v); run --reference gates; vs_torch.py, then engine and torch
#   once more for BERT-base (64x512's margin over 1.5x is thin across windows).
# Phase B: benchmarks/gpu/w30b/trtforge (the dev machine's next change; untracked, carried by the start call) with
# benchmarks/gpu/w30b/READY, snapshotted into $HOME/snapB and interleaved with snapA (MiniLM ids three rounds, text two,
# BERT-base ids two, MiniLM run --reference).
# Staging as in session_w4.sh (the last part carries .whl3 .whl5; keep the tracked tree small), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w30.sh $HOME/w 1150 540   (carry .whl2 .native .trtinc .whl .whl4 .gpu/old)
# with .gpu/old: `rm -rf .gpu/old && mkdir -p .gpu/old && git archive baf12a4 trtforge | tar -x -C .gpu/old`
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
# At most 950 s from now whatever start.sh was given (the device budget left after machines were refused); steps are
# ordered by what the window is for, so that the deadline cuts the least needed ones.
CAP=$(( $(date +%s) + 950 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
snap_root() {  # snap_root NAME SRC: a root of its own for the code in SRC/trtforge (python -m puts the cwd first)
  local r=$HOME/$1; rm -rf "$r"; mkdir -p "$r"; cp -r "$2/trtforge" "$r/trtforge"
  ln -s "$ROOT/zoo" "$ROOT/calib_data" "$ROOT/configs" "$ROOT/benchmarks" "$r/"; echo "$r"
}
SNAPA=$(snap_root snapA "$ROOT")
TA="cd $SNAPA && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$SNAPA:\$PYTHONPATH \$PY310"
T=$TA  # every step of phase A runs the snapshot
plugin_build
default_engines_and_docs
old_code_root
step build-fp16_512-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=512 $TAC --plugin-library $PLUG -o $N.fp16_512.engine"
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
lines = open(f"{w}/docs32v.jsonl").read().splitlines()
with open(f"{w}/docs128v.jsonl", "w") as f:
    for k in range(4):
        for line in lines:
            item = json.loads(line); item["name"] = f"{k}_{item.get('name', '')}"; f.write(json.dumps(item) + "\n")
PY

NR="--no-precision-check --no-chunking-check"
R() {  # R CODE MODEL INPUT NAME [FLAGS]: `trtforge run` of MODEL's default engine by CODE's T, report $W/MODEL/NAME.json
  local t=$1 m=$2 input=$3 name=$4; shift 4
  echo "$t -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $input $NR $* --report $W/$m/$name.json"
}
OLD="cd $OLDROOT && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$OLDROOT:\$PYTHONPATH \$PY310"
TB=""
if [ -f "$ROOT/benchmarks/gpu/w30b/READY" ]; then  # phase B's code came with the start call: interleaved from the first round
  SNAPB=$(snap_root snapB "$ROOT/benchmarks/gpu/w30b")
  TB="cd $SNAPB && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$SNAPB:\$PYTHONPATH \$PY310"
  cp "$ROOT/benchmarks/gpu/w30b/READY" "$W/B_READY.txt"
fi
for i in 1 2 3; do
  step "run-minilm-ids-A-$i" 120 "$(R "$TA" minilm $W/docs32v.jsonl ids_A_$i)"
  [ -n "$TB" ] && step "run-minilm-ids-B-$i" 120 "$(R "$TB" minilm $W/docs32v.jsonl ids_B_$i)"
  [ "$i" -le 2 ] && step "run-minilm-ids512-$i" 120 "$TA -m trtforge run $N.fp16_512.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl --chunk 512 $NR --report $W/minilm/ids512_$i.json"
done
for i in 1 2; do
  step "run-minilm-text-A-$i" 120 "$(R "$TA" minilm $W/docs32v text_A_$i)"
  [ -n "$TB" ] && step "run-minilm-text-B-$i" 120 "$(R "$TB" minilm $W/docs32v text_B_$i)"
  step "run-minilm-text-pp8-$i" 120 "$(R "$TA" minilm $W/docs32v text_pp8_$i --plan-processes 8)"
  step "run-bert-base-ids-A-$i" 120 "$(R "$TA" bert-base $W/docs32v.jsonl ids_A_$i)"
  [ -n "$TB" ] && step "run-bert-base-ids-B-$i" 120 "$(R "$TB" bert-base $W/docs32v.jsonl ids_B_$i)"
done
step "run-ref-minilm-A" 150 "$TA -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --reference $N.clean.onnx --report $W/minilm/run_ref_A.json"
[ -n "$TB" ] && step "run-ref-minilm-B" 150 "$TB -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --reference $N.clean.onnx --report $W/minilm/run_ref_B.json"
step "run-ref-minilm-512" 150 "$TA -m trtforge run $N.fp16_512.engine --config $CFG/minilm.yaml --chunk 512 --reference $N.clean.onnx --report $W/minilm/run_ref_512.json"
step "run-ref-bert-base-A" 150 "$TA -m trtforge run $B.fp16_def.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_A.json"
step engine-def 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base --no-e2e --out $W/torch.json"
step engine-def2 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine) --out $W/engine_def2.json"
step torch2 300 "$P312 benchmarks/vs_torch.py torch --models bert-base --no-e2e --out $W/torch2.json"
for i in 1 2; do step "run-minilm-ids-old-$i" 120 "$(R "$OLD" minilm $W/docs32v.jsonl ids_old_$i)"; done
step "run-minilm-ids128-A" 120 "$(R "$TA" minilm $W/docs128v.jsonl ids128_A)"
[ -n "$TB" ] && step "run-minilm-ids128-B" 120 "$(R "$TB" minilm $W/docs128v.jsonl ids128_B)"
step "run-minilm-ids128-512" 120 "$TA -m trtforge run $N.fp16_512.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl --chunk 512 $NR --report $W/minilm/ids128_512.json"
[ -n "$PYSPY" ] && step "pyspy-minilm-ids128" 150 "$PYSPY record --gil --nonblocking --rate 500 --format raw -o $W/minilm/pyspy_gil128.txt -- bash -c '$(R "$TA" minilm $W/docs128v.jsonl spy128)'"
rm -rf "$W/docs32v" "$W/docs8" "$W/docs128v.jsonl"
touch "$W/DONE"
