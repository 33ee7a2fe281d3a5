#!/usr/bin/env bash
# H200 session 5 of 2026-12-01 (staging as in session_w4.sh; the real MiniLM carried as .whl2/gtpkg). Run from the
# project root:   bash benchmarks/gpu/session_w6.sh W DEADLINE_EPOCH      then   bash benchmarks/gpu/poll.sh W 540
# A (builds, four lanes): BERT-base fp16 with the defaults (conv QKV + GELU plugin) and with --fuse-skip-layernorm on;
#    BERT-base INT8 best with and without it (calibrated here); MiniLM fp16, one profile (seq 256, the chunks;
#    `run` end to end only, as in w5).
# B (one job at a time on the GPU): compare tables (accuracy vs ORT fp32 + GPU ms at 16x128/16x512/64x512), Nsight
#    Compute kernel lists of the skip-LN engines, `run` end to end (the submitting thread's CUDA calls now keep the
#    GIL) twice per model with its host-stage breakdown, from text and pre-tokenized, torch eager + its sliding-window loop in the same run, the
#    GIL hand-off benchmark on this host, and the vs-torch table.
# Every step appends {step, rc, seconds, cmd, tail} to W/steps.jsonl; the driver goes on after a failure.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
CAL="--max-samples 64 --max-eval-samples 64 --smooth 0.8 --no-engine-check"
B=$(M bert-base); N=$(M minilm)
BB="$T -m trtforge build"
BC="--config $CFG/bert-base.yaml $TAC"

export_clean bert-base minilm

step gil-handoff 120 "python3 benchmarks/gil_handoff.py --out $W/gil_handoff.json" &
( step build-fp16-bert-base 900 "$BB $B.clean.onnx $BC --precision fp16 -o $B.fp16.engine" ) &
( step build-fp16_skipln-bert-base 900 "$BB $B.clean.onnx $BC --precision fp16 --fuse-skip-layernorm on -o $B.fp16_skipln.engine" ) &
( step calibrate-bert-base 600 "$T -m trtforge calibrate $B.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval $CAL"
  ( step build-best-bert-base 900 "$BB $B.int8.onnx $BC --precision best -o $B.best.engine" ) &
  ( step build-best_skipln-bert-base 900 "$BB $B.int8.onnx $BC --precision best --fuse-skip-layernorm on -o $B.best_skipln.engine" ) &
  wait ) &
( step build-fp16-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" ) &
wait

step compare-bert-base 600 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16=$B.fp16.engine fp16_skipln=$B.fp16_skipln.engine int8_best=$B.best.engine int8_best_skipln=$B.best_skipln.engine) --json $W/bert-base/compare.json"
docs8
for i in 1 2; do
  step "run-e2e-minilm-$i" 120 "$T -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/docs8 --no-precision-check --report $W/minilm/run_e2e_$i.json"
  step "run-e2e-bert-base-$i" 300 "$T -m trtforge run $B.fp16.engine --config $CFG/bert-base.yaml --inputs $W/docs8 --no-precision-check --report $W/bert-base/run_e2e_$i.json"
done
step tokenize-throughput 120 "$P312 benchmarks/tokenize_throughput.py $N.tokenizer $W/docs8 --out $W/tokenize.json --threads 1 4 8 12"
# The same documents pre-tokenized: the loop without the tokenizer's cost (plan was 1.1-1.5 CPU-s of w5's 0.33-0.46 s loop)
for m in minilm bert-base; do
  step "pretokenize-$m" 120 "$T benchmarks/gpu/pretokenize.py $W/docs8 $(M $m).tokenizer $W/$m/docs8.jsonl"
done
for i in 1 2; do
  step "run-e2e-tok-minilm-$i" 120 "$T -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/minilm/docs8.jsonl --no-precision-check --report $W/minilm/run_e2e_tok_$i.json"
done
step "run-e2e-tok-bert-base-1" 300 "$T -m trtforge run $B.fp16.engine --config $CFG/bert-base.yaml --inputs $W/bert-base/docs8.jsonl --no-precision-check --report $W/bert-base/run_e2e_tok_1.json"
for v in fp16 fp16_skipln best best_skipln; do
  [ -f "$B.$v.engine" ] || continue
  step "ncu-$v" 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $B.$v.engine 16x512" &&
  step "kernels-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_$v.csv --json $W/kernels_$v.json"
done
[ -f "$B.fp16_skipln.engine" ] && step run-ref-fp16_skipln 420 "$T -m trtforge run $B.fp16_skipln.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref_fp16_skipln.json"
step torch-eager 420 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --out $W/torch.json"
step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine) --out $W/engine.json"
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_e2e_1.json --run minilm=$W/minilm/run_e2e_1.json --out $W/vs_torch.json > $W/table.md"
for e in "$B.fp16_skipln.engine"; do
  [ -f "$e" ] && step "inspect-$(basename "$e" .engine)" 60 "$T -m trtforge inspect $e > $e.inspect.txt 2>&1"
done
touch "$W/DONE"
