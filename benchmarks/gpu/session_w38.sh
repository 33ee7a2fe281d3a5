#!/usr/bin/env bash
# GPU window w38: why cuBLASLt refuses TrtforgeGemmFp8's matmuls (w37: the heuristic offers 8 candidates and every one
# returns CUBLAS_STATUS_NOT_SUPPORTED, 15). BERT-base's fp8 build with cuBLASLt's own log (errors and hints, plus the
# heuristic's info) on, at most 300 s. (Its first run, 2026-12-06, set the variables for `.` only, not for Python: exported now.) Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w38.sh $HOME/w 300 290   (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 300 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
B=$(M bert-base)
export_clean bert-base
step build-fp8-bert-base-ltlog 200 "export CUBLASLT_LOG_MASK=13 CUBLASLT_LOG_FILE=$W/cublaslt.%i.log && $T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 --gemm-precision fp8 --tactic-sources -CUBLAS,-CUBLAS_LT,-CUDNN --plugin-library $PLUG -o $B.fp8.engine"
for f in "$W"/cublaslt.*.log; do [ -f "$f" ] && { grep -v "^\s*$" "$f" | tail -c 400000 > "$f.txt"; rm -f "$f"; }; done
touch "$W/DONE"
