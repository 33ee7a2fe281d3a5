#!/usr/bin/env bash
# Second H200 window of 2026-12-03 (issue 11): TrtforgeGemmGelu (trtforge/native/gemm_gelu_plugin.cpp: FC1 + bias +
# GELU as one cuBLASLt matmul with the GELU_BIAS epilogue) beside w22's flash attention, on BERT-base fp16, against
# torch eager SDPA in the same window; MiniLM's `run` wall/GPU with the plugin engine and without. Staging as in
# session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w23.sh $HOME/w 520 540     (carry .whl2 .native .trtinc)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
B=$(M bert-base); N=$(M minilm)
BB="$T -m trtforge build"
FL="--plugin-library $PLUG"
plugin_build
( step gemm-check 200 "$T benchmarks/gpu/flash_plugin_check.py $PLUG --skip-attention --out $W/gemm_check.json" ) &
export_clean minilm bert-base
wait
docs_varied 32 docs32v
( step build-fp16_fg-bert-base 600 "$BB $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $FL -o $B.fp16_fg.engine" ) &
( step build-fp16_fg-minilm 600 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $FL -o $N.fp16_fg.engine"
  step build-fp16_v2-minilm 600 "$BB $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16_v2.engine" ) &
wait
step engine-fg 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_fg.engine minilm=$N.fp16_fg.engine) --out $W/engine_fg.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base --repeat 8 --batch 64 --out $W/torch.json"
step table-fg 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_fg.json --out $W/vs_torch_fg.json > $W/table_fg.md"
step compare-bert-base 300 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16_fg=$B.fp16_fg.engine) --json $W/bert-base/compare.json"
for i in 1 2; do
  for v in fg v2; do
    step "run-minilm-$v-$i" 120 "$T -m trtforge run $N.fp16_$v.engine --config $CFG/minilm.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/minilm/run_${v}_docs32v_$i.json"
  done
  step "run-bert-base-fg-$i" 120 "$T -m trtforge run $B.fp16_fg.engine --config $CFG/bert-base.yaml --inputs $W/docs32v --no-precision-check --no-chunking-check --report $W/bert-base/run_fg_docs32v_$i.json"
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
step ncu-fp16_fg 180 ". \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$ROOT:\$PYTHONPATH $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_fp16_fg.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.fp16_fg.engine 16x512" &&
  step kernels-fp16_fg 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_fp16_fg.csv --json $W/kernels_fp16_fg.json"
step run-ref-bert-base 300 "$T -m trtforge run $B.fp16_fg.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_fg.json"
rm -rf "$W/docs32v"
touch "$W/DONE"
