#!/usr/bin/env bash
# H200 window of 2026-12-02's fifth session (issue 11, `run` wall <= 1.1x GPU). Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w21.sh $HOME/w 1000 540   (then poll.sh $HOME/w 540)
# w20 found the host merge's copying the bound at batch 64 (~6 ms of one thread per 22 MB MiniLM batch against 4.6 ms
# of GPU), and the copy-engine merge's loss in page-locking inside the loop (its first six batches ~190 ms; after its
# 40th batch 1.09-1.12x the GPU, the host merge 1.19-1.24x). New since: --merge-split K (a batch's rows on K merge
# threads at once) and the copy-engine pool carved from one block page-locked before the clock (--pinned-reserve-mb 0:
# the old way, the control). All at batch 64 (the zoo configs), interleaved rounds on docs32v, then docs128v:
#   host   = defaults (2 merge threads, one per batch, 3 slots)      m4s5    = --merge-workers 4 --slots 5
#   split2 = --merge-split 2 --merge-workers 4                       split2s5 = split2 + --slots 5
#   split4 = --merge-split 4 --merge-workers 4                       copy / copys5 / copy0 = --copy-engine-merge (+ --slots 5 /
#                                                                                           --pinned-reserve-mb 0)
# Then the copy-engine merge's outputs against the host merge's (bit patterns) from the reserved block, and the vs-torch
# table with `run` and the torch sliding-window loop both at 64 windows a batch.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm)
docs8
fp16_engines_and_docs
declare -A F=([host]="" [split2]="--merge-split 2 --merge-workers 4" [split4]="--merge-split 4 --merge-workers 4"
              [m4s5]="--merge-workers 4 --slots 5" [split2s5]="--merge-split 2 --merge-workers 4 --slots 5"
              [copy]="--copy-engine-merge" [copys5]="--copy-engine-merge --slots 5" [copy0]="--copy-engine-merge --pinned-reserve-mb 0")
for i in 1 2 3; do
  for m in minilm bert-base; do
    for c in host split2 copy m4s5 split4 copy0 split2s5 copys5; do
      step "run-$m-$c-$i" 90 "$(run_fp16 $m docs32v ${c}_docs32v_$i ${F[$c]})"
    done
  done
done
for m in minilm bert-base; do
  for c in host split2s5 copy copys5; do step "run-$m-$c-docs128v" 120 "$(run_fp16 $m docs128v ${c}_docs128v ${F[$c]})"; done
done
step save-copy 120 "$(run_fp16 minilm docs32v save_copy --copy-engine-merge --save-outputs $W/copy.npz)"
step save-host 120 "$(run_fp16 minilm docs32v save_host --save-outputs $W/host.npz)"
step equal 300 "python3 benchmarks/compare_outputs.py $W/copy.npz $W/host.npz --atol 0 --json $W/minilm/equal.json"
rm -f "$W/copy.npz" "$W/host.npz"
rm -rf "$W/docs32v" "$W/docs128v"
step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine minilm=$N.fp16.engine) --out $W/engine.json"
step run-bert-base-docs8 120 "$(run_fp16 bert-base docs8 run_docs8)"
step run-minilm-docs8 120 "$(run_fp16 minilm docs8 run_docs8)"
step torch 420 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch.json > $W/table.md"
touch "$W/DONE"
