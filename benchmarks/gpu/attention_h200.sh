#!/usr/bin/env bash
# Issue 11 item 1 on the H200 (TensorRT 8.6): the attention pass's engines against ORT fp32 on the ORIGINAL
# graph, and against the same engines built without the pass. Run detached from the project root after staging
# (../shared/gpu/README.md); every step appends {step, rc, seconds, cmd, tail} to $W/steps.jsonl and goes on
# after a failure; no step starts after DEADLINE. ~8 minutes of GPU time when the exports are fresh.
#   usage: [KEEP=DIR] bash benchmarks/gpu/attention_h200.sh W DEADLINE_EPOCH
# Order: (1) the plugin probe (short: one shape) on the GPU while the CPU exports BERT-base, ViT-B/16,
# RoBERTa-base (64-wide heads: the plugin's sm_90 kernels) and the small zoo BERT / GPT-2 (python3, torch);
# (2) fp16 builds under $PY310, three at a time, --fuse-attention on and off (small zoo: auto, which
# records their refusals: head 16 has no sm_90 kernel, GPT-2 is causal); (3) attention_compare.py per model
# (rel-L2 / cosine vs ORT fp32, GPU ms at 16x128, 16x512, 64x512, plugin and LayerNorm/GELU layers);
# (4) `trtforge run` and `inspect` on the fused BERT-base engine (the CLI path, its accuracy gate, the
# padding guard), and `run` refusing a padded attention_mask for it (exit 2 expected).
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
mkdir -p "$W"; : > "$W/steps.jsonl"
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
. "$ROOT/benchmarks/gpu/steps.sh"  # step NAME TIMEOUT_S CMD...

P312="PYTHONPATH=/tmp/site:$ROOT python3 -m trtforge"
PY="cd $ROOT && . $HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310"  # TensorRT 8.6's env only inside a step
TACTICS=${TACTICS---tactic-sources=-CUBLAS,-CUBLAS_LT,-CUDNN}  # empty: builder defaults
BIG=${BIG-"bert-base vit-b16 roberta-base"}
SMALL=${SMALL-"bert gpt2"}
cfg() { case " $BIG " in *" $1 "*) echo "zoo/configs/full/$1.yaml";; *) echo "zoo/configs/$1.yaml";; esac; }

# 1. exports + cleans on the CPU cores, the plugin probe on the GPU meanwhile
for m in $BIG $SMALL; do
  ( mkdir -p "$W/$m"
    [ -f "$W/$m/$m.clean.onnx" ] || { step "export-$m" 420 "$P312 export --config $(cfg $m) -o $W/$m/$m.onnx" &&
    step "clean-$m" 240 "$P312 clean $W/$m/$m.onnx"; } ) &
done
step probe-plugins 200 "$PY benchmarks/gpu/probe_attention_plugins.py --shapes 16x512 --json $W/plugins.json"
wait

# 2. fp16 engines: the pass on and off (three builds at a time; cuBLAS/cuDNN tactic sources off on 8.6)
build() {  # MODEL MODE LABEL
  [ -f "$W/$1/$1.clean.onnx" ] || return 1
  step "build-$1-$3" 600 "$PY -m trtforge build $W/$1/$1.clean.onnx --config $(cfg $1) --precision fp16 $TACTICS --fuse-attention $2 -o $W/$1/$1.$3.engine --json > $W/$1/$1.$3.build.json"
}
build bert-base on fused & build bert-base off unfused & build vit-b16 on fused & build bert auto auto & build gpt2 auto auto & wait
build roberta-base on fused & build vit-b16 off unfused & wait

# 3. accuracy vs ORT fp32 on the original graph, GPU ms, layers
engines() { for l in "$@"; do [ -f "$W/$M/$M.$l.engine" ] && printf -- ' --engine %s=%s' "$l" "$W/$M/$M.$l.engine"; done; }
compare() {  # MODEL TIMEOUT ENGINE_LABELS ARGS...
  M=$1; local limit=$2 labels=$3; shift 3
  [ -f "$W/$M/$M.clean.onnx" ] || return 1
  step "compare-$M" "$limit" "$PY benchmarks/gpu/attention_compare.py --reference $W/$M/$M.clean.onnx $(engines $labels) $* --json $W/$M/compare.json"
}
compare bert-base 240 "fused unfused" --check 2x128,2x512 --time 16x128,16x512,64x512
compare vit-b16 180 "fused unfused" --check 2 --time 16,64
compare roberta-base 180 fused --check 2x128,2x510 --time 16x128,16x510
compare bert 90 auto --check 2x128
compare gpt2 90 auto --check 2x128

# 4. the CLI on the fused BERT-base engine: inspect, run with its gates, and the padding guard (exit 2 expected)
E=$W/bert-base/bert-base.fused.engine
if [ -f "$E" ]; then
  step inspect-fused 60 "$PY -m trtforge inspect $E"
  step run-fused 240 "$PY -m trtforge run $E --config zoo/configs/full/bert-base.yaml --reference $W/bert-base/bert-base.clean.onnx --report $W/bert-base/run.fused.json"
  mkdir -p "$W/padded" && python3 -c "import numpy as np; np.savez('$W/padded/doc.npz', input_ids=np.full((1, 64), 2000, np.int64), attention_mask=np.concatenate([np.ones((1, 60), np.int64), np.zeros((1, 4), np.int64)], 1))"
  step padded-refused 120 "$PY -m trtforge run $E --inputs $W/padded --no-chunking --reference $W/bert-base/bert-base.clean.onnx; test \$? -eq 2"
fi

for m in $BIG $SMALL; do [ -f "$W/$m/compare.json" ] && echo "== $m" && sed -n '/^|/p' "$W/log.compare-$m"; done > "$W/table.md" 2>&1
# The small results (JSON, logs, tables; not the engines) to $KEEP when given, e.g. the device tool's $OUT/attn.
if [ -n "${KEEP:-}" ]; then
  mkdir -p "$KEEP" && cp "$W"/steps.jsonl "$W"/table.md "$W"/log.* "$KEEP"/ 2>/dev/null
  cp "$W"/plugins.json "$KEEP"/ 2>/dev/null
  for m in $BIG $SMALL; do
    for f in "$W/$m"/compare.json "$W/$m"/*.build.json "$W/$m"/run.*.json "$W/$m"/*.engine.json "$W/$m"/*.layers.json; do
      [ -f "$f" ] && cp "$f" "$KEEP/$m.$(basename "$f")"
    done
  done
fi
touch "$W/DONE"
