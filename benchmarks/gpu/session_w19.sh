#!/usr/bin/env bash
# The next H200 window (not run yet; written 2026-12-02, fourth session). Staging as in session_w4.sh, started with
# benchmarks/gpu/start.sh carrying .whl, .whl2 and .whl3 (no py-spy: the call's 64 MiB hold those three beside the tree):
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w19.sh $HOME/w 1000 540   then  poll.sh $HOME/w 540
# Issue 11 (`run` wall <= 1.1x GPU). w17/w18 showed the merge stage taking 2-3 ms per batch with no bytes left to copy, so
# the loop waits on Python per batch. The report's stages now carry cpu_seconds (runtime.host.stages.*.cpu_seconds):
# A: the zoo configs as they now run (64 windows a batch, host merge), three rounds per model on docs32v and one on
#    docs128v, and one round at batch 16: which stages wait (seconds >> cpu_seconds) and which work.
# B: the copy-engine merge once per model at batch 64 with the same split, to test the suspicion that page-locking
#    (prepare_outputs) stalls the submitting thread's CUDA calls.
# A2: 3 and 4 merge workers at batch 64 (w20 found the host merge's copying to be the bound there).
# C: the vs-torch table with `run` and the torch sliding-window loop both at 64 windows a batch over docs8.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm)
docs8
fp16_engines_and_docs
for i in 1 2 3; do
  for m in minilm bert-base; do
    step "run-$m-b64-$i" 120 "$(run_fp16 $m docs32v b64_docs32v_$i)"
  done
done
for i in 1 2; do  # w20: at batch 64 the host merge's copying is the bound (2 threads ~ the GPU's pace): more merge threads
  for m in minilm bert-base; do
    for k in 3 4; do step "run-$m-b64-m$k-$i" 120 "$(run_fp16 $m docs32v b64_m${k}_docs32v_$i --merge-workers $k)"; done
  done
done
for m in minilm bert-base; do
  step "run-$m-b16" 120 "$(run_fp16 $m docs32v b16_docs32v --batch-size 16)"
  step "run-$m-copy-b64" 120 "$(run_fp16 $m docs32v copy_b64_docs32v --copy-engine-merge)"
  step "run-$m-b64-docs128v" 180 "$(run_fp16 $m docs128v b64_docs128v)"
done
step stalls 60 "python3 benchmarks/run_stalls.py $W/*/*docs*.json --json $W/stalls.json > $W/stalls.md"
rm -rf "$W/docs32v" "$W/docs128v"
step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine minilm=$N.fp16.engine) --out $W/engine.json"
step run-bert-base-docs8 120 "$(run_fp16 bert-base docs8 run_docs8)"
step run-minilm-docs8 120 "$(run_fp16 minilm docs8 run_docs8)"
step torch 420 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch.json > $W/table.md"
touch "$W/DONE"
