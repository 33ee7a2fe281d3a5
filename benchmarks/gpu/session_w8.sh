#!/usr/bin/env bash
# Ran at 3fed105 (RESULTS, seventh session); `run --direct-merge` was removed afterwards (slower), so rerunning this needs that commit.
# The next H200 window (staging as in session_w4.sh; the real MiniLM as .whl2/gtpkg, py-spy's wheel as .whl4 unzipped
# into /tmp/pyspy). Run from the project root:   bash benchmarks/gpu/session_w8.sh W DEADLINE_EPOCH   then  poll.sh W 540
# A: BERT-base fp16 and INT8 best with the defaults (skip-LayerNorm fused by `auto` in both since the sixth session),
#    MiniLM fp16 (one profile, seq 256).
# B (one job at a time on the GPU): accuracy + GPU ms of both BERT engines; `run` end to end with and without
#    --direct-merge (the GPU's copy engine merges; the host copies nothing), twice each, from text and pre-tokenized;
#    the same under py-spy sampling without stopping the process (--nonblocking: w7's blocking sampler slowed the
#    loop 8x and timed out); torch eager + torch.compile and the vs-torch table.
# C (issue 10, the INT8 ceiling): which kernels TensorRT 8.6 has and picks for an INT8 GEMM on sm_90
#    (gemm_ceiling.py: library scan, single GEMMs int8 vs fp16 with the tactics the builder timed), and the
#    ResNet-50 kernel lists of trtforge's INT8, TensorRT's implicit INT8 and fp16 at 16x224 (ncu).
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm); R=$(M resnet50); G=$W/gemm
CAL="--max-samples 64 --max-eval-samples 64 --smooth 0.8 --no-engine-check"

export_clean bert-base minilm resnet50
( step build-fp16-bert-base 900 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml $TAC --precision fp16 -o $B.fp16.engine" ) &
( step calibrate-bert-base 600 "$T -m trtforge calibrate $B.clean.onnx --data calib_data/minilm --eval-data calib_data/minilm_eval $CAL" &&
  step build-best-bert-base 900 "$T -m trtforge build $B.int8.onnx --config $CFG/bert-base.yaml $TAC --precision best -o $B.best.engine" ) &
( step build-fp16-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" ) &
( step calibrate-resnet50 900 "$T -m trtforge calibrate $R.clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99" ) &
( step build-fp16-resnet50 900 "$T -m trtforge build $R.clean.onnx --config $CFG/resnet50.yaml --precision fp16 $TAC -o $R.fp16.engine"
  step build-implicit-resnet50 900 "$T benchmarks/gpu/implicit_int8.py build $R.clean.onnx $W/resnet50/implicit.engine --data calib_data/images --max-samples 64" ) &
( step gemm-models 60 "python3 benchmarks/gpu/gemm_ceiling.py models $G" &&
  for f in "$G"/*.onnx; do step "build-$(basename "$f" .onnx)" 300 "$T benchmarks/gpu/gemm_ceiling.py build $f"; done ) &
wait
step compare-bert-base 600 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 $(eng fp16=$B.fp16.engine int8_best=$B.best.engine) --json $W/bert-base/compare.json"
step gemm-time 180 "$T benchmarks/gpu/gemm_ceiling.py time $G --json $W/gemm_ceiling.json"
step gemm-scan 120 "$T benchmarks/gpu/gemm_ceiling.py scan --json $W/gemm_scan.json"
step compare-resnet50 300 "$T benchmarks/gpu/implicit_int8.py compare $R.clean.onnx --eval-data calib_data/images_eval $(eng trtforge_int8_best=$R.int8.best.engine fp16=$R.fp16.engine trt_implicit_int8=$W/resnet50/implicit.engine) --json $W/resnet50/compare.json"
for v in int8.best fp16 implicit; do
  e=$R.$v.engine; [ "$v" = implicit ] && e=$W/resnet50/implicit.engine
  step "ncu-resnet50-$v" 180 ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file $W/ncu_resnet50_$v.csv \$PY310 benchmarks/gpu/int8_probe.py once $e 16x224" &&
  step "kernels-resnet50-$v" 60 "python3 benchmarks/gpu/int8_probe.py kernels $W/ncu_resnet50_$v.csv --json $W/kernels_resnet50_$v.json"
done
step inspect-resnet50-best 60 "$T -m trtforge inspect $R.int8.best.engine > $W/resnet50/int8.best.inspect.txt 2>&1"
docs8
for m in minilm bert-base; do step "pretokenize-$m" 120 "$T benchmarks/gpu/pretokenize.py $W/docs8 $(M $m).tokenizer $W/$m/docs8.jsonl"; done
RUN() { echo "$T -m trtforge run $(M $1).fp16.engine --config $CFG/$1.yaml --inputs $2 --no-precision-check $3 --report $W/$1/$4.json"; }
for i in 1 2; do for m in minilm bert-base; do
  step "run-$m-host-$i" 300 "$(RUN $m $W/docs8 "" "run_host_$i")"
  step "run-$m-host-m2-$i" 300 "$(RUN $m $W/docs8 "--merge-workers 2" "run_host_m2_$i")"  # w7: MiniLM 10-17% faster so
  step "run-$m-direct-$i" 300 "$(RUN $m $W/docs8 --direct-merge "run_direct_$i")"
  step "run-tok-$m-host-$i" 300 "$(RUN $m $W/$m/docs8.jsonl "" "run_tok_host_$i")"
  step "run-tok-$m-direct-$i" 300 "$(RUN $m $W/$m/docs8.jsonl --direct-merge "run_tok_direct_$i")"
done; done
SPY() { echo ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH $PYSPY record --nonblocking --threads --idle --rate 200 --format raw -o $W/pyspy_$1_$3.txt -- \$PY310 -m trtforge run $(M $1).fp16.engine --config $CFG/$1.yaml --inputs $W/docs8 --no-precision-check $2 --report $W/$1/spy_$3.json"; }
step spy-minilm-host 120 "$(SPY minilm "" host)"
step spy-minilm-direct 120 "$(SPY minilm --direct-merge direct)"
step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine) --out $W/engine.json"
step torch 600 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --compile --compile-budget-s 150 --out $W/torch.json"
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_direct_1.json --run minilm=$W/minilm/run_direct_1.json --out $W/vs_torch.json > $W/table.md"
touch "$W/DONE"
