#!/usr/bin/env bash
# The next H200 window (staging as in session_w4.sh; the real MiniLM as .whl2/gtpkg). Run from the project root:
#   bash benchmarks/gpu/session_w10.sh W DEADLINE_EPOCH   then  poll.sh W 540
# A: ResNet-50 fp16, TensorRT implicit INT8 and trtforge INT8 best (two-conv residual rule) built and compared in one
#    window (w9 compared its INT8 engine with w8's fp16 and implicit engines); BERT-base and MiniLM fp16.
# B: where `run` loses time against the GPU (issue 11's wall <= 1.1x GPU), from each report's runtime.timeline
#    (benchmarks/run_stalls.py: start-up / steady / drain excess): docs8 (356k tokens) vs docs32 (4x: start-up and
#    drain shrink, periodic stalls do not), Python's garbage collector off, 4 planning threads instead of 8.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm); R=$(M resnet50)

export_clean bert-base minilm resnet50
( step build-fp16-bert-base 900 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml $TAC --precision fp16 -o $B.fp16.engine" ) &
( step build-fp16-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" ) &
( step calibrate-resnet50 600 "$T -m trtforge calibrate $R.clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99 --no-engine-check"
  # the three ResNet-50 engines one after another: tactic timing under the same load for each
  step build-best-resnet50 600 "$T -m trtforge build $R.int8.onnx --config $CFG/resnet50.yaml --precision best $TAC -o $R.best.engine"
  step build-fp16-resnet50 900 "$T -m trtforge build $R.clean.onnx --config $CFG/resnet50.yaml --precision fp16 $TAC -o $R.fp16.engine"
  step build-implicit-resnet50 900 "$T benchmarks/gpu/implicit_int8.py build $R.clean.onnx $W/resnet50/implicit.engine --data calib_data/images --max-samples 64" ) &
wait
step compare-resnet50 300 "$T benchmarks/gpu/implicit_int8.py compare $R.clean.onnx --eval-data calib_data/images_eval $(eng trtforge_int8_best=$R.best.engine fp16=$R.fp16.engine trt_implicit_int8=$W/resnet50/implicit.engine) --json $W/resnet50/compare.json"

docs8
mkdir -p "$W/docs32"; for k in 1 2 3 4; do for f in "$W"/docs8/*.txt; do cp "$f" "$W/docs32/${k}_$(basename "$f")"; done; done
RUN() { echo "$T -m trtforge run $(M $1).fp16.engine --config $CFG/$1.yaml --inputs $W/$2 --no-precision-check $3 --report $W/$1/$4.json"; }
NOGC() { echo ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310 -c 'import gc, runpy, sys; gc.disable(); sys.argv = [\"trtforge\"] + sys.argv[1:]; runpy.run_module(\"trtforge\", run_name=\"__main__\")' run $(M $1).fp16.engine --config $CFG/$1.yaml --inputs $W/docs8 --no-precision-check --report $W/$1/run_nogc_$2.json"; }
for i in 1 2; do for m in minilm bert-base; do
  step "run-$m-docs8-$i" 300 "$(RUN $m docs8 "" "run_docs8_$i")"
  step "run-$m-docs32-$i" 300 "$(RUN $m docs32 "" "run_docs32_$i")"
  step "run-$m-nogc-$i" 300 "$(NOGC $m $i)"
  step "run-$m-plan4-$i" 300 "$(RUN $m docs8 "--plan-workers 4" "run_plan4_$i")"
done; done
step stalls 60 "python3 benchmarks/run_stalls.py $W/minilm/run_*.json $W/bert-base/run_*.json --json $W/stalls.json > $W/stalls.md"
touch "$W/DONE"
