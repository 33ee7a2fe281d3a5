#!/usr/bin/env bash
# GPU window w39 (issue 11 on an H200, for the next session): BERT-base fp16 (default), fp8 (--gemm-precision fp8, which
# passed its gate at 1.63-1.65x torch eager on an H100 in w37c) and fp8 with FC1 -> FC2 chained in e4m3
# (--fp8-chain-ffn: written 2026-12-06, never run on a GPU), built in parallel, each fp8 build gated on the engine;
# MiniLM fp8 chained; then engine / torch eager twice (the second with torch first), and `run --reference` on the chained
# engines (their chunked error against ORT fp32, recorded). At most 600 s of driver.
# Staging as in session_w4.sh (the last part carries .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w39.sh $HOME/w 600 570   (carry .whl2 .native .trtinc .whl)
# (first `bash benchmarks/gpu/aside.sh out`, and `back` after: the tree and a staging part must fit in 64 MiB together)
# (As run, 29acf5d, the chaining flag was a bare `--fp8-chain-ffn`; since e099969 it takes auto|on|off, so it reads `on`.)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 600 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
B=$(M bert-base); N=$(M minilm)
export_clean minilm bert-base
bb="$T -m trtforge build"; fl="--plugin-library $PLUG"; bc="--config $CFG/bert-base.yaml --precision fp16 $TAC $fl"
( step build-fp16_def-bert-base 400 "$bb $B.clean.onnx $bc -o $B.fp16_def.engine" ) &
( step build-fp8-bert-base 400 "$bb $B.clean.onnx $bc --gemm-precision fp8 -o $B.fp8.engine" ) &
( step build-fp8chain-bert-base 400 "$bb $B.clean.onnx $bc --gemm-precision fp8 --fp8-chain-ffn on -o $B.fp8chain.engine" ) &
( step build-fp8chain-minilm 400 "$bb $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --gemm-precision fp8 --fp8-chain-ffn on --tiers seq=256 $TAC $fl -o $N.fp8chain.engine" ) &
wait
# The chained engines have never run on a GPU: they are timed in steps of their own, so that a crash there loses no other figure.
E="bert-base=$B.fp16_def.engine bert-base-fp8=$B.fp8.engine"
C="bert-base-fp8chain=$B.fp8chain.engine minilm-fp8chain=$N.fp8chain.engine"
step engine-1 240 "$T benchmarks/vs_torch.py engine $(eng $E) --out $W/engine_1.json"
step torch-1 200 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --no-e2e --out $W/torch_1.json"
step table-1 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_1.json --engine $W/engine_1.json --out $W/vs_torch_1.json > $W/table_1.md"
step engine-chain-1 180 "$T benchmarks/vs_torch.py engine $(eng $C) --out $W/engine_chain_1.json" &&
  step table-chain-1 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_1.json --engine $W/engine_chain_1.json --out $W/vs_torch_chain_1.json > $W/table_chain_1.md" &&
  E="$E $C"
step torch-2 200 "$P312 benchmarks/vs_torch.py torch --models bert-base --repeat 8 --batch 64 --no-e2e --out $W/torch_2.json"
step engine-2 240 "$T benchmarks/vs_torch.py engine $(eng $E) --out $W/engine_2.json"
step table-2 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_2.json --engine $W/engine_2.json --out $W/vs_torch_2.json > $W/table_2.md"
[ -f "$B.fp8.engine" ] && step run-ref-fp8-bert-base 150 "$T -m trtforge run $B.fp8.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_fp8.json"
for m in bert-base minilm; do
  [ -f "$(M $m).fp8chain.engine" ] && step "run-ref-fp8chain-$m" 150 "$T -m trtforge run $(M $m).fp8chain.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref_fp8chain.json"
done
touch "$W/DONE"
