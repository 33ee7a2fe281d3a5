#!/usr/bin/env bash
# The next H200 window (staging as in session_w4.sh; the real MiniLM as .whl2/gtpkg). Run from the project root:
#   bash benchmarks/gpu/session_w13.sh W DEADLINE_EPOCH   then  poll.sh W 540
# Issue 11 after the second session of 2026-12-02 (overlapped merges, bcb2c8d; bounded planning lead, 5b1c800):
# A: overlapped vs waiting merges on BERT-base too (w12 measured MiniLM only), three interleaved pairs per model, on
#    docs32v; tokenizing processes with the bound and 8 planning threads (not measured yet) beside them. run_stalls.
# B: the end-to-end done-when again with the new loop: torch eager / torch.compile and `run` from docs8 (the input the
#    earlier vs-torch tables used), through vs_torch.py's table.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm)
export_clean bert-base minilm
( build_fp16 bert-base ) &
( build_fp16 minilm ) &
wait

docs_varied 32 docs32v; docs8
for i in 1 2 3; do
  for m in minilm bert-base; do
    step "run-$m-overlap-$i" 300 "$(run_fp16 $m docs32v overlap_docs32v_$i)"
    step "run-$m-waiting-$i" 300 "$(run_fp16 $m docs32v waiting_docs32v_$i --no-overlap-merges)"
    step "run-$m-tp8-$i" 300 "$(run_fp16 $m docs32v tp8_docs32v_$i "--tokenize-processes 8 --plan-workers 8")"
  done
done
for m in minilm bert-base; do step "run-$m-docs8" 300 "$(run_fp16 $m docs8 run_docs8)"; done
step stalls 60 "python3 benchmarks/run_stalls.py $W/minilm/*docs*.json $W/bert-base/*docs*.json --json $W/stalls.json > $W/stalls.md"
rm -rf "$W/docs32v"

step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine minilm=$N.fp16.engine) --out $W/engine.json"
step torch 600 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --compile --compile-budget-s 150 --out $W/torch.json"
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch.json > $W/table.md"
touch "$W/DONE"
