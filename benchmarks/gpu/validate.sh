#!/usr/bin/env bash
# trtforge's GPU validation: named suites that export the zoo's full-size models, build engines, check them against
# ONNX Runtime fp32 with `trtforge run --reference` and time them against PyTorch. docs/gpu-validation.md explains
# each suite, what it proves and how to read its results.
#
#   bash benchmarks/gpu/validate.sh [-w WORKDIR] [-t SECONDS] SUITE [SUITE ...]
#   bash benchmarks/gpu/validate.sh list
#
# Suites: zoo vs-torch int8 fp8 attention runloop stateful ray modern (all: every suite, in that order).
# Run it from the repository root. Every step runs under a timeout capped by the deadline (-t, default 3600 s),
# writes its output to WORKDIR/log.STEP and appends {step, rc, seconds, cmd, tail} to WORKDIR/steps.jsonl; a failed
# step does not stop the suite. WORKDIR (default out/gpu-validation) ends with SUMMARY.md, the tables of the suites
# that ran, and DONE. Exit status: 0 if every step exited 0 (or its expected status), else 1.
#
# Environment (defaults in brackets):
#   TORCH_PY     Python with torch, transformers, torchvision and tokenizers: export, clean, torch timings [python3]
#   TRT_PY       Python with TensorRT and cuda-python: build, run, the engines' timings [python3]
#   TRT_ENV      shell code run before each TRT_PY command, e.g. ". ~/trt86.env" where TensorRT lives in a Python
#                environment of its own that must not leak into TORCH_PY's []
#   TACTICS      --tactic-sources value for every build, e.g. -CUBLAS,-CUBLAS_LT,-CUDNN where cuBLAS/cuDNN are absent []
#   PLUGIN_LIB   libtrtforge_plugins.so to load in every build; unset: built into WORKDIR by trtforge/native/build.sh
#                when its variables (TRT_INCLUDE, CUDNN_INCLUDE, CUDNN_LIB, CUDNN_FRONTEND_INCLUDE) are set, else
#                none (fp16 builds then use TensorRT's own plugins, and the fp8 suite is skipped)
#   CONFIGS      the zoo's full-size configs [zoo/configs/full]
#   ZOO_MODELS   the zoo suite's models [bert-base gpt2 vit-b16 roberta-base resnet50 deeplabv3]
#   MODERN_MODELS the modern suite's models, to split it over short windows [modernbert-base wav2vec2-base qwen2-kv]
set -u
ROOT=$(pwd)
W=out/gpu-validation SECS=3600
while getopts "w:t:" o; do case $o in w) W=$OPTARG ;; t) SECS=$OPTARG ;; *) exit 2 ;; esac; done
shift $((OPTIND - 1))
SUITES_ALL="zoo vs-torch int8 fp8 attention runloop stateful ray modern"
if [ "${1:-}" = list ] || [ $# -eq 0 ]; then
  echo "suites: $SUITES_ALL (or all)"; [ $# -eq 0 ] && exit 2; exit 0
fi
[ "$1" = all ] && set -- $SUITES_ALL
for s in "$@"; do case " $SUITES_ALL " in *" $s "*) ;; *) echo "unknown suite '$s'; one of: $SUITES_ALL" >&2; exit 2 ;; esac; done
[ -d trtforge ] && [ -d zoo ] || { echo "run from the trtforge repository root" >&2; exit 2; }
mkdir -p "$W"; W=$(cd "$W" && pwd); : > "$W/steps.jsonl"; : > "$W/SUMMARY.md"; rm -f "$W/DONE"
DEADLINE=$(( $(date +%s) + SECS ))
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
TP="PYTHONPATH=$ROOT:\${PYTHONPATH:-} ${TORCH_PY:-python3}"
RP="${TRT_ENV:+$TRT_ENV && }PYTHONPATH=$ROOT:\${PYTHONPATH:-} ${TRT_PY:-python3}"
TAC=${TACTICS:+--tactic-sources $TACTICS}
CFG=${CONFIGS:-zoo/configs/full}
FAILED=0

