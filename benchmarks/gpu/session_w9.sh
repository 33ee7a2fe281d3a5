#!/usr/bin/env bash
# A short H200 window after session_w8 (staging as in session_w4.sh, no extra wheels): ResNet-50's INT8 engine with
# the downsampling blocks' skip branch quantized (placement since aa61ca3), timed and scored like w8's, whose fp16
# (0.6305 / 1.929 ms) and TensorRT implicit INT8 (0.5007 / 1.3381 ms) engines it is compared with; its kernel list.
# Beside it, MiniLM fp16 (real weights, .whl2) and `run` with 3 / 6 staging slots and 2 / 1 merge workers: w8's
# submitting thread waited for a free slot 0.19-0.23 s of a 0.32-0.37 s loop.
#   bash benchmarks/gpu/session_w9.sh W DEADLINE_EPOCH   then  poll.sh W 540
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
R=$(M resnet50); N=$(M minilm)
export_clean resnet50 minilm
( step build-fp16-minilm 400 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" ) &
step calibrate-resnet50 600 "$T -m trtforge calibrate $R.clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99 --no-engine-check"
step build-best-resnet50 600 "$T -m trtforge build $R.int8.onnx --config $CFG/resnet50.yaml --precision best $TAC -o $R.best.engine"
step compare-resnet50 300 "$T benchmarks/gpu/implicit_int8.py compare $R.clean.onnx --eval-data calib_data/images_eval $(eng trtforge_int8_best=$R.best.engine) --json $W/resnet50/compare.json"
step ncu-resnet50-best 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_resnet50_best.csv \$PY310 benchmarks/gpu/int8_probe.py once $R.best.engine 16x224" &&
  step kernels-resnet50-best 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_resnet50_best.csv --json $W/kernels_resnet50_best.json"
wait
docs8
for i in 1 2; do for sl in 3 6; do for mw in 2 1; do
  step "run-minilm-s$sl-m$mw-$i" 120 "$T -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/docs8 --no-precision-check --slots $sl --merge-workers $mw --report $W/minilm/run_s${sl}_m${mw}_$i.json"
done; done; done
touch "$W/DONE"
