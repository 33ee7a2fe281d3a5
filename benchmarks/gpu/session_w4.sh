#!/usr/bin/env bash
# H200 session 4 of 2026-12-01: measure what w3's kernel lists pointed at (staging as in session_w3.sh; the real
# MiniLM carried as .whl2/gtpkg). Run from the project root:
#   bash benchmarks/gpu/session_w4.sh W DEADLINE_EPOCH      then   bash benchmarks/gpu/poll.sh W 540
# A (builds, five lanes): BERT-base fp16 and INT8 best, each with the QKV projection as MatMul or 1x1 Conv
#    (--qkv-projection) and --fuse-gelu off/on; ResNet-50 recalibrated and rebuilt `best` (the convolution-epilogue
#    fix) + fp16 + implicit; MiniLM recalibrated (ONNX Runtime now runs Q/DQ exactly) + fp16 + best.
# B (one job at a time on the GPU): compare tables (accuracy + GPU ms at 16x128/16x512/64x512), torch eager in the
#    same run, `run --reference` of the new variants, `run` end to end with its host-stage breakdown
#    (runtime.host), Nsight Compute kernel lists, the ResNet-50 INT8 layer list, torch.compile last.
# Every step appends {step, rc, seconds, cmd, tail} to W/steps.jsonl; the driver goes on after a failure.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
CAL="--max-samples 64 --max-eval-samples 64 --smooth 0.8 --no-engine-check"
M() { echo "$W/$1/$1"; }
B=$(M bert-base); N=$(M minilm); R=$(M resnet50)
BB="$T -m trtforge build"
BC="--config $CFG/bert-base.yaml $TAC"

for m in bert-base minilm resnet50; do
  ( mkdir -p "$W/$m"
    step "export-$m" 600 "$P312 -m trtforge export --config $CFG/$m.yaml -o $W/$m/$m.onnx" &&
    step "clean-$m" 300 "$P312 -m trtforge clean $W/$m/$m.onnx" ) &
done
wait

( step calibrate-bert-base 600 "$T -m trtforge calibrate $B.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval $CAL"
  step build-best-bert-base 900 "$BB $B.int8.onnx $BC --precision best -o $B.best.engine"
  step build-best_conv-bert-base 900 "$BB $B.int8.onnx $BC --precision best --qkv-projection conv -o $B.best_conv.engine"
  step build-best_conv_gelu-bert-base 900 "$BB $B.int8.onnx $BC --precision best --qkv-projection conv --fuse-gelu on -o $B.best_conv_gelu.engine" ) &
( step build-fp16-bert-base 900 "$BB $B.clean.onnx $BC --precision fp16 -o $B.fp16.engine"
  step build-fp16_gelu-bert-base 900 "$BB $B.clean.onnx $BC --precision fp16 --fuse-gelu on -o $B.fp16_gelu.engine" ) &
( step build-fp16_conv-bert-base 900 "$BB $B.clean.onnx $BC --precision fp16 --qkv-projection conv -o $B.fp16_conv.engine"
  step build-fp16_conv_gelu-bert-base 900 "$BB $B.clean.onnx $BC --precision fp16 --qkv-projection conv --fuse-gelu on -o $B.fp16_conv_gelu.engine" ) &
( step calibrate-resnet50 900 "$T -m trtforge calibrate $R.clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99"
  step build-fp16-resnet50 900 "$T -m trtforge build $R.clean.onnx --config $CFG/resnet50.yaml --precision fp16 $TAC -o $R.fp16.engine"
  step build-implicit-resnet50 900 "$T benchmarks/gpu/implicit_int8.py build $R.clean.onnx $W/resnet50/implicit.engine --data calib_data/images --max-samples 64" ) &
( step calibrate-minilm 600 "$T -m trtforge calibrate $N.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval $CAL"
  step build-fp16-minilm 900 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 $TAC -o $N.fp16.engine"
  step build-fp16_conv-minilm 900 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --qkv-projection conv $TAC -o $N.fp16_conv.engine"
  step build-best-minilm 900 "$T -m trtforge build $N.int8.onnx --config $CFG/minilm.yaml --precision best $TAC -o $N.best.engine" ) &
wait

eng() { for l in "$@"; do f=${l#*=}; [ -f "$f" ] && printf ' --engine %s' "$l"; done; }
step compare-bert-base 600 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16=$B.fp16.engine fp16_gelu=$B.fp16_gelu.engine fp16_conv=$B.fp16_conv.engine fp16_conv_gelu=$B.fp16_conv_gelu.engine int8_best=$B.best.engine int8_best_conv=$B.best_conv.engine int8_best_conv_gelu=$B.best_conv_gelu.engine) --json $W/bert-base/compare.json"
step compare-minilm 300 "$T benchmarks/gpu/implicit_int8.py compare $N.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16=$N.fp16.engine fp16_conv=$N.fp16_conv.engine int8_best=$N.best.engine) --json $W/minilm/compare.json"
step compare-resnet50 300 "$T benchmarks/gpu/implicit_int8.py compare $R.clean.onnx --eval-data calib_data/images_eval $(eng trtforge_int8_best=$R.int8.best.engine fp16=$R.fp16.engine trt_implicit_int8=$W/resnet50/implicit.engine) --json $W/resnet50/compare.json"
step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine minilm=$N.fp16.engine) --out $W/engine.json"
step vs-torch-engine-conv 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_conv_gelu.engine minilm=$N.fp16_conv.engine) --out $W/engine_conv.json"
step vs-torch-engine-int8 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.best_conv_gelu.engine minilm=$N.best.engine) --out $W/engine_int8.json"
step torch-eager 420 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --out $W/torch.json"
for v in fp16 fp16_conv fp16_conv_gelu; do
  NCU=/usr/local/cuda/bin/ncu
  [ -f "$B.$v.engine" ] || continue
  step "ncu-$v" 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.$v.engine 16x512" &&
  step "kernels-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_$v.csv --json $W/kernels_$v.json"
done
for e in fp16_conv_gelu best_conv_gelu; do
  [ -f "$B.$e.engine" ] && step "run-ref-$e" 420 "$T -m trtforge run $B.$e.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_$e.json"
done
mkdir -p "$W/docs8"
for k in 1 2 3 4 5 6 7 8; do for f in calib_data/minilm_long/*.txt; do cp "$f" "$W/docs8/${k}_$(basename "$f")"; done; done
for m in bert-base minilm; do
  E=$(M $m).fp16.engine; [ -f "$E" ] || continue
  step "run-e2e-$m" 300 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs8 --no-precision-check --report $W/$m/run_e2e.json"
done
for v in best_conv_gelu; do
  [ -f "$B.$v.engine" ] || continue
  step "ncu-$v" 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.$v.engine 16x512" &&
  step "kernels-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_$v.csv --json $W/kernels_$v.json"
done
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_e2e.json --run minilm=$W/minilm/run_e2e.json --out $W/vs_torch.json > $W/table.md"
for e in "$R.int8.best.engine" "$B.fp16_conv.engine" "$B.best_conv_gelu.engine"; do
  [ -f "$e" ] && step "inspect-$(basename "$e" .engine)" 60 "$T -m trtforge inspect $e > $e.inspect.txt 2>&1"
done
step torch-compile 420 "$P312 benchmarks/vs_torch.py torch --models bert-base --compile --compile-budget-s 300 --no-e2e --out $W/torch_compile.json"
touch "$W/DONE"