# step NAME TIMEOUT_S CMD: CMD under bash with a timeout capped by the deadline, recorded in steps.jsonl.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    printf '{"step": "%s", "rc": null, "skipped": "deadline"}\n' "$name" >> "$W/steps.jsonl"; FAILED=1; return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0 log="$W/log.$name" rc; t0=$(date +%s.%N)
  (cd "$ROOT" && timeout "$limit" bash -c "$*") > "$log" 2>&1; rc=$?
  python3 - "$name" "$rc" "$t0" "$*" "$log" >> "$W/steps.jsonl" <<'PY'
import json, sys, time
name, rc, t0, cmd, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-1500:]
print(json.dumps({"step": name, "rc": int(rc), "seconds": round(time.time() - float(t0), 1), "cmd": cmd, "tail": tail}))
PY
  echo "[$name] rc=$rc"
  [ "$rc" -eq 0 ] || FAILED=1
  return $rc
}

M() { echo "$W/$1/$1"; }                      # where a model's files live: WORKDIR/MODEL/MODEL.onnx, .clean.onnx, ...
eng() { for l in "$@"; do [ -f "${l#*=}" ] && printf ' --engine %s' "$l"; done; }  # engines that were built
section() { printf '\n## %s\n\n' "$1" >> "$W/SUMMARY.md"; }

# export and clean each model (in parallel) unless WORKDIR already holds its clean ONNX
export_clean() {
  for m in "$@"; do
    ( mkdir -p "$W/$m"
      [ -f "$(M "$m").clean.onnx" ] || { step "export-$m" 900 "$TP -m trtforge export --config $CFG/$m.yaml -o $(M "$m").onnx" &&
        step "clean-$m" 300 "$TP -m trtforge clean $(M "$m").onnx"; } ) &
  done
  wait
}

# build MODEL LABEL FLAGS...: MODEL's clean ONNX -> WORKDIR/MODEL/MODEL.LABEL.engine (skipped when it exists)
build() {
  local m=$1 label=$2; shift 2
  [ -f "$(M "$m").clean.onnx" ] || return 1
  [ -f "$(M "$m").$label.engine" ] && return 0
  step "build-$label-$m" 900 "$RP -m trtforge build $(M "$m").clean.onnx --config $CFG/$m.yaml $TAC $PLUG_FLAG $* -o $(M "$m").$label.engine"
}

# run-reference MODEL LABEL [FLAGS]: the engine against ORT fp32 on the clean ONNX, over the config's inputs
run_ref() {
  local m=$1 label=$2; shift 2
  [ -f "$(M "$m").$label.engine" ] || return 1
  step "run-ref-$label-$m" 900 "$RP -m trtforge run $(M "$m").$label.engine --config $CFG/$m.yaml --reference $(M "$m").clean.onnx $* --report $W/$m/run_ref_$label.json"
}

plugins() {
  PLUG_FLAG=""
  if [ -n "${PLUGIN_LIB:-}" ]; then
    [ -f "$PLUGIN_LIB" ] && PLUG_FLAG="--plugin-library $PLUGIN_LIB"
  elif [ -n "${TRT_INCLUDE:-}" ] && [ -n "${CUDNN_INCLUDE:-}" ] && [ -n "${CUDNN_LIB:-}" ] && [ -n "${CUDNN_FRONTEND_INCLUDE:-}" ]; then
    step plugin-build 600 "bash trtforge/native/build.sh $W/libtrtforge_plugins.so" && PLUG_FLAG="--plugin-library $W/libtrtforge_plugins.so"
  fi
  echo "plugin library: ${PLUG_FLAG:-none}"
}

# vs_torch ROUND "NAME=ENGINE ..." TORCH_MODELS: the engines' and torch eager's GPU ms in the same window; round 2 runs
# torch first, so neither side always has the warmer GPU.
vs_torch() {
  local r=$1 engines=$2 models=$3 e t
  e="$RP benchmarks/vs_torch.py engine $(eng $engines) --out $W/engine_$r.json"
  t="$TP benchmarks/vs_torch.py torch --models $models --no-e2e --out $W/torch_$r.json"
  case $r in
    *1) step "engine-$r" 600 "$e"; step "torch-$r" 600 "$t" ;;
    *) step "torch-$r" 600 "$t"; step "engine-$r" 600 "$e" ;;
  esac
  step "table-$r" 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_$r.json --engine $W/engine_$r.json --out $W/vs_torch_$r.json > $W/table_$r.md"
}

