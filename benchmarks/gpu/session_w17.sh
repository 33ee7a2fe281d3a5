#!/usr/bin/env bash
# H200 window of 2026-12-02 (fourth session): the copy-engine merge (copymerge.py, `run --copy-engine-merge`, the
# default when this ran at d9ddd05; off by default since w18) against the host merge (--no-copy-engine-merge) in one window, interleaved. Staging as in session_w4.sh,
# started with benchmarks/gpu/start.sh carrying .whl, .whl2 and .whl3. Run from the project root:
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w17.sh $HOME/w SECONDS 540   then  poll.sh $HOME/w 540
# A: both fp16 engines (the real MiniLM, transformers BertModel BERT-base random init) built here.
# B: proof on the GPU: --save-outputs with each merge over docs32v, compared key by key (benchmarks/compare_outputs.py:
#    the same engine, so the merged outputs must be equal).
# C: three interleaved rounds per model on docs32v: copy-engine, host, copy-engine with 8 tokenizing processes,
#    copy-engine with 1 merge worker; then docs128v copy-engine vs host; the stalls table.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
fp16_engines_and_docs
for m in minilm bert-base; do
  step "save-$m-copy" 120 "$(run_fp16 $m docs32v save_copy --copy-engine-merge --save-outputs $W/$m/copy.npz)"
  step "save-$m-host" 120 "$(run_fp16 $m docs32v save_host --no-copy-engine-merge --save-outputs $W/$m/host.npz)"
  step "equal-$m" 120 "python3 benchmarks/compare_outputs.py $W/$m/copy.npz $W/$m/host.npz --atol 0 --json $W/$m/equal.json"
  rm -f "$W/$m/copy.npz" "$W/$m/host.npz"
done
for i in 1 2 3; do
  for m in minilm bert-base; do
    step "run-$m-copy-$i" 120 "$(run_fp16 $m docs32v copy_docs32v_$i --copy-engine-merge)"
    step "run-$m-host-$i" 120 "$(run_fp16 $m docs32v host_docs32v_$i --no-copy-engine-merge)"
    step "run-$m-copytp8-$i" 120 "$(run_fp16 $m docs32v copytp8_docs32v_$i --copy-engine-merge --tokenize-processes 8)"
    step "run-$m-copym1-$i" 120 "$(run_fp16 $m docs32v copym1_docs32v_$i --copy-engine-merge --merge-workers 1)"
  done
done
for m in minilm bert-base; do
  step "run-$m-copy-docs128v" 180 "$(run_fp16 $m docs128v copy_docs128v --copy-engine-merge)"
  step "run-$m-host-docs128v" 180 "$(run_fp16 $m docs128v host_docs128v --no-copy-engine-merge)"
done
step stalls 60 "python3 benchmarks/run_stalls.py $W/*/*docs*.json --json $W/stalls.json > $W/stalls.md"
touch "$W/DONE"
