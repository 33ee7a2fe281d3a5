#!/usr/bin/env bash
# Next H200 session after 2026-12-01 w3: measure what w3's kernel lists pointed at (staging as in session_w3.sh;
# the real MiniLM carried as .whl2/gtpkg). Run from the project root:
#   bash benchmarks/gpu/session_w4.sh W DEADLINE_EPOCH      then   bash benchmarks/gpu/poll.sh W 540
# A (builds, up to four at a time): BERT-base fp16 with --fuse-gelu off/on, BERT-base INT8 best with
#    --fuse-gelu on; ResNet-50 recalibrated and rebuilt `best` (the convolution-epilogue fix) + fp16 + implicit;
#    MiniLM recalibrated (ONNX Runtime now runs Q/DQ exactly) + best.
# B (one job at a time on the GPU): compare tables (accuracy + GPU ms), `run --reference` of the GELU engines,
#    `run` end to end with its host-stage breakdown (runtime.host), Nsight Compute kernel lists of the GELU
#    engines, the ResNet-50 INT8 layer list, torch.compile for BERT-base.
# Every step appends {step, rc, seconds, cmd, tail} to W/steps.jsonl; the driver goes on after a failure.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
CAL="--max-samples 64 --max-eval-samples 64 --smooth 0.8 --no-engine-check"
M() { echo "$W/$1/$1"; }
B=$(M bert-base); N=$(M minilm); R=$(M resnet50)

for m in bert-base minilm resnet50; do
  ( mkdir -p "$W/$m"
    step "export-$m" 600 "$P312 -m trtforge export --config $CFG/$m.yaml -o $W/$m/$m.onnx" &&
    step "clean-$m" 300 "$P312 -m trtforge clean $W/$m/$m.onnx" ) &
done
wait

( step calibrate-bert-base 600 "$T -m trtforge calibrate $B.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval $CAL"
  step build-best-gelu-bert-base 900 "$T -m trtforge build $B.int8.onnx --config $CFG/bert-base.yaml --precision best --fuse-gelu on $TAC -o $B.best_gelu.engine"
  step build-best-bert-base 900 "$T -m trtforge build $B.int8.onnx --config $CFG/bert-base.yaml --precision best $TAC -o $B.best.engine"
  # the MatMul-epilogue experiment (int8_probe.py: one profile, attention not fused, same for both variants)
  step variants 300 "$P312 benchmarks/gpu/int8_probe.py variants $B.clean.onnx $B.int8.onnx $W/bert-base/v" &&
  for v in best best_mm_epilogue; do
    step "probe-build-$v" 600 "$T benchmarks/gpu/int8_probe.py build $W/bert-base/v/$v.onnx $W/bert-base/probe_$v.engine --int8 --fp16"
  done ) &
( step build-fp16-bert-base 900 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC -o $B.fp16.engine"
  step build-fp16-gelu-bert-base 900 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 --fuse-gelu on $TAC -o $B.fp16_gelu.engine" ) &
( step calibrate-resnet50 900 "$T -m trtforge calibrate $R.clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99"
  step build-fp16-resnet50 900 "$T -m trtforge build $R.clean.onnx --config $CFG/resnet50.yaml --precision fp16 $TAC -o $R.fp16.engine"
  step build-implicit-resnet50 900 "$T benchmarks/gpu/implicit_int8.py build $R.clean.onnx $W/resnet50/implicit.engine --data calib_data/images --max-samples 64" ) &
( step calibrate-minilm 600 "$T -m trtforge calibrate $N.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval $CAL"
  step build-fp16-minilm 900 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 $TAC -o $N.fp16.engine"
  step build-best-minilm 900 "$T -m trtforge build $N.int8.onnx --config $CFG/minilm.yaml --precision best $TAC -o $N.best.engine" ) &
wait

eng() { for l in "$@"; do f=${l#*=}; [ -f "$f" ] && printf ' --engine %s' "$l"; done; }
step compare-bert-base 420 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16=$B.fp16.engine fp16_gelu=$B.fp16_gelu.engine int8_best=$B.best.engine int8_best_gelu=$B.best_gelu.engine) --json $W/bert-base/compare.json"
step compare-resnet50 300 "$T benchmarks/gpu/implicit_int8.py compare $R.clean.onnx --eval-data calib_data/images_eval $(eng trtforge_int8_best=$R.int8.best.engine fp16=$R.fp16.engine trt_implicit_int8=$W/resnet50/implicit.engine) --json $W/resnet50/compare.json"
step compare-minilm 300 "$T benchmarks/gpu/implicit_int8.py compare $N.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng int8_best=$N.best.engine fp16=$N.fp16.engine) --json $W/minilm/compare.json"
for v in best best_mm_epilogue; do
  [ -f "$W/bert-base/probe_$v.engine" ] && step "probe-time-$v" 180 "$T benchmarks/gpu/int8_probe.py time $W/bert-base/probe_$v.engine $B.clean.onnx --json $W/bert-base/probe_time_$v.json"
done
for e in fp16_gelu best_gelu; do
  [ -f "$B.$e.engine" ] && step "run-ref-$e" 420 "$T -m trtforge run $B.$e.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_$e.json"
done
mkdir -p "$W/docs8"
for k in 1 2 3 4 5 6 7 8; do for f in calib_data/minilm_long/*.txt; do cp "$f" "$W/docs8/${k}_$(basename "$f")"; done; done
for m in bert-base minilm; do
  E=$(M $m).fp16.engine; [ -f "$E" ] || continue
  step "run-e2e-$m" 300 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs8 --no-precision-check --report $W/$m/run_e2e.json"
done
NCU=/usr/local/cuda/bin/ncu
for v in fp16 fp16_gelu best_gelu; do
  [ -f "$B.$v.engine" ] || continue
  step "ncu-$v" 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.$v.engine 16x512" &&
  step "kernels-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_$v.csv --json $W/kernels_$v.json"
done
for e in "$R.int8.best.engine" "$B.best_gelu.engine" "$B.fp16_gelu.engine"; do
  [ -f "$e" ] && step "inspect-$(basename "$e" .engine)" 60 "$T -m trtforge inspect $e > $e.inspect.txt 2>&1"
done
step torch-compile 420 "$P312 benchmarks/vs_torch.py torch --models bert-base --compile --compile-budget-s 300 --no-e2e --out $W/torch_compile.json"
touch "$W/DONE"