# docs_varied N DIR: each calib_data/minilm_long text N times, copy k cut to (100 - N + k)% of its bytes, so that the
# documents' last windows differ in length as real inputs' do.
docs_varied() {
  local n=$1 dir=$W/$2; mkdir -p "$dir"
  for k in $(seq 1 "$n"); do for f in calib_data/minilm_long/*.txt; do
    head -c $(( $(wc -c < "$f") * (100 - n + k) / 100 )) "$f" > "$dir/${k}_$(basename "$f")"; done; done
}

suite_zoo() {  # every full-size zoo model: export, clean, fp16 build, `run --reference`
  local models=${ZOO_MODELS:-"bert-base gpt2 vit-b16 roberta-base resnet50 deeplabv3"}
  export_clean $models
  for m in $models; do build "$m" fp16 --precision fp16; done
  for m in $models; do run_ref "$m" fp16; done
  step probe-plugins 300 "$RP benchmarks/gpu/probe_attention_plugins.py --json $W/plugins.json"
  step zoo-table 60 "python3 benchmarks/gpu/zoo_table.py $W > $W/zoo.md"
  section "zoo"; cat "$W/zoo.md" >> "$W/SUMMARY.md" 2>/dev/null
}

suite_vs_torch() {  # BERT-base, MiniLM and GPT-2 fp16 engines against torch fp16 eager SDPA, and `run` end to end
  export_clean bert-base minilm gpt2
  build bert-base fp16 --precision fp16; build minilm fp16 --precision fp16 --tiers seq=256; build gpt2 fp16 --precision fp16
  local E="bert-base=$(M bert-base).fp16.engine minilm=$(M minilm).fp16.engine gpt2=$(M gpt2).fp16.engine"
  vs_torch 1 "$E" "bert-base minilm gpt2"; vs_torch 2 "$E" "bert-base minilm gpt2"
  mkdir -p "$W/docs8"; for k in 1 2 3 4 5 6 7 8; do for f in calib_data/minilm_long/*.txt; do cp "$f" "$W/docs8/${k}_$(basename "$f")"; done; done
  for m in bert-base minilm; do
    [ -f "$(M $m).fp16.engine" ] && step "run-docs8-$m" 300 "$RP -m trtforge run $(M $m).fp16.engine --config $CFG/$m.yaml --inputs $W/docs8 --no-precision-check --no-chunking-check --report $W/$m/run_docs8.json"
  done
  step torch-e2e 600 "$TP benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch_e2e.json"
  step table-e2e 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_e2e.json --engine $W/engine_1.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch_e2e.json > $W/table_e2e.md"
  section "vs-torch"; cat "$W"/table_1.md "$W"/table_2.md "$W"/table_e2e.md >> "$W/SUMMARY.md" 2>/dev/null
}

suite_int8() {  # INT8 on the engine: calibrate (engine re-check), build best, bisect, against TensorRT's implicit INT8
  export_clean bert-base resnet50
  local B R; B=$(M bert-base); R=$(M resnet50)
  step calibrate-bert-base 900 "$RP -m trtforge calibrate $B.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval --max-samples 64 --max-eval-samples 64 --smooth 0.8"
  [ -f "$B.int8.onnx" ] && step build-best-bert-base 900 "$RP -m trtforge build $B.int8.onnx --precision best --tiers seq=512 $TAC -o $B.best.engine"
  [ -f "$B.calib.cache" ] && step bisect-bert-base 900 "$RP -m trtforge bisect $B.clean.onnx --cache $B.calib.cache --data calib_data/minilm_eval --max-samples 32 --groups attention_qk,attention_av --modes alone --optimization-level 2 --out-dir $W/bert-base/bisect"
  step calibrate-resnet50 900 "$RP -m trtforge calibrate $R.clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99"
  local m; for m in bert-base resnet50; do
    local tiers=""; [ "$m" = bert-base ] && tiers="--tiers seq=512"
    [ -f "$(M $m).int8fp16.engine" ] || step "build-fp16-$m" 900 "$RP -m trtforge build $(M $m).clean.onnx --precision fp16 $tiers $TAC -o $(M $m).int8fp16.engine"
    local data=calib_data/images eval=calib_data/images_eval seq=""; [ "$m" = bert-base ] && { data=calib_data/minilm; eval=calib_data/minilm_eval; seq="--seq 128"; }
    step "build-implicit-$m" 900 "$RP benchmarks/gpu/implicit_int8.py build $(M $m).clean.onnx $W/$m/implicit.engine --data $data --max-samples 64 $seq"
    step "compare-$m" 600 "$RP benchmarks/gpu/implicit_int8.py compare $(M $m).clean.onnx --eval-data $eval --max-samples 64 $(eng trtforge_int8_best=$(M $m).best.engine trtforge_int8_best=$(M $m).int8.best.engine fp16=$(M $m).int8fp16.engine trt_implicit_int8=$W/$m/implicit.engine) --json $W/$m/compare.json"
  done
  mkdir -p "$W/gemm"
  step gemm-models 120 "$TP benchmarks/gpu/gemm_ceiling.py models $W/gemm" && step gemm-time 300 "$RP benchmarks/gpu/gemm_ceiling.py time $W/gemm --json $W/gemm_ceiling.json"
  section "int8"; for m in bert-base resnet50; do echo "### $m"; sed -n '/^|/p' "$W/log.compare-$m" 2>/dev/null; done >> "$W/SUMMARY.md"
}

suite_fp8() {  # FP8 GEMMs (TrtforgeGemmFp8, FC1 -> FC2 chained) beside fp16: the build gate, timings, `run --reference`
  [ -n "$PLUG_FLAG" ] || { section "fp8"; echo "skipped: no plugin library (PLUGIN_LIB or the build.sh variables)" >> "$W/SUMMARY.md"; return; }
  export_clean bert-base gpt2 vit-b16 roberta-base
  local m; for m in bert-base gpt2 vit-b16 roberta-base; do
    build "$m" fp16 --precision fp16; build "$m" fp8 --precision fp16 --gemm-precision fp8
  done
  build bert-base fp8unchained --precision fp16 --gemm-precision fp8 --fp8-chain-ffn off
  local B G; B=$(M bert-base); G=$(M gpt2)
  local E="bert-base=$B.fp16.engine bert-base-fp8=$B.fp8.engine bert-base-fp8-unchained=$B.fp8unchained.engine gpt2=$G.fp16.engine gpt2-fp8=$G.fp8.engine"
  vs_torch fp8-1 "$E" "bert-base gpt2"; vs_torch fp8-2 "$E" "bert-base gpt2"
  for m in bert-base gpt2 vit-b16; do run_ref "$m" fp16; run_ref "$m" fp8; done
  section "fp8"; cat "$W"/table_fp8-1.md "$W"/table_fp8-2.md >> "$W/SUMMARY.md" 2>/dev/null
}

suite_attention() {  # the attention pass: engines fused and unfused against ORT fp32 on the original graph
  export_clean bert-base vit-b16 roberta-base
  step probe-plugins-16x512 200 "$RP benchmarks/gpu/probe_attention_plugins.py --shapes 16x512 --json $W/plugins_16x512.json"
  build bert-base fused --precision fp16 --fuse-attention on; build bert-base unfused --precision fp16 --fuse-attention off
  build vit-b16 fused --precision fp16 --fuse-attention on; build vit-b16 unfused --precision fp16 --fuse-attention off
  build roberta-base fused --precision fp16 --fuse-attention on
  local B; B=$(M bert-base)
  step compare-attn-bert-base 600 "$RP benchmarks/gpu/attention_compare.py --reference $B.clean.onnx $(eng fused=$B.fused.engine unfused=$B.unfused.engine) --check 2x128,2x512 --time 16x128,16x512,64x512 --json $W/bert-base/attention.json"
  step compare-attn-vit-b16 600 "$RP benchmarks/gpu/attention_compare.py --reference $(M vit-b16).clean.onnx $(eng fused=$(M vit-b16).fused.engine unfused=$(M vit-b16).unfused.engine) --check 2 --time 16,64 --json $W/vit-b16/attention.json"
  step compare-attn-roberta-base 600 "$RP benchmarks/gpu/attention_compare.py --reference $(M roberta-base).clean.onnx $(eng fused=$(M roberta-base).fused.engine) --check 2x128,2x510 --time 16x128,16x510 --json $W/roberta-base/attention.json"
  if [ -f "$B.fused.engine" ]; then
    step inspect-fused 60 "$RP -m trtforge inspect $B.fused.engine"
    mkdir -p "$W/padded" && python3 -c "import numpy as np; np.savez('$W/padded/doc.npz', input_ids=np.full((1, 64), 2000, np.int64), attention_mask=np.concatenate([np.ones((1, 60), np.int64), np.zeros((1, 4), np.int64)], 1))"
    step padded-refused 120 "$RP -m trtforge run $B.fused.engine --inputs $W/padded --no-chunking --reference $B.clean.onnx; test \$? -eq 2"
  fi
  section "attention"; for m in bert-base vit-b16 roberta-base; do echo "### $m"; sed -n '/^|/p' "$W/log.compare-attn-$m" 2>/dev/null; done >> "$W/SUMMARY.md"
}

suite_runloop() {  # `run`'s loop: wall against GPU time, CUDA graphs on/off, the copy-engine merge equal to the host's
  export_clean bert-base minilm
  build bert-base fp16 --precision fp16; build minilm fp16 --precision fp16 --tiers seq=256
  docs_varied 32 docs32v
  mkdir -p "$W/docs128v"; for k in 1 2 3 4; do for f in "$W"/docs32v/*.txt; do cp "$f" "$W/docs128v/${k}_$(basename "$f")"; done; done
  step pretokenize 300 "$TP benchmarks/gpu/pretokenize.py $W/docs128v $(M minilm).tokenizer $W/docs128v.jsonl"
  local m r fast="--no-precision-check --no-chunking-check"
  for m in bert-base minilm; do
    [ -f "$(M $m).fp16.engine" ] || continue
    for r in 1 2; do step "run-ids-$m-$r" 300 "$RP -m trtforge run $(M $m).fp16.engine --config $CFG/$m.yaml --inputs $W/docs128v.jsonl $fast --report $W/$m/run_ids_$r.json"; done
    step "run-text-$m" 300 "$RP -m trtforge run $(M $m).fp16.engine --config $CFG/$m.yaml --inputs $W/docs32v $fast --report $W/$m/run_text.json"
    step "run-nographs-$m" 300 "$RP -m trtforge run $(M $m).fp16.engine --config $CFG/$m.yaml --inputs $W/docs128v.jsonl $fast --no-cuda-graphs --report $W/$m/run_nographs.json"
    step "run-ref-$m" 600 "$RP -m trtforge run $(M $m).fp16.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref.json"
  done
  local N; N=$(M minilm)
  if [ -f "$N.fp16.engine" ]; then
    step save-copy 300 "$RP -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/docs32v $fast --save-outputs $W/copy.npz"
    step save-host 300 "$RP -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/docs32v $fast --no-copy-engine-merge --save-outputs $W/host.npz"
    step merges-equal 300 "python3 benchmarks/compare_outputs.py $W/copy.npz $W/host.npz --atol 0 --json $W/merges_equal.json"
    rm -f "$W/copy.npz" "$W/host.npz"
  fi
  step stalls 60 "python3 benchmarks/run_stalls.py $W/*/run_ids_*.json --json $W/stalls.json"
  step reports-table 60 "python3 benchmarks/gpu/run_reports_table.py $W > $W/runs.md"
  section "runloop"; cat "$W/runs.md" >> "$W/SUMMARY.md" 2>/dev/null
}

