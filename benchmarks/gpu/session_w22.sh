#!/usr/bin/env bash
# H200 window of 2026-12-03 (issue 11: engines >= 1.5x torch eager). TrtforgeFlashAttention (trtforge/native:
# cuDNN 9 flash attention as a TensorRT 8.6 plugin) against TensorRT 8.6's own CustomQKVToContextPluginDynamic v2,
# whose sm_90 kernel ran at ~117 TFLOP/s. Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w22.sh $HOME/w 1000 540     (carry .whl2 .native .trtinc)
# .native holds cudnn-frontend's headers (PyPI nvidia-cudnn-frontend 1.14.0) and a plugin built on the dev machine
# against cuDNN 9.17's headers; .trtinc TensorRT 8.6's headers (NVIDIA/TensorRT v8.6.0 include/). The driver builds the
# plugin again against the box's own cuDNN and falls back to the carried one. (The window ran with the frontend headers
# at .native/cudnn_frontend_include, a name their own "../include/" includes cannot use: that build failed and the
# carried library ran; steps.sh's plugin_build now takes them from .native/cudnn_frontend/include.)
# A: env, plugin build, plugin alone vs float64 and vs v2 (flash_plugin_check.py), exports, builds in lanes.
# B: one job at a time on the GPU: engines at 16x128/16x512/64x512, torch eager SDPA, accuracy vs ORT fp32 (held-out),
#    `run` end to end with the defaults (wall/GPU), the zoo's `run --reference`, the kernel list, torch.compile.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
B=$(M bert-base); N=$(M minilm)
BB="$T -m trtforge build"
FL="--plugin-library $PLUG"

step env 60 "python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())'; echo EXTRA=$EXTRA; ls $CUDNN/lib; ls $CUDNN/include | head -3; which g++ nvcc; nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv"
plugin_build
( step plugin-check 300 "$T benchmarks/gpu/flash_plugin_check.py $PLUG --out $W/plugin_check.json" ) &
export_clean minilm bert-base roberta-base vit-b16 gpt2
wait
docs8
docs_varied 32 docs32v

# Builds, four lanes (GPU-light); v2 = the previous default (no plugin library), the control.
( step build-fp16_flash-bert-base 900 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $FL -o $B.fp16_flash.engine"
  step build-fp16_v2-bert-base 900 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC -o $B.fp16_v2.engine" ) &
( step build-fp16_flash-minilm 900 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $FL -o $N.fp16_flash.engine"
  step build-fp16_v2-minilm 900 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16_v2.engine"
  step build-fp16_flash-gpt2 900 "$BB $(M gpt2).clean.onnx --config $CFG/gpt2.yaml --precision fp16 $TAC $FL -o $(M gpt2).fp16_flash.engine" ) &
( step calibrate-bert-base 600 "$T -m trtforge calibrate $B.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval --max-samples 64 --max-eval-samples 64 --smooth 0.8 --no-engine-check"
  step build-best_flash-bert-base 900 "$BB $B.int8.onnx --config $CFG/bert-base.yaml --precision best $TAC $FL -o $B.best_flash.engine" ) &
( step build-fp16_flash-roberta-base 900 "$BB $(M roberta-base).clean.onnx --config $CFG/roberta-base.yaml --precision fp16 $TAC $FL -o $(M roberta-base).fp16_flash.engine"
  step build-fp16_flash-vit-b16 900 "$BB $(M vit-b16).clean.onnx --config $CFG/vit-b16.yaml --precision fp16 $TAC $FL -o $(M vit-b16).fp16_flash.engine" ) &
wait

# B: timings alone on the GPU, most wanted first.
step engine-flash 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_flash.engine minilm=$N.fp16_flash.engine) --out $W/engine_flash.json"
step engine-v2 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_v2.engine minilm=$N.fp16_v2.engine) --out $W/engine_v2.json"
step engine-best 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.best_flash.engine) --out $W/engine_best.json"
step torch 420 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
for m in minilm bert-base; do
  for i in 1 2; do
    step "run-$m-flash-$i" 120 "$T -m trtforge run $(M $m).fp16_flash.engine --config $CFG/$m.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/$m/run_flash_docs32v_$i.json"
    step "run-$m-v2-$i" 120 "$T -m trtforge run $(M $m).fp16_v2.engine --config $CFG/$m.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/$m/run_v2_docs32v_$i.json"
  done
  step "run-$m-flash-docs8" 120 "$T -m trtforge run $(M $m).fp16_flash.engine --config $CFG/$m.yaml --inputs $W/docs8 --no-precision-check --no-chunking-check --report $W/$m/run_docs8.json"
done
step table-flash 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_flash.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch_flash.json > $W/table_flash.md"
step table-v2 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_v2.json --out $W/vs_torch_v2.json > $W/table_v2.md"
step table-best 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_best.json --out $W/vs_torch_best.json > $W/table_best.md"
step compare-bert-base 600 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16_flash=$B.fp16_flash.engine fp16_v2=$B.fp16_v2.engine best_flash=$B.best_flash.engine) --json $W/bert-base/compare.json"
step compare-minilm 300 "$T benchmarks/gpu/implicit_int8.py compare $N.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16_flash=$N.fp16_flash.engine fp16_v2=$N.fp16_v2.engine) --json $W/minilm/compare.json"
for m in bert-base roberta-base vit-b16 gpt2; do
  E=$(M $m).fp16_flash.engine; [ -f "$E" ] || continue
  step "run-ref-$m" 300 "$T -m trtforge run $E --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref_flash.json"
  step "inspect-$m" 60 "$T -m trtforge inspect $E > $W/$m/inspect_flash.txt 2>&1"
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in fp16_flash fp16_v2; do
  step "ncu-$v" 180 ". \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.$v.engine 16x512" &&
  step "kernels-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_$v.csv --json $W/kernels_$v.json"
done
step torch-compile 420 "$P312 benchmarks/vs_torch.py torch --models bert-base --repeat 8 --compile --compile-budget-s 240 --out $W/torch_compile.json"
rm -rf "$W/docs32v" "$W/docs8"
touch "$W/DONE"
