#!/usr/bin/env bash
# Issue 11 items 2 and 3 on the H200 (TensorRT 8.6 staged: ../shared/gpu/README.md, with
# `pack-trt86.sh tokenizers pillow annotated-doc`). Run from the project root, detached:
#   bash benchmarks/gpu/runloop_h200.sh W DEADLINE_EPOCH
# Knobs (env): MODELS="bert-base minilm", COMPILE=0 skips torch.compile, NOGRAPHS=0 skips the runs without
# CUDA graphs. Expected: ~1.5 min exports, ~2 min builds, ~1.5 min runs, ~2 min torch (less with COMPILE=0).
# 1. export + clean BERT-base and MiniLM (python3, CPU) while torch.compile fills inductor's disk cache;
# 2. both fp16 engines built at once (tiers seq 128/512, batch up to 64; cuBLAS/cuDNN tactic sources off);
# 3. one job at a time on the GPU: `trtforge run` on each engine with CUDA graphs (default) and without,
#    the engines' GPU ms at 16x128/16x512/64x512, torch fp16 eager SDPA + torch.compile at the same shapes
#    and the plain torch sliding-window loop over the same documents; 4. the table (W/table.md).
# Every step appends {step, rc, seconds, cmd, tail} to W/steps.jsonl and the driver goes on after a failure.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
mkdir -p "$W"; : > "$W/steps.jsonl"
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
. "$ROOT/benchmarks/gpu/steps.sh"
P312="PYTHONPATH=/tmp/site:$ROOT python3"
P310=". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310"
TACTICS=-CUBLAS,-CUBLAS_LT,-CUDNN
MODELS=${MODELS:-"bert-base minilm"}
COMPILE=${COMPILE:-1}
NOGRAPHS=${NOGRAPHS:-1}
CFG=zoo/configs/full

# 1. exports on the CPU cores; torch.compile's code generation beside them (no timing happens yet)
PRE=""
if [ "$COMPILE" = 1 ]; then
  step torch-precompile 300 "$P312 benchmarks/vs_torch.py torch --models $MODELS --compile-only --out $W/precompile.json" &
  PRE=$!
fi
EXPORTS=""
for m in $MODELS; do
  ( mkdir -p "$W/$m"
    [ -f "$W/$m/$m.clean.onnx" ] || { step "export-$m" 400 "$P312 -m trtforge export --config $CFG/$m.yaml -o $W/$m/$m.onnx" &&
      step "clean-$m" 200 "$P312 -m trtforge clean $W/$m/$m.onnx"; } ) &
  EXPORTS="$EXPORTS $!"
done
wait $EXPORTS  # the precompile may go on beside the builds (its GPU use is small); it is waited for before any timing

# 2. both builds at once
BUILDS=""
for m in $MODELS; do
  [ -f "$W/$m/$m.clean.onnx" ] || continue
  [ -f "$W/$m/$m.fp16.engine" ] && continue
  step "build-$m" 600 "$P310 -m trtforge build $W/$m/$m.clean.onnx --config $CFG/$m.yaml --precision fp16 --tactic-sources $TACTICS -o $W/$m/$m.fp16.engine" &
  BUILDS="$BUILDS $!"
done
[ -n "$BUILDS" ] && wait $BUILDS
[ -n "$PRE" ] && wait $PRE

# 3. timed, one job at a time
for m in $MODELS; do
  E=$W/$m/$m.fp16.engine; [ -f "$E" ] || continue
  step "run-$m" 240 "$P310 -m trtforge run $E --config $CFG/$m.yaml --reference $W/$m/$m.clean.onnx --report $W/$m/run.json"
  [ "$NOGRAPHS" = 1 ] && step "run-nographs-$m" 240 "$P310 -m trtforge run $E --config $CFG/$m.yaml --reference $W/$m/$m.clean.onnx --no-cuda-graphs --report $W/$m/run_nographs.json"
done
ENGINES=""
for m in $MODELS; do [ -f "$W/$m/$m.fp16.engine" ] && ENGINES="$ENGINES --engine $m=$W/$m/$m.fp16.engine"; done
[ -n "$ENGINES" ] && step engine-times 180 "$P310 benchmarks/vs_torch.py engine $ENGINES --out $W/engine.json"
step torch 360 "$P312 benchmarks/vs_torch.py torch --models $MODELS --out $W/torch.json $([ "$COMPILE" = 1 ] && echo --compile --compile-budget-s 150)"

# 4. tables: kernels and end to end (vs_torch), and the run loop with and without graphs
RUNS=""
for m in $MODELS; do RUNS="$RUNS --run $m=$W/$m/run.json"; done
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json $RUNS --out $W/vs_torch.json > $W/table.md"
python3 benchmarks/gpu/runloop_table.py "$W" >> "$W/table.md" 2>&1
touch "$W/DONE"
