#!/usr/bin/env bash
# GPU window w34, for the next session (issue 11's done-when on the H200 it names; w31-w33 got only H100s), at most
# 600 s of driver: this checkout's `run` (planning on the thread feeding the GPU, the leaner planning, the collector paused
# in the loop) against a517296 (planning on that thread, nothing else: .gpu/old) on MiniLM from ids over docs128v.jsonl,
# four rotated rounds; BERT-base from ids (docs32v) twice; run --reference for both models (the gates); then vs_torch.py
# engine / torch / docs8 end to end for BERT-base's 64x512 margin over 1.5x torch eager and the end-to-end ratio; then, while
# time is left, BERT-base at --optimization-level 5 and a second engine / torch round.
# Staging as in session_w4.sh (the last part carries .whl3 .whl5; keep the tracked tree small), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w34.sh $HOME/w 600 570   (carry .whl2 .native .trtinc .whl .whl4 .gpu/old)
# with .gpu/old: `rm -rf .gpu/old && mkdir -p .gpu/old && git archive a517296 trtforge | tar -x -C .gpu/old`
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 600 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
ab_roots
plugin_build
default_engines_and_docs  # MiniLM and BERT-base default fp16 engines, docs8, docs32v(.jsonl); B and N
mkdir -p "$W/docs128v"; for k in 1 2 3 4; do for f in "$W"/docs32v/*.txt; do cp "$f" "$W/docs128v/${k}_$(basename "$f")"; done; done
step pretokenize-128 180 "$T benchmarks/gpu/pretokenize.py $W/docs128v $N.tokenizer $W/docs128v.jsonl"
NR="--no-precision-check --no-chunking-check"
declare -A CODE=([A]="$TA" [G]="$TB")
ORDERS=("A G" "G A" "G A" "A G")
for i in 1 2 3 4; do
  for v in ${ORDERS[$((i - 1))]}; do
    step "run-minilm-ids128-$v-$i" 120 "${CODE[$v]} -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs128v.jsonl $NR --report $W/minilm/ids128_${v}_$i.json"
  done
done
for i in 1 2; do
  step "run-bert-base-ids-G-$i" 120 "$TB -m trtforge run $B.fp16_def.engine --config $CFG/bert-base.yaml --inputs $W/docs32v.jsonl $NR --report $W/bert-base/ids_G_$i.json"
done
for m in minilm bert-base; do
  step "run-ref-$m" 150 "$TB -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref.json"
done
vs_torch_default
# Extras while time is left (the 64x512 margin over 1.5x torch eager): BERT-base built at --optimization-level 5 (TensorRT
# 8.6's default is 3; never measured), then a second round with torch first: both engines in one step, torch eager.
step build-fp16_o5-bert-base 300 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC --plugin-library $PLUG --optimization-level 5 -o $B.fp16_o5.engine"
step torch-2 200 "$P312 benchmarks/vs_torch.py torch --models bert-base --repeat 8 --batch 64 --no-e2e --out $W/torch_2.json"
step engine-2 200 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine bert-base-o5=$B.fp16_o5.engine) --out $W/engine_2.json"
step table-2 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_2.json --engine $W/engine_2.json --out $W/vs_torch_2.json > $W/table_2.md"
[ -f "$B.fp16_o5.engine" ] && step run-ref-bert-base-o5 150 "$TB -m trtforge run $B.fp16_o5.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_o5.json"
rm -rf "$W/docs32v" "$W/docs8" "$W/docs128v"
touch "$W/DONE"
