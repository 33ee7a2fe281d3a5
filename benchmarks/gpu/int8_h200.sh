#!/usr/bin/env bash
# Issue 10 on the H200 (TensorRT 8.6): trtforge's INT8 on the engine, side by side with TensorRT's own
# implicit INT8 and the fp16 engine, for BERT-base and ResNet-50 (zoo/configs/full, random init):
#   calibrate (64 samples; the engine re-check: ORT and engine figures side by side, exit 1 if only the
#   engine fails), build best (BERT; its re-check), bisect (BERT: each attention BMM group alone), the
#   implicit-INT8 anchor (IInt8EntropyCalibrator2 on the same samples, INT8+FP16, fp32 ONNX), fp16, and
#   one `compare` per model that times every engine alone (GPU ms 16x128, 16x512, 64x512 / batch 16, 64).
# Every engine has one profile (the model's axes; --tiers seq=512 for BERT). Each step is recorded in
# $W/steps.jsonl (benchmarks/gpu/steps.sh) and the driver goes on after a failure; nothing starts past
# DEADLINE. GPU time: ~9-11 min with the builds overlapped (estimate from the zoo run's build times: BERT-base
# ~80-160 s a build, ResNet-50 ~80 s; nothing here has run on the GPU yet). Run from the project root after staging:
#   bash benchmarks/gpu/int8_h200.sh W DEADLINE_EPOCH [bert-base] [resnet50]
# Results: $W/MODEL/compare.json (the table), $W/MODEL/*.engine.json (engine_check, layer_summary),
# $W/bert-base/bisect/bisect.json, $W/MODEL/implicit.engine.{evidence.json,layers.log,inspector.json}.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}; shift 2
MODELS=${*:-"bert-base resnet50"}
CONFIGS=${CONFIGS:-zoo/configs/full}  # zoo/configs with MODELS "bert resnet": the small models, for a dry run
mkdir -p "$W"; : > "$W/steps.jsonl"
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
. "$ROOT/benchmarks/gpu/steps.sh"
P312="PYTHONPATH=/tmp/site:$ROOT python3 -m trtforge"
T=". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310"
P310="$T -m trtforge"
TACTICS=${TACTICS---tactic-sources -CUBLAS,-CUBLAS_LT,-CUDNN}  # empty for a TensorRT-RTX dry run
BERT_TIERS=${BERT_TIERS---tiers seq=512}  # one profile 1..512 (empty for the small BERT, whose seq ends at 128)

declare -A DATA EVAL TIERS GATE
for m in $MODELS; do
  case $m in
    bert*) DATA[$m]=calib_data/minilm; EVAL[$m]=calib_data/minilm_eval; TIERS[$m]="$BERT_TIERS"; GATE[$m]="--smooth 0.8" ;;
    *) DATA[$m]=calib_data/images; EVAL[$m]=calib_data/images_eval; TIERS[$m]=""; GATE[$m]="--min-top1-agreement 0.99" ;;
  esac
done

# 1. export + clean (the GPU box's python3: torch, transformers, torchvision), both models at once
for m in $MODELS; do
  ( mkdir -p "$W/$m"
    [ -f "$W/$m/$m.clean.onnx" ] || { step "export-$m" 600 "$P312 export --config $CONFIGS/$m.yaml -o $W/$m/$m.onnx" &&
      step "clean-$m" 300 "$P312 clean $W/$m/$m.onnx"; } ) &
done
wait

# 2. per model, overlapped (SERIAL=1: one job at a time, slower, no build shares the GPU's tactic timing):
#    BERT-base: calibrate (re-check off) -> build best (its engine re-check) | bisect (attention BMMs alone).
#    ResNet-50: calibrate with its engine re-check, whose engine (NAME.int8.best.engine, built by
#    `trtforge build --precision best` through the API, one profile) is trtforge's INT8 engine: no second build.
#    Both: the fp16 engine and the implicit-INT8 anchor.
bg() { if [ -n "${SERIAL:-}" ]; then "$@"; else "$@" & fi; }
text_chain() {
  local m=$1 M=$W/$1/$1
  step "calibrate-$m" 900 "$P310 calibrate $M.clean.onnx --data ${DATA[$m]} --eval-data ${EVAL[$m]} --max-samples 64 --max-eval-samples 64 ${GATE[$m]} --no-engine-check"
  # the Q/DQ ONNX exists even when a gate failed (exit 1): build and measure it anyway
  [ -f "$M.int8.onnx" ] && bg step "build-best-$m" 900 "$P310 build $M.int8.onnx --precision best ${TIERS[$m]} $TACTICS -o $M.best.engine"
  [ -f "$M.calib.cache" ] && step "bisect-$m" 600 "$P310 bisect $M.clean.onnx --cache $M.calib.cache --data ${EVAL[$m]} --max-samples 32 --groups ${BISECT_GROUPS:-attention_qk,attention_av} --modes alone --optimization-level 2 --out-dir $W/$m/bisect"
  wait
}
for m in $MODELS; do
  M=$W/$m/$m; [ -f "$M.clean.onnx" ] || continue
  case $m in bert*) TEXT=1 ;; *) TEXT= ;; esac
  if [ -n "$TEXT" ]; then
    bg text_chain "$m" > "$W/$m/chain.log" 2>&1
  else
    bg step "calibrate-recheck-$m" 900 "$P310 calibrate $M.clean.onnx --data ${DATA[$m]} --eval-data ${EVAL[$m]} --max-samples 64 --max-eval-samples 64 ${GATE[$m]}"
  fi
  bg step "build-fp16-$m" 900 "$P310 build $M.clean.onnx --precision fp16 ${TIERS[$m]} $TACTICS -o $M.fp16.engine"
  bg step "build-implicit-$m" 900 "$T benchmarks/gpu/implicit_int8.py build $M.clean.onnx $W/$m/implicit.engine --data ${DATA[$m]} --max-samples 64 ${TEXT:+--seq 128}"
done
wait

# 3. accuracy and GPU ms, one model at a time (no other job on the GPU while timing)
for m in $MODELS; do
  M=$W/$m/$m; ENG=""
  [ -f "$M.best.engine" ] && ENG="$ENG --engine trtforge_int8_best=$M.best.engine"
  [ -f "$M.int8.best.engine" ] && ENG="$ENG --engine trtforge_int8_best=$M.int8.best.engine"
  [ -f "$M.fp16.engine" ] && ENG="$ENG --engine fp16=$M.fp16.engine"
  [ -f "$W/$m/implicit.engine" ] && ENG="$ENG --engine trt_implicit_int8=$W/$m/implicit.engine"
  [ -n "$ENG" ] && step "compare-$m" 400 "$T benchmarks/gpu/implicit_int8.py compare $M.clean.onnx --eval-data ${EVAL[$m]} --max-samples 64 $ENG --json $W/$m/compare.json"
  for e in "$M.best.engine" "$M.int8.best.engine" "$M.fp16.engine"; do
    n=$(basename "$e" .engine)
    [ -f "$e" ] && step "inspect-$n" 60 "$P310 inspect $e > $W/$m/inspect_$n.txt; $P310 inspect $e --json > $W/$m/inspect_$n.json"
  done
done
touch "$W/DONE"
