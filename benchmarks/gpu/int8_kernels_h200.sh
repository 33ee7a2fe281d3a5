#!/usr/bin/env bash
# Issue 10 on the H200: BERT-base INT8 variants vs fp16, one profile each, timed and listed kernel by kernel
# with Nsight Compute (benchmarks/gpu/int8_probe.py says what each variant is). Run from the project root
# after staging, detached:  bash benchmarks/gpu/int8_kernels_h200.sh W DEADLINE_EPOCH
# GPU_FREE (optional): a file to wait for before timing, so that no other job's builds share the GPU.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
mkdir -p "$W"; : > "$W/steps.jsonl"
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
. "$ROOT/benchmarks/gpu/steps.sh"
P312="PYTHONPATH=/tmp/site:$ROOT python3"
P310=". $HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
B=$W/bert-base
step export 600 "$P312 -m trtforge export --config zoo/configs/full/bert-base.yaml -o $B/bert-base.onnx" &&
step clean 300 "$P312 -m trtforge clean $B/bert-base.onnx" &&
step calibrate 600 "$P310 -m trtforge calibrate $B/bert-base.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval --max-samples 64 --max-eval-samples 64 --smooth 0.8" &&
step variants 300 "$P312 benchmarks/gpu/int8_probe.py variants $B/bert-base.clean.onnx $B/bert-base.int8.onnx $B/v"
( step build-fp16 600 "$P310 benchmarks/gpu/int8_probe.py build $B/v/fp16.onnx $B/fp16.engine --fp16"
  step build-best_cast 600 "$P310 benchmarks/gpu/int8_probe.py build $B/v/best_cast.onnx $B/best_cast.engine --int8 --fp16" ) &
( step build-best 600 "$P310 benchmarks/gpu/int8_probe.py build $B/v/best.onnx $B/best.engine --int8 --fp16"
  step build-int8flags 600 "$P310 benchmarks/gpu/int8_probe.py build $B/v/int8flags.onnx $B/int8flags.engine --int8 --fp16" ) &
wait
if [ -n "${GPU_FREE:-}" ]; then while [ ! -f "$GPU_FREE" ] && [ "$(date +%s)" -lt $((DEADLINE - 60)) ]; do sleep 3; done; fi
for v in fp16 best best_cast int8flags; do
  [ -f "$B/$v.engine" ] || continue
  step "time-$v" 180 "$P310 benchmarks/gpu/int8_probe.py time $B/$v.engine $B/bert-base.clean.onnx --json $W/time_$v.json"
done
for v in fp16 best best_cast int8flags; do
  [ -f "$B/$v.engine" ] || continue
  for s in 16x128 16x512; do
    step "ncu-$v-$s" 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_${v}_$s.csv \$PY310 benchmarks/gpu/int8_probe.py once $B/$v.engine $s" &&
    step "kernels-$v-$s" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_${v}_$s.csv --json $W/kernels_${v}_$s.json"
  done
done
touch "$W/DONE"
