#!/usr/bin/env bash
# H200 session 6 of 2026-12-01 (staging as in session_w4.sh; the real MiniLM carried as .whl2/gtpkg, py-spy's wheel
# as .whl4). Run from the project root:   bash benchmarks/gpu/session_w7.sh W DEADLINE_EPOCH   then  poll.sh W 540
# A: BERT-base fp16 with the defaults (skip-LayerNorm now fused by `auto`) and MiniLM fp16 (one profile, seq 256).
# B (one job at a time on the GPU): the default BERT engine's accuracy and GPU ms; `run` end to end over a sweep of
#    --plan-workers and --merge-workers (0: the collecting thread merges each batch holding the GIL), then the same
#    runs under py-spy --gil (which thread holds the GIL, and where); torch eager + torch.compile and the table.
# Every step appends {step, rc, seconds, cmd, tail} to W/steps.jsonl; the driver goes on after a failure.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm)
nproc > "$W/nproc.txt"

export_clean bert-base minilm
( step build-fp16-bert-base 900 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml $TAC --precision fp16 -o $B.fp16.engine" ) &
( step build-fp16-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" ) &
wait
step compare-bert-base 600 "$T benchmarks/gpu/implicit_int8.py compare $B.clean.onnx --eval-data calib_data/minilm_eval --max-samples 64 --engine fp16_default=$B.fp16.engine --json $W/bert-base/compare.json"
docs8
RUN() { echo "$T -m trtforge run $(M $1).fp16.engine --config $CFG/$1.yaml --inputs $W/docs8 --no-precision-check $2 --report $W/$1/$3.json"; }
for mw in 4 0 2 1; do for pw in 8 4 2; do
  step "run-minilm-p${pw}-m${mw}" 120 "$(RUN minilm "--plan-workers $pw --merge-workers $mw" "run_p${pw}_m${mw}")"
done; done
step "run-minilm-p4-m0-s6" 120 "$(RUN minilm "--plan-workers 4 --merge-workers 0 --slots 6" run_p4_m0_s6)"
SPY() { echo ". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH $PYSPY record --gil --threads --rate 1000 --format raw -o $W/pyspy_$1_$3.txt -- \$PY310 -m trtforge run $(M $1).fp16.engine --config $CFG/$1.yaml --inputs $W/docs8 --no-precision-check $2 --report $W/$1/spy_$3.json"; }
step spy-minilm-default 180 "$(SPY minilm "" default)"
step spy-minilm-p4-m0 180 "$(SPY minilm "--plan-workers 4 --merge-workers 0" p4_m0)"
for mw in 4 0; do for pw in 8 4; do
  step "run-bert-base-p${pw}-m${mw}" 300 "$(RUN bert-base "--plan-workers $pw --merge-workers $mw" "run_p${pw}_m${mw}")"
done; done
step spy-bert-base-default 300 "$(SPY bert-base "" default)"
step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine --engine bert-base=$B.fp16.engine --out $W/engine.json"
step torch 600 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --compile --compile-budget-s 150 --out $W/torch.json"
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_p8_m4.json --run minilm=$W/minilm/run_p8_m4.json --out $W/vs_torch.json > $W/table.md"
touch "$W/DONE"
