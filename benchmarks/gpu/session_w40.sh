#!/usr/bin/env bash
# GPU window w40 (issue 11, seventh session): the changes after w39, on the engine.
# - BERT-base `--gemm-precision fp8` now chains FC1 -> FC2 by default (--fp8-chain-ffn auto), and the GEMM pass now takes
#   ONNX Gemm nodes too (BERT's pooler; every GPT-2 projection, Conv1D's addmm): fp16 and fp8 re-timed, gated.
# - GPT-2 fp16 with its Gemms as TrtforgeGemm (the new default) against --fuse-gemm off (TensorRT's own GEMMs, the old
#   build), both timed; `run --reference` on the default one (the fp16 gate against ORT fp32, real text); GPT-2 fp8 gated.
# - FP8 on models trtforge did not write: ViT-B/16 and RoBERTa-base, gated on the engine at build; ViT's `run --reference`.
# - torch eager SDPA for BERT-base and GPT-2 in the same window, twice (the second round torch first).
# Staging as in session_w4.sh (the last part carries .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w40.sh $HOME/w 600 570   (carry .whl2 .native .trtinc .whl)
# (first `bash benchmarks/gpu/aside.sh out`, and `back` after: the tree and a staging part must fit in 64 MiB together)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 600 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build &
export_clean bert-base gpt2 vit-b16 roberta-base
wait
B=$(M bert-base); G=$(M gpt2); V=$(M vit-b16); R=$(M roberta-base)
bb="$T -m trtforge build"; fl="$TAC --plugin-library $PLUG"
cfg() { echo "--config $CFG/$1.yaml --precision fp16"; }
( step build-fp16-bert-base 400 "$bb $B.clean.onnx $(cfg bert-base) $fl -o $B.fp16_def.engine" ) &
( step build-fp8-bert-base 400 "$bb $B.clean.onnx $(cfg bert-base) $fl --gemm-precision fp8 -o $B.fp8.engine" ) &
( step build-fp16-gpt2 400 "$bb $G.clean.onnx $(cfg gpt2) $fl -o $G.fp16_def.engine" ) &
( step build-fp16-nogemm-gpt2 400 "$bb $G.clean.onnx $(cfg gpt2) $fl --fuse-gemm off -o $G.nogemm.engine" ) &
( step build-fp8-gpt2 400 "$bb $G.clean.onnx $(cfg gpt2) $fl --gemm-precision fp8 -o $G.fp8.engine" ) &
( step build-fp8-vit-b16 400 "$bb $V.clean.onnx $(cfg vit-b16) $fl --gemm-precision fp8 -o $V.fp8.engine" ) &
( step build-fp8-roberta-base 400 "$bb $R.clean.onnx $(cfg roberta-base) $fl --gemm-precision fp8 -o $R.fp8.engine" ) &
wait
E="bert-base=$B.fp16_def.engine bert-base-fp8=$B.fp8.engine gpt2=$G.fp16_def.engine gpt2-nogemm=$G.nogemm.engine gpt2-fp8=$G.fp8.engine"
step engine-1 240 "$T benchmarks/vs_torch.py engine $(eng $E) --out $W/engine_1.json"
step torch-1 200 "$P312 benchmarks/vs_torch.py torch --models bert-base gpt2 --no-e2e --out $W/torch_1.json"
step table-1 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_1.json --engine $W/engine_1.json --out $W/vs_torch_1.json > $W/table_1.md"
[ -f "$G.fp16_def.engine" ] && step run-ref-fp16-gpt2 150 "$T -m trtforge run $G.fp16_def.engine --config $CFG/gpt2.yaml --reference $G.clean.onnx --report $W/gpt2/run_ref_fp16.json"
[ -f "$B.fp8.engine" ] && step run-ref-fp8-bert-base 150 "$T -m trtforge run $B.fp8.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_fp8.json"
step torch-2 200 "$P312 benchmarks/vs_torch.py torch --models bert-base gpt2 --no-e2e --out $W/torch_2.json"
step engine-2 240 "$T benchmarks/vs_torch.py engine $(eng $E) --out $W/engine_2.json"
step table-2 60 "python3 benchmarks/vs_torch.py table --torch $W/torch_2.json --engine $W/engine_2.json --out $W/vs_torch_2.json > $W/table_2.md"
[ -f "$G.fp8.engine" ] && step run-ref-fp8-gpt2 150 "$T -m trtforge run $G.fp8.engine --config $CFG/gpt2.yaml --reference $G.clean.onnx --report $W/gpt2/run_ref_fp8.json"
[ -f "$V.fp8.engine" ] && step run-ref-fp8-vit-b16 150 "$T -m trtforge run $V.fp8.engine --config $CFG/vit-b16.yaml --reference $V.clean.onnx --report $W/vit-b16/run_ref_fp8.json"
touch "$W/DONE"
