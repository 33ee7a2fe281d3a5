#!/usr/bin/env bash
# H200 window w26 (issue 11), at the commit after 857757e: (1) the fused attention's nodes sharing one [S] tensor
# (fusion/attention.py same_leading_dims; w24/w25 engines still had 12 cuFillLayer), measured at 16x128/16x512/64x512
# against torch eager twice; (2) the leaner run loop (batch_parts, Batcher.add_many): MiniLM from ids with 8 (default),
# 2 and 1 planning threads, from text, BERT-base from text; run --reference for BERT-base and MiniLM.
# Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w26.sh $HOME/w 660 560     (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
B=$(M bert-base); N=$(M minilm)
BB="$T -m trtforge build"
FL="--plugin-library $PLUG"
plugin_build
export_clean minilm bert-base
docs8
docs_varied 32 docs32v

( step build-fp16_def-bert-base 600 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $FL -o $B.fp16_def.engine" ) &
( step build-fp16_def-minilm 600 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $FL -o $N.fp16_def.engine" ) &
step pretokenize 120 "$T benchmarks/gpu/pretokenize.py $W/docs32v $N.tokenizer $W/docs32v.jsonl"
wait
step inspect-def 60 "$T -m trtforge inspect $B.fp16_def.engine > $W/bert-base/inspect_def.txt 2>&1"
cp "$B.fp16_def.engine.json" "$W/bert-base/" 2>/dev/null

step engine-def 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
step engine-def-2 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def_2.json"
step torch-2 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --no-e2e --out $W/torch_2.json"
for m in bert-base minilm; do
  step "run-$m-docs8" 120 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $W/docs8 --no-precision-check --no-chunking-check --report $W/$m/run_docs8.json"
done
step table-def 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_def.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch_def.json > $W/table_def.md"
step table-def_2 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_2.json --engine $W/engine_def_2.json --out $W/vs_torch_def_2.json > $W/table_def_2.md"

NR="--no-precision-check --no-chunking-check"
for i in 1 2; do
  step "run-minilm-ids-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl $NR --report $W/minilm/run_ids_$i.json"
  step "run-minilm-ids-pw2-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl $NR --plan-workers 2 --report $W/minilm/run_ids_pw2_$i.json"
  step "run-minilm-ids-pw1-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl $NR --plan-workers 1 --report $W/minilm/run_ids_pw1_$i.json"
  step "run-minilm-text-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v $NR --report $W/minilm/run_text_$i.json"
  step "run-bert-base-text-$i" 120 "$T -m trtforge run $B.fp16_def.engine --config $CFG/bert-base.yaml --inputs $W/docs32v $NR --report $W/bert-base/run_text_$i.json"
  step "run-bert-base-ids-$i" 120 "$T -m trtforge run $B.fp16_def.engine --config $CFG/bert-base.yaml --inputs $W/docs32v.jsonl $NR --report $W/bert-base/run_ids_$i.json"
done
for m in bert-base minilm; do
  step "run-ref-$m" 300 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref_def.json"
done
rm -rf "$W/docs32v" "$W/docs8"
touch "$W/DONE"