suite_stateful() {  # a LLaMA-style decoder with a KV cache: stateful chunked prefill + generation against one full pass
  mkdir -p "$W/llama-kv"; local L=$W/llama-kv/llama-kv
  [ -f "$L.onnx" ] || step export-llama-kv 900 "$TP -m trtforge export --config $CFG/llama-kv.yaml -o $L.onnx"
  step tokenize-llama-kv 120 "$TP benchmarks/gpu/stateful.py tokenize $L.tokenizer $W/llama-kv/docs4096.jsonl 4096"
  step build-stateful 1500 "$RP -m trtforge build $L.onnx --precision fp16 --tiers 'seq=512;past=0,1024,4096' $TAC -o $L.fp16.engine"
  step build-full 1500 "$RP -m trtforge build $L.onnx --precision fp16 --tiers 'seq=4224;past=0' $TAC -o $L-full.fp16.engine"
  step stateful 1200 "$RP -m trtforge run $L.fp16.engine --inputs $W/llama-kv/docs4096.jsonl --chunk 512 --stateful --generate 32 --reference $L-full.fp16.engine --report $W/llama-kv/stateful.json"
  step stateful-ort 1200 "$RP -m trtforge run $L.onnx --inputs $W/llama-kv/docs4096.jsonl --chunk 512 --stateful --report $W/llama-kv/stateful_ort.json"
  step stateful-table 60 "python3 benchmarks/gpu/stateful.py table $W/llama-kv > $W/stateful.md"
  section "stateful"; cat "$W/stateful.md" >> "$W/SUMMARY.md" 2>/dev/null
}

