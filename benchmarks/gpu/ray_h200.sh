#!/usr/bin/env bash
# Issue 13 on the GPU machine: `trtforge run --ray` on a TensorRT 8.6 engine, one actor per GPU, against
# the one-process run. Run from the project root after staging (../shared/gpu/README.md), with Ray 2.60
# unpacked for $PY310 (benchmarks/ray_scaling.py restores the exec bits of ray/core/src/ray/gcs/gcs_server
# and ray/core/src/ray/raylet/raylet that a zipfile unpack drops, and says which it fixed):
#   bash benchmarks/gpu/ray_h200.sh W DEADLINE_EPOCH [ENGINE CLEAN_ONNX]
# Without an engine it exports BERT-base (zoo/configs/full/bert-base.yaml, python3 + torch), cleans it and
# builds fp16 (TensorRT 8.6, cuBLAS/cuDNN tactic sources off): ~2-3 min. Then:
#   ray_cli      run --ray auto on the shipped long documents (report with per-worker figures)
#   ray_scaling  benchmarks/ray_scaling.py: single process vs Ray x1 (vs x N on N GPUs) on >= 200k tokens
# Steps append {step, rc, seconds, cmd, tail} to $W/steps.jsonl and go on after a failure.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}; ENGINE=${3:-}; CLEAN=${4:-}
TACTICS=-CUBLAS,-CUBLAS_LT,-CUDNN
mkdir -p "$W"; : > "$W/steps.jsonl"
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0

. "$ROOT/benchmarks/gpu/steps.sh"  # step NAME TIMEOUT_S CMD...

P312="PYTHONPATH=/tmp/site:$ROOT python3 -m trtforge"
P310ENV=". $HOME/trt86.env && export PYTHONPATH=$ROOT:\$PYTHONPATH &&"
CONFIG=zoo/configs/full/bert-base.yaml

if [ -z "$ENGINE" ]; then
  CLEAN=$W/bert-base.clean.onnx; ENGINE=$W/bert-base.fp16.engine
  step export 600 "$P312 export --config $CONFIG -o $W/bert-base.onnx" &&
  step clean 300 "$P312 clean $W/bert-base.onnx" &&
  step build 900 "$P310ENV \$PY310 -m trtforge build $CLEAN --config $CONFIG --precision fp16 --tactic-sources=$TACTICS -o $ENGINE"
fi

# Ray's two binaries lose their exec bits in a zipfile unpack: restore them before the first `ray.init`
# (the 2026-12-01 run's ray_cli step failed with "Permission denied: .../gcs/gcs_server" without this).
step exec_bits 60 "$P310ENV cd $ROOT/benchmarks && \$PY310 -c 'from ray_scaling import fix_exec_bits; print(fix_exec_bits())'"
step ray_cli 600 "$P310ENV \$PY310 -m trtforge run $ENGINE --config $CONFIG --reference $CLEAN --ray auto --report $W/ray_run.json"
step ray_scaling 900 "$P310ENV \$PY310 benchmarks/ray_scaling.py $ENGINE --reference $CLEAN --min-tokens ${MIN_TOKENS:-200000} --chunk 256 --overlap 32 --batch-size 16 --json $W/ray_scaling.json"
cat "$W/log.ray_scaling" 2>/dev/null | tail -8
echo done > "$W/DONE"
