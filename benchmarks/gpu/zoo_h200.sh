#!/usr/bin/env bash
# The zoo on the H200, end to end with the default exporter and no wrapper (issue 9's done-when):
# export + clean under the GPU machine's python3 (torch, transformers, torchvision), build fp16 and
# `trtforge run` on the engine under the staged TensorRT 8.6 ($PY310). Run detached from the project
# root after staging (../shared/gpu/README.md); every step appends {step, rc, seconds, cmd, tail} to
# $W/steps.jsonl and goes on after a failure; the driver stops starting steps at its deadline.
#   usage: bash benchmarks/gpu/zoo_h200.sh W DEADLINE_EPOCH [MODELS...]
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}; shift 2
MODELS=${*:-"bert-base gpt2 vit-b16 resnet50 deeplabv3"}
CONFIGS=${CONFIGS:-zoo/configs/full}
TACTICS=${TACTICS--CUBLAS,-CUBLAS_LT,-CUDNN}  # empty: builder defaults (TensorRT-RTX has no cuBLAS source)
mkdir -p "$W"; : > "$W/steps.jsonl"
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

. "$ROOT/benchmarks/gpu/steps.sh"  # step NAME TIMEOUT_S CMD...

P312="PYTHONPATH=/tmp/site:$ROOT python3 -m trtforge"
# TensorRT 8.6's Python 3.10 environment only inside each step: its PYTHONHOME would break python3.
P310=". $HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310 -m trtforge"

# 1. export + clean, all models at once (CPU side of the GPU machine: 16 cores)
for m in $MODELS; do
  ( mkdir -p "$W/$m"
    [ -f "$W/$m/$m.clean.onnx" ] || { step "export-$m" 600 "$P312 export --config $CONFIGS/$m.yaml -o $W/$m/$m.onnx" &&
    step "clean-$m" 300 "$P312 clean $W/$m/$m.onnx"; } ) &
done
wait

# INT8 (issue 10, first look on the engine): BERT-base calibrated on the CPU cores while the GPU builds,
# built as `best` (Q/DQ GEMMs in INT8, the rest fp16), run after the zoo's runs.
if [ -f "$W/bert-base/bert-base.clean.onnx" ]; then
  ( step "calibrate-bert-base" 600 "$P310 calibrate $W/bert-base/bert-base.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval --max-samples 64 --max-eval-samples 64 --smooth 0.8" &&
    step "build-best-bert-base" 900 "$P310 build $W/bert-base/bert-base.int8.onnx --config $CONFIGS/bert-base.yaml --precision best ${TACTICS:+--tactic-sources $TACTICS} -o $W/bert-base/bert-base.best.engine" ) > "$W/int8.log" 2>&1 &
  INT8=$!
fi

# 2. fp16 engines, two builds at a time (TensorRT 8.6; cuBLAS/cuDNN tactic sources off: stand-ins only)
n=0
for m in $MODELS; do
  [ -f "$W/$m/$m.clean.onnx" ] || continue
  step "build-$m" 900 "$P310 build $W/$m/$m.clean.onnx --config $CONFIGS/$m.yaml --precision fp16 ${TACTICS:+--tactic-sources $TACTICS} -o $W/$m/$m.fp16.engine" &
  n=$((n + 1)); [ $((n % 2)) -eq 0 ] && wait
done
wait

# 3. run on each engine, one at a time (GPU timings not shared with another job; the INT8 calibration
#    may still use CPU cores, which the ONNX Runtime reference shares)
for m in $MODELS; do
  [ -f "$W/$m/$m.fp16.engine" ] || continue
  step "run-$m" 600 "$P310 run $W/$m/$m.fp16.engine --config $CONFIGS/$m.yaml --reference $W/$m/$m.clean.onnx --report $W/$m/$m.run.json"
done

[ -f "$W/bert-base/bert-base.best.engine" ] && step "run-best-bert-base" 600 "$P310 run $W/bert-base/bert-base.best.engine --config $CONFIGS/bert-base.yaml --reference $W/bert-base/bert-base.clean.onnx --report $W/bert-base/bert-base.best.run.json"

# 4. issue 11's first question: which fused-attention plugins TensorRT 8.6 has kernels for on sm_90
step "probe-plugins" 240 ". $HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310 benchmarks/gpu/probe_attention_plugins.py --json $W/plugins.json"

python3 benchmarks/gpu/zoo_table.py "$W" > "$W/table.md" 2>&1
touch "$W/DONE"