suite_ray() {  # `run --ray`: one actor per GPU against the one-process run, on the same engine
  export_clean bert-base
  build bert-base fp16 --precision fp16
  local B; B=$(M bert-base); [ -f "$B.fp16.engine" ] || return
  step ray-run 900 "$RP -m trtforge run $B.fp16.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --ray auto --report $W/bert-base/ray_run.json"
  step ray-scaling 900 "$RP benchmarks/ray_scaling.py $B.fp16.engine --reference $B.clean.onnx --min-tokens 200000 --chunk 256 --overlap 32 --batch-size 16 --json $W/ray_scaling.json"
  section "ray"; tail -8 "$W/log.ray-scaling" >> "$W/SUMMARY.md" 2>/dev/null
}

# build_facts MODEL ENGINE STEP: a markdown row of what a build printed and recorded: its 'attention: fused N of M' and
# 'build time:' lines (WORKDIR/log.STEP), and from the engine's sidecar the build seconds and the accuracy gate.
build_facts() {
  local m=$1 e=$2 log=$W/log.$3 att bt side
  att=$(grep -m1 -o 'attention: fused.*' "$log" 2>/dev/null); bt=$(grep -m1 -o 'build time:.*' "$log" 2>/dev/null)
  side=$(python3 - "$e.json" <<'PY' 2>/dev/null
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("no sidecar | -"); raise SystemExit
check = s.get("engine_check") or {}
seconds = s.get("build_seconds")
print(f"{seconds:.0f} s" if isinstance(seconds, (int, float)) else "-", "|", check.get("status") or "-")
PY
)
  echo "| $m | $(basename "$e") | ${att:-no 'attention:' line} | ${bt:-no 'build time:' line} | ${side:-no sidecar | -} |"
}

