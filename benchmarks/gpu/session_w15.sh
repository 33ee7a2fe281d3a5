#!/usr/bin/env bash
# A short H200 window at the end of the third session of 2026-12-02 (staging as in session_w4.sh, then
# benchmarks/gpu/start.sh; .gpu/old = ccbee27 as in session_w14.sh). Run from the project root:
#   [MODELS=minilm] bash benchmarks/gpu/session_w15.sh W DEADLINE_EPOCH   then  poll.sh W 540
# Issue 11 (`run` wall <= 1.1x GPU). w14 found the merge threads taking 3-4 ms per batch whatever the output's size
# (MiniLM's 6 MB as long as BERT-base's 11 MB) while py-spy --gil showed them almost never holding the GIL: they wait
# to get it back after each GIL-free copy, up to one switch interval each (0.5 ms) while the submitting thread runs
# Python. New here: --switch-interval-us (500 as before; 100, 50, 20 tried), feed shapes computed once per batch,
# pinned views cached, pooled rows copied once per batch. Against ccbee27, interleaved, two rounds, docs32v; then
# docs128v (docs32v four times) with the old code and two intervals.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm)
old_code_root  # T_OLD: the code in .gpu/old, run from a root of its own

MODELS=${MODELS:-minilm bert-base}
export_clean $MODELS
for m in $MODELS; do ( build_fp16 $m ) & done
docs_varied 32 docs32v
mkdir -p "$W/docs128v"; for j in 1 2 3 4; do for f in "$W"/docs32v/*; do cp "$f" "$W/docs128v/${j}_$(basename "$f")"; done; done
wait

for i in 1 2; do
  for m in $MODELS; do
    step "run-$m-old-docs32v-$i" 120 "$(RUN old $m docs32v old_docs32v_$i)"
    for us in 500 100 50 20; do
      step "run-$m-si$us-docs32v-$i" 120 "$(RUN new $m docs32v si${us}_docs32v_$i "--switch-interval-us $us")"
    done
  done
done
for m in $MODELS; do
  step "run-$m-old-docs128v" 180 "$(RUN old $m docs128v old_docs128v_1)"
  for us in 100 50; do step "run-$m-si$us-docs128v" 180 "$(RUN new $m docs128v si${us}_docs128v_1 "--switch-interval-us $us")"; done
  step "run-$m-si50-tp8-docs32v" 120 "$(RUN new $m docs32v si50_tp8_docs32v_1 "--switch-interval-us 50 --tokenize-processes 8")"
done
step stalls 60 "python3 benchmarks/run_stalls.py $(for m in $MODELS; do echo $W/$m/*docs*.json; done) --json $W/stalls.json > $W/stalls.md"
touch "$W/DONE"
