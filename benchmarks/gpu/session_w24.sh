#!/usr/bin/env bash
# H200 window w24 (issue 11: BERT-base >= 1.5x torch eager at 64x512; MiniLM's run wall/GPU). What is new since w23:
# - TrtforgeGemmGelu times cuBLASLt's top-16 candidates per shape (trtforge/native/gemm_plugin.cpp); the same engine with
#   TRTFORGE_GEMM_AUTOTUNE=0 takes the heuristic's first, as w23 did: the A/B of the timing.
# - TrtforgeGemm (--fuse-gemm on): the MatMuls the other passes leave (output projection, FC2; QKV too with
#   --qkv-projection matmul) as cuBLASLt matmuls, timed the same way: fgm / fgmq against TensorRT's own GEMMs (fg).
# - The flash nodes share one [S] tensor (one cuFillLayer instead of twelve).
# - MiniLM's run from text and from pre-tokenized ids (is the tokenizer the host bound?); ViT's run --reference with
#   the carried cp310 Pillow (.whl5).
# Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w24.sh $HOME/w 1000 540     (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
B=$(M bert-base); N=$(M minilm); V=$(M vit-b16)
BB="$T -m trtforge build"
FL="--plugin-library $PLUG"
NOAUTO="export TRTFORGE_GEMM_AUTOTUNE=0;"
plugin_build
( step gemm-check 200 "$T benchmarks/gpu/flash_plugin_check.py $PLUG --skip-attention --out $W/gemm_check.json" ) &
export_clean minilm bert-base vit-b16
wait
docs_varied 32 docs32v

# Builds in lanes (GPU-light). fg = flash + GemmGelu (the w23 engine, now with timed GEMMs and one [S] tensor).
( step build-fp16_fg-bert-base 600 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $FL -o $B.fp16_fg.engine" ) &
( step build-fp16_fgm-bert-base 600 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $FL --fuse-gemm on -o $B.fp16_fgm.engine" ) &
( step build-fp16_fgmq-bert-base 600 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $FL --fuse-gemm on --qkv-projection matmul -o $B.fp16_fgmq.engine" ) &
( step build-fp16_fg-minilm 600 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $FL -o $N.fp16_fg.engine"
  step build-fp16_fg-vit-b16 600 "$BB $V.clean.onnx --config $CFG/vit-b16.yaml --precision fp16 $TAC $FL -o $V.fp16_fg.engine" ) &
step pretokenize 120 "$T benchmarks/gpu/pretokenize.py $W/docs32v $N.tokenizer $W/docs32v.jsonl"
wait
for v in fg fgm fgmq; do step "inspect-$v" 60 "$T -m trtforge inspect $B.fp16_$v.engine > $W/bert-base/inspect_$v.txt 2>&1"; done

# Timings, one job at a time on the GPU: engines, torch eager, the engines again (run-to-run), torch again.
ENG="$(eng fg=$B.fp16_fg.engine fgm=$B.fp16_fgm.engine fgmq=$B.fp16_fgmq.engine)"
for v in fg fgm fgmq; do
  [ -f "$B.fp16_$v.engine" ] && step "engine-$v" 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_$v.engine) --out $W/engine_$v.json"
done
step engine-fg-noauto 300 "$NOAUTO $T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_fg.engine) --out $W/engine_fg_noauto.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base --repeat 8 --batch 64 --out $W/torch.json"
for v in fgmq fgm fg; do
  [ -f "$B.fp16_$v.engine" ] && step "engine-$v-2" 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_$v.engine) --out $W/engine_${v}_2.json"
done
step torch-2 300 "$P312 benchmarks/vs_torch.py torch --models bert-base --no-e2e --out $W/torch_2.json"
for v in fg fgm fgmq; do
  for r in "" _2; do
    [ -f "$W/engine_$v$r.json" ] && step "table-$v$r" 60 "python3 benchmarks/vs_torch.py table --torch $W/torch$r.json --engine $W/engine_$v$r.json --out $W/vs_torch_$v$r.json > $W/table_$v$r.md"
  done
done
step compare-bert-base 300 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $ENG --json $W/bert-base/compare.json"

# run: MiniLM from text and from ids (docs32v), BERT-base from text; wall/GPU per batch.
for i in 1 2; do
  step "run-minilm-text-$i" 120 "$T -m trtforge run $N.fp16_fg.engine --config $CFG/minilm.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/minilm/run_text_$i.json"
  step "run-minilm-ids-$i" 120 "$T -m trtforge run $N.fp16_fg.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl --no-precision-check --no-chunking-check --report $W/minilm/run_ids_$i.json"
  step "run-bert-base-text-$i" 120 "$T -m trtforge run $B.fp16_fgm.engine --config $CFG/bert-base.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/bert-base/run_text_$i.json"
done

# Against ORT fp32 through run --reference (the gates), then the kernel lists at 16x512.
for e in "bert-base $B.fp16_fgm.engine" "bert-base $B.fp16_fgmq.engine" "vit-b16 $V.fp16_fg.engine" "minilm $N.fp16_fg.engine"; do
  set -- $e; m=$1; f=$2; v=$(basename "$f" .engine); v=${v#*.}
  [ -f "$f" ] && step "run-ref-$m-$v" 300 "$T -m trtforge run $f --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref_$v.json"
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in fg fgm fgmq; do
  [ -f "$B.fp16_$v.engine" ] || continue
  step "ncu-$v" 180 ". \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.fp16_$v.engine 16x512" &&
    step "kernels-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_$v.csv --json $W/kernels_$v.json"
done
rm -rf "$W/docs32v"
touch "$W/DONE"
