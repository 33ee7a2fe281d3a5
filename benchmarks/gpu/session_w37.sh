#!/usr/bin/env bash
# GPU window w37 (issue 11: BERT-base 64x512 >= 1.5x torch eager with the accuracy gate passing), at most 600 s of
# driver: FP8 GEMMs (`build --gemm-precision fp8`, TrtforgeGemmFp8) against the default fp16 engine. Builds BERT-base
# fp16 (default) and fp8, and MiniLM (real weights) fp8, in parallel (each fp8 build runs its own gate: engine vs ORT fp32);
# then engine / torch eager rounds twice (the second with torch first), and `run --reference` on both fp8 engines (their
# chunked precision error against ORT fp32, recorded; the configs' fp16 gates may fail them).
# Staging as in session_w4.sh (the last part carries .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w37.sh $HOME/w 600 570   (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 600 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
B=$(M bert-base); N=$(M minilm)
export_clean minilm bert-base
bb="$T -m trtforge build"; fl="--plugin-library $PLUG"
( step build-fp16_def-bert-base 400 "$bb $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $fl -o $B.fp16_def.engine" ) &
( step build-fp8-bert-base 400 "$bb $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 --gemm-precision fp8 $TAC $fl -o $B.fp8.engine" ) &
( step build-fp8-minilm 400 "$bb $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --gemm-precision fp8 --tiers seq=256 $TAC $fl -o $N.fp8.engine" ) &
wait
step engine-1 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine bert-base-fp8=$B.fp8.engine minilm-fp8=$N.fp8.engine) --out $W/engine_1.json"
step torch-1 200 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --no-e2e --out $W/torch_1.json"
step table-1 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_1.json --engine $W/engine_1.json --out $W/vs_torch_1.json > $W/table_1.md"
step torch-2 200 "$P312 benchmarks/vs_torch.py torch --models bert-base --repeat 8 --batch 64 --no-e2e --out $W/torch_2.json"
step engine-2 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine bert-base-fp8=$B.fp8.engine) --out $W/engine_2.json"
step table-2 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_2.json --engine $W/engine_2.json --out $W/vs_torch_2.json > $W/table_2.md"
for m in bert-base minilm; do
  [ -f "$(M $m).fp8.engine" ] && step "run-ref-fp8-$m" 150 "$T -m trtforge run $(M $m).fp8.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref_fp8.json"
done
touch "$W/DONE"