# modern_times MODEL ROUND "NAME=ENGINE ...": the engines' and torch eager's GPU ms for one model, each half a step of its
# own (WORKDIR/modern/{engine,torch}_MODEL_ROUND.json); round 1 runs the engines first, round 2 torch first; round
# compile: torch eager and torch.compile in one process (no engines).
modern_times() {
  local m=$1 r=$2 engines=$3 D=$W/modern flags
  flags=$(eng $engines)
  local e="$RP benchmarks/vs_torch.py engine $flags --out $D/engine_${m}_$r.json"
  local t="$TP benchmarks/vs_torch.py torch --models $m --no-e2e --out $D/torch_${m}_$r.json"
  case $r in
    1) [ -n "$flags" ] && step "engine-$m-$r" 600 "$e"; step "torch-$m-$r" 600 "$t" ;;
    2) step "torch-$m-$r" 600 "$t"; [ -n "$flags" ] && step "engine-$m-$r" 600 "$e" ;;
    compile) step "torch-$m-compile" 900 "$t --compile --compile-budget-s 600" ;;
  esac
  return 0
}

# modern_exports: the three modern models' exports (ModernBERT-base and wav2vec2-base cleaned; the Qwen2-shaped decoder
# with the default exporter first, what a user runs, the dynamo exporter where it fails); started beside the plugin build.
modern() { case " ${MODERN_MODELS:-modernbert-base wav2vec2-base qwen2-kv} " in *" $1 "*) return 0 ;; esac; return 1; }

modern_exports() {
  local Q=$W/qwen2-kv/qwen2-kv m encoders=""; mkdir -p "$W/qwen2-kv"
  for m in modernbert-base wav2vec2-base; do modern "$m" && encoders="$encoders $m"; done
  [ -n "$encoders" ] && export_clean $encoders &
  if modern qwen2-kv && [ ! -f "$Q.onnx" ]; then
    step export-qwen2-kv 1200 "$TP -m trtforge export --config $CFG/qwen2-kv.yaml -o $Q.onnx" ||
      step export-dynamo-qwen2-kv 1200 "$TP -m trtforge export --config $CFG/qwen2-kv.yaml --exporter dynamo -o $Q.onnx"
  fi
  wait
}

