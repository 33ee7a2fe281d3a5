#!/usr/bin/env bash
# H200 window w25 (issue 11): the new defaults measured as a user gets them. After w24, `--fuse-gemm auto` fuses fp16
# builds and `--qkv-projection auto` writes the QKV projection as a MatMul where TrtforgeGemm takes it, so
# `build --precision fp16 --plugin-library libtrtforge_plugins.so` alone should give w24's fastest engine (fgmq).
# - BERT-base and MiniLM with the defaults (def) against torch eager SDPA twice, torch.compile last; MiniLM with
#   --fuse-gemm off (fg) beside it; accuracy vs ORT fp32; run --reference for BERT, RoBERTa, ViT, MiniLM.
# - MiniLM's run loop: text and pre-tokenized ids, and one py-spy profile of an ids run (w24: from ids wall/GPU was
#   2.16, so the tokenizer is not the bound; where does the submitting thread's time go?).
# Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w25.sh $HOME/w 700 560     (carry .whl2 .native .trtinc .whl .whl4)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
B=$(M bert-base); N=$(M minilm)
BB="$T -m trtforge build"
FL="--plugin-library $PLUG"
plugin_build
export_clean minilm bert-base roberta-base vit-b16
docs8
docs_varied 32 docs32v

( step build-fp16_def-bert-base 600 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $FL -o $B.fp16_def.engine" ) &
( step build-fp16_def-minilm 600 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $FL -o $N.fp16_def.engine" ) &
( step build-fp16_fg-minilm 600 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $FL --fuse-gemm off -o $N.fp16_fg.engine" ) &
( step build-fp16_def-roberta-base 600 "$BB $(M roberta-base).clean.onnx --config $CFG/roberta-base.yaml --precision fp16 $TAC $FL -o $(M roberta-base).fp16_def.engine" ) &
( step build-fp16_def-vit-b16 600 "$BB $(M vit-b16).clean.onnx --config $CFG/vit-b16.yaml --precision fp16 $TAC $FL -o $(M vit-b16).fp16_def.engine" ) &
step pretokenize 120 "$T benchmarks/gpu/pretokenize.py $W/docs32v $N.tokenizer $W/docs32v.jsonl"
wait
step inspect-def 60 "$T -m trtforge inspect $B.fp16_def.engine > $W/bert-base/inspect_def.txt 2>&1"

step engine-def 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def.json"
step engine-fg-minilm 300 "$T benchmarks/vs_torch.py engine $(eng minilm=$N.fp16_fg.engine) --out $W/engine_fg_minilm.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
step engine-def-2 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def_2.json"
step torch-2 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --no-e2e --out $W/torch_2.json"
for m in bert-base minilm; do
  step "run-$m-docs8" 120 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $W/docs8 --no-precision-check --no-chunking-check --report $W/$m/run_docs8.json"
done
step table-def 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_def.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch_def.json > $W/table_def.md"
step table-def_2 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_2.json --engine $W/engine_def_2.json --out $W/vs_torch_def_2.json > $W/table_def_2.md"
step compare-bert-base 300 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng def=$B.fp16_def.engine) --json $W/bert-base/compare.json"
step compare-minilm 300 "$T benchmarks/gpu/implicit_int8.py compare $N.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng def=$N.fp16_def.engine fg=$N.fp16_fg.engine) --json $W/minilm/compare.json"

for i in 1 2; do
  step "run-minilm-text-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/minilm/run_text_$i.json"
  step "run-minilm-ids-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl --no-precision-check --no-chunking-check --report $W/minilm/run_ids_$i.json"
  step "run-bert-base-text-$i" 120 "$T -m trtforge run $B.fp16_def.engine --config $CFG/bert-base.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/bert-base/run_text_$i.json"
done
[ -n "$PYSPY" ] && step pyspy-ids 180 "$PYSPY record --idle --threads --rate 1000 --format raw -o $W/minilm/pyspy_ids.txt -- bash -c '$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl --no-precision-check --no-chunking-check --report $W/minilm/run_ids_spy.json'"

for m in bert-base roberta-base vit-b16 minilm; do
  E=$(M $m).fp16_def.engine; [ -f "$E" ] || continue
  step "run-ref-$m" 300 "$T -m trtforge run $E --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref_def.json"
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
step ncu-def 180 ". \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_def.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.fp16_def.engine 16x512" &&
  step kernels-def 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_def.csv --json $W/kernels_def.json"
step torch-compile 300 "$P312 benchmarks/vs_torch.py torch --models bert-base --no-e2e --compile --compile-budget-s 200 --out $W/torch_compile.json"
rm -rf "$W/docs32v" "$W/docs8"
touch "$W/DONE"
