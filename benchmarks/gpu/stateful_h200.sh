#!/usr/bin/env bash
# Issue 12 on the H200: a LLaMA-style decoder (zoo llama size=full: 8 layers, hidden 1024, 16 heads over
# 4 kv heads, random init), KV-cache export under python3 (torch), fp16 builds and stateful runs under
# TensorRT 8.6 ($PY310). Run from the project root after staging (../shared/gpu/README.md), detached:
#   bash benchmarks/gpu/stateful_h200.sh W DEADLINE_EPOCH
# Steps append {step, rc, seconds, cmd, tail} to $W/steps.jsonl and go on after a failure.
# Engines: (a) stateful: prefill profiles chunk <= 512 x past tiers 0 / 1024 / 4096 + the decode profile;
# (b) one-pass reference: seq <= 4224 at past 0, so its activation memory is that of a full pass.
# The stateful run (chunk 512, --generate 32) compares against (b) and measures device memory of each.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
TACTICS=-CUBLAS,-CUBLAS_LT,-CUDNN
mkdir -p "$W"; : > "$W/steps.jsonl"
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

. "$ROOT/benchmarks/gpu/steps.sh"  # step NAME TIMEOUT_S CMD...

P312="PYTHONPATH=/tmp/site:$ROOT python3 -m trtforge"
P310=". $HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310 -m trtforge"

step export 900 "$P312 export --config zoo/configs/full/llama-kv.yaml -o $W/llama-kv.onnx"
# $PY310 has no tokenizers: the inputs are tokenized here (python3) into .jsonl lines of input_ids.
step tokenize 120 "PYTHONPATH=/tmp/site:$ROOT python3 benchmarks/gpu/stateful_h200.py tokenize $W/llama-kv.tokenizer $W/docs4096.jsonl 4096"
step build_stateful 1500 "$P310 build $W/llama-kv.onnx --precision fp16 --tiers 'seq=512;past=0,1024,4096' --tactic-sources=$TACTICS -o $W/llama-kv.fp16.engine --json > $W/build_stateful.json"
step build_full 1500 "$P310 build $W/llama-kv.onnx --precision fp16 --tiers 'seq=4224;past=0' --tactic-sources=$TACTICS -o $W/llama-kv-full.fp16.engine --json > $W/build_full.json"
step stateful 1200 "$P310 run $W/llama-kv.fp16.engine --inputs $W/docs4096.jsonl --chunk 512 --stateful --generate 32 --reference $W/llama-kv-full.fp16.engine --report $W/stateful.json"
step ort_fp32 1200 "$P310 run $W/llama-kv.onnx --inputs $W/docs4096.jsonl --chunk 512 --stateful --report $W/stateful_ort.json"
step table 60 "python3 benchmarks/gpu/stateful_h200.py table $W"
cat "$W/log.table" 2>/dev/null
echo done > "$W/DONE"