suite_modern() {  # ModernBERT-base, wav2vec2-base and a Qwen2-shaped GQA decoder: fused attention, speed against torch
  local D=$W/modern Q=$W/qwen2-kv/qwen2-kv T=$W/modern/wav60 B W2 m r args
  mkdir -p "$D" "$T" "$W/qwen2-kv"; B=$(M modernbert-base); W2=$(M wav2vec2-base)
  local QE="qwen2-prefill=$Q-full.fp16.engine qwen2-prefill-stateful=$Q.fp16.engine"
  local E_modernbert_base="modernbert-base=$B.fp16.engine" E_wav2vec2_base="wav2vec2-base=$W2.fp16.engine" E_qwen2_prefill=$QE
  if [ -n "${MODERN_EXPORTS:-}" ]; then wait "$MODERN_EXPORTS"; else modern_exports; fi
  for m in modernbert-base wav2vec2-base; do  # the exports ran in a subshell: their status is lost
    modern "$m" && { [ -f "$(M "$m").clean.onnx" ] || FAILED=1; }
  done
  local timed=""; for m in modernbert-base wav2vec2-base qwen2-prefill; do modern "${m/prefill/kv}" && timed="$timed $m"; done
  # In the order of the figures' weight, each model's build, speed and accuracy together (a short window still gets
  # ModernBERT-base's whole story); round 2 and torch.compile after every model's first round.
  if modern modernbert-base; then
    build modernbert-base fp16 --precision fp16
    modern_times modernbert-base 1 "$E_modernbert_base"
    run_ref modernbert-base fp16
  fi
  if modern wav2vec2-base; then
    build wav2vec2-base fp16 --precision fp16
    modern_times wav2vec2-base 1 "$E_wav2vec2_base"
  fi
  # a 60 s recording (16 kHz mono, 16 bit) through wav2vec2-base in 10 s windows with 1 s of overlap
  cat > "$D/write_wav.py" <<'PY'
"""A synthetic 16 kHz mono 16-bit recording: a gliding tone under noise. python3 write_wav.py OUT.wav SECONDS"""
import math, random, struct, sys, wave
rate, seconds, rng = 16000, float(sys.argv[2]), random.Random(0)
with wave.open(sys.argv[1], "wb") as out:
    out.setnchannels(1); out.setsampwidth(2); out.setframerate(rate)
    samples = (0.3 * math.sin(2 * math.pi * (200 + 80 * math.sin(0.6 * i / rate)) * i / rate) + 0.05 * rng.gauss(0, 1) for i in range(int(rate * seconds)))
    out.writeframes(b"".join(struct.pack("<h", int(max(-1.0, min(1.0, x)) * 32767)) for x in samples))
PY
  step wav60 120 "python3 $D/write_wav.py $T/minute.wav 60"
  local chunked="--config $CFG/wav2vec2-base.yaml --inputs $T --chunk 160000 --overlap 16000"
  [ -f "$W2.fp16.engine" ] && step run-wav60-wav2vec2-base 600 "$RP -m trtforge run $W2.fp16.engine $chunked --report $W/wav2vec2-base/run_wav60.json"
  if [ -f "$Q.onnx" ]; then  # stateful (chunk <= 512 over past tiers 0 / 1024 / 4096) and one pass (4224 at past 0)
    step tokenize-qwen2-kv 120 "$TP benchmarks/gpu/stateful.py tokenize $Q.tokenizer $W/qwen2-kv/docs4096.jsonl 4096"
    [ -f "$Q.fp16.engine" ] || step build-stateful-qwen2-kv 1500 "$RP -m trtforge build $Q.onnx --precision fp16 --tiers 'seq=512;past=0,1024,4096' $TAC $PLUG_FLAG -o $Q.fp16.engine"
    [ -f "$Q-full.fp16.engine" ] || step build-full-qwen2-kv 1500 "$RP -m trtforge build $Q.onnx --precision fp16 --tiers 'seq=4224;past=0' $TAC $PLUG_FLAG -o $Q-full.fp16.engine"
  fi
  modern qwen2-kv && modern_times qwen2-prefill 1 "$QE"  # torch's prefill is timed without the engines too
  [ -f "$Q.fp16.engine" ] && [ -f "$Q-full.fp16.engine" ] &&
    step stateful-qwen2-kv 1200 "$RP -m trtforge run $Q.fp16.engine --inputs $W/qwen2-kv/docs4096.jsonl --chunk 512 --stateful --generate 32 --reference $Q-full.fp16.engine --report $W/qwen2-kv/stateful.json"
  for m in $timed; do args=E_${m//-/_}; modern_times "$m" 2 "${!args}"; done
  [ -f "$W2.fp16.engine" ] && step run-wav60-ref-wav2vec2-base 900 "$RP -m trtforge run $W2.fp16.engine $chunked --reference $W2.clean.onnx --report $W/wav2vec2-base/run_wav60_ref.json"
  for m in $timed; do modern_times "$m" compile ""; done
  for r in 1 2 compile; do  # the compile table sets each torch.compile against the engines of round 1
    args=""; for m in $timed; do args="$args --torch $D/torch_${m}_$r.json --engine $D/engine_${m}_${r/compile/1}.json"; done
    step "table-modern-$r" 60 "python3 benchmarks/vs_torch.py table $args --out $D/vs_torch_$r.json > $D/table_$r.md"
  done
  step stateful-table-qwen2-kv 60 "python3 benchmarks/gpu/stateful.py table $W/qwen2-kv | grep -v '^| ONNX Runtime' > $D/stateful.md"
  section "modern"
  {
    echo "### builds"; echo
    echo "| model | engine | attention | build time | build s (sidecar) | accuracy gate |"; echo "|---|---|---|---|---|---|"
    build_facts modernbert-base "$B.fp16.engine" build-fp16-modernbert-base
    build_facts wav2vec2-base "$W2.fp16.engine" build-fp16-wav2vec2-base
    build_facts qwen2-kv "$Q.fp16.engine" build-stateful-qwen2-kv
    build_facts qwen2-kv "$Q-full.fp16.engine" build-full-qwen2-kv
    for r in 1 2 compile; do
      case $r in 1) echo; echo "### against torch eager, round 1 (engines first)" ;; 2) echo; echo "### against torch eager, round 2 (torch first)" ;;
        compile) echo; echo "### against torch.compile (eager and compiled in one process; engines of round 1)" ;; esac
      echo; cat "$D/table_$r.md" 2>/dev/null
    done
    echo; echo "### stateful prefill, qwen2-kv (4096 tokens, chunk 512, against the one-pass engine)"; echo
    cat "$D/stateful.md" 2>/dev/null
    echo; echo "### runs against ONNX Runtime fp32 and over a 60 s recording"; echo
    for f in "$W/modernbert-base/run_ref_fp16.json" "$W/wav2vec2-base/run_wav60.json" "$W/wav2vec2-base/run_wav60_ref.json"; do
      python3 - "$f" <<'PY' 2>/dev/null || echo "- $f: not produced (see steps.jsonl)"
import json, sys
r = json.load(open(sys.argv[1]))
keep = lambda d: {k: d.get(k) for k in ("measured", "worst", "reason") if k in (d or {})}
print(f"- {sys.argv[1]}: precision {json.dumps(keep(r.get('precision_error')))}; chunking {json.dumps(keep(r.get('chunking_error')))}; "
      f"throughput {json.dumps({k: r.get('throughput', {}).get(k) for k in ('tokens_per_s', 'unit', 'chunks_per_s', 'seconds')})}; "
      f"gates {json.dumps(r.get('gates'))}")
PY
    done
  } >> "$W/SUMMARY.md"
}

{ echo "# GPU validation"; echo; echo "suites: $*; $(date -u +%FT%TZ); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; } >> "$W/SUMMARY.md"
step gpu 30 "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader"
step versions 120 "$RP -m trtforge doctor"
cat "$W/log.gpu" "$W/log.versions" >> "$W/SUMMARY.md" 2>/dev/null
case " $* " in *" modern "*) modern_exports & MODERN_EXPORTS=$! ;; esac  # beside the plugin build
plugins
for s in "$@"; do "suite_${s//-/_}"; done
touch "$W/DONE"
echo "summary: $W/SUMMARY.md"
exit $FAILED
