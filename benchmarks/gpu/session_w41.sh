#!/usr/bin/env bash
# GPU window w41 (issue 11, seventh session's last device time): BERT-base fp16 and fp8 (chained, the default) against
# torch eager twice, the done-when's three shapes, for the H200 should this window get one; then ViT-B/16 fp16's
# `run --reference` top-1 agreement beside fp8's (w40: fp8 0.75 on 16 images), same window. At most ~330 s of driver.
# Staging as in session_w4.sh (the last part carries .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w41.sh $HOME/w 330 330   (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
step gpu 10 "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader"
plugin_build &
export_clean bert-base vit-b16
wait
B=$(M bert-base); V=$(M vit-b16)
bb="$T -m trtforge build"; fl="$TAC --plugin-library $PLUG"
( step build-fp16-bert-base 200 "$bb $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $fl -o $B.fp16_def.engine" ) &
( step build-fp8-bert-base 200 "$bb $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $fl --gemm-precision fp8 -o $B.fp8.engine" ) &
( step build-fp16-vit-b16 200 "$bb $V.clean.onnx --config $CFG/vit-b16.yaml --precision fp16 $fl -o $V.fp16.engine" ) &
( step build-fp8-vit-b16 200 "$bb $V.clean.onnx --config $CFG/vit-b16.yaml --precision fp16 $fl --gemm-precision fp8 -o $V.fp8.engine" ) &
wait
E="bert-base=$B.fp16_def.engine bert-base-fp8=$B.fp8.engine"
step engine-1 100 "$T benchmarks/vs_torch.py engine $(eng $E) --out $W/engine_1.json"
step torch-1 100 "$P312 benchmarks/vs_torch.py torch --models bert-base --no-e2e --out $W/torch_1.json"
step table-1 30 "python3 benchmarks/vs_torch.py table --torch $W/torch_1.json --engine $W/engine_1.json --out $W/vs_torch_1.json > $W/table_1.md"
step torch-2 100 "$P312 benchmarks/vs_torch.py torch --models bert-base --no-e2e --out $W/torch_2.json"
step engine-2 100 "$T benchmarks/vs_torch.py engine $(eng $E) --out $W/engine_2.json"
step table-2 30 "python3 benchmarks/vs_torch.py table --torch $W/torch_2.json --engine $W/engine_2.json --out $W/vs_torch_2.json > $W/table_2.md"
for p in fp16 fp8; do
  [ -f "$V.$p.engine" ] && step "run-ref-$p-vit-b16" 60 "$T -m trtforge run $V.$p.engine --config $CFG/vit-b16.yaml --reference $V.clean.onnx --report $W/vit-b16/run_ref_$p.json"
done
touch "$W/DONE"
