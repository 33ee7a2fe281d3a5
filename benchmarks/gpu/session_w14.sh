#!/usr/bin/env bash
# The H200 window of the third session of 2026-12-02 (staging as in session_w4.sh, then benchmarks/gpu/start.sh; the
# real MiniLM as .whl2/gtpkg; the code before this session as .gpu/old, made by
# `mkdir -p .gpu/old && git archive ccbee27 trtforge | tar -x -C .gpu/old`). Run from the project root:
#   bash benchmarks/gpu/session_w14.sh W DEADLINE_EPOCH   then  poll.sh W 540
# Issue 11 (`run` wall <= 1.1x GPU). New: each input's merged outputs are handed on as it finishes and their host
# memory serves later inputs (trtforge/outpool.py): on the dev VM fresh pages were most of the loop's host time.
# A: this session's loop against the code before it (ccbee27, run from its own root), interleaved, three pairs per
#    model on docs32v (192 documents of distinct lengths, 1.21M tokens), with --tokenize-processes 8 beside them;
#    one pair on docs128v (docs32v four times: 768 documents, ~4.8M tokens; start-up and drain weigh less).
# B: --save-outputs, old (all outputs kept, one np.savez after the loop) vs new (written as inputs finish).
# C: py-spy --gil on the new loop (docs128v, MiniLM): what still holds the GIL.
# D: the vs-torch table again (engine GPU ms, torch fp16 eager without compile, `run` over docs8).
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm)
old_code_root  # T_OLD: the code in .gpu/old, run from a root of its own

[ -f "$B.fp16.engine" ] && [ -f "$N.fp16.engine" ] || {  # a restarted driver keeps the engines it built
  export_clean bert-base minilm
  ( build_fp16 bert-base ) &
  ( build_fp16 minilm ) &
}
docs_varied 32 docs32v; docs8
mkdir -p "$W/docs128v"; for j in 1 2 3 4; do for f in "$W"/docs32v/*; do cp "$f" "$W/docs128v/${j}_$(basename "$f")"; done; done
wait

# RUN CODE MODEL DOCS NAME [FLAGS]: one `trtforge run` of the fp16 engine without the after-loop checks
for i in 1 2 3; do
  for m in minilm bert-base; do
    step "run-$m-old-docs32v-$i" 180 "$(RUN old $m docs32v old_docs32v_$i)"
    step "run-$m-new-docs32v-$i" 180 "$(RUN new $m docs32v new_docs32v_$i)"
    step "run-$m-new-tp8-docs32v-$i" 180 "$(RUN new $m docs32v new_tp8_docs32v_$i '--tokenize-processes 8')"
  done
done
for m in minilm bert-base; do
  step "run-$m-old-docs128v" 240 "$(RUN old $m docs128v old_docs128v_1)"
  step "run-$m-new-docs128v" 240 "$(RUN new $m docs128v new_docs128v_1)"
done
for m in minilm bert-base; do
  step "save-$m-old" 240 "$(RUN old $m docs32v old_save_docs32v "--save-outputs $W/$m/old.npz")"; rm -f "$W/$m/old.npz"
  step "save-$m-new" 240 "$(RUN new $m docs32v new_save_docs32v "--save-outputs $W/$m/new.npz")"; rm -f "$W/$m/new.npz"
done
step stalls 60 "python3 benchmarks/run_stalls.py $W/minilm/*docs*.json $W/bert-base/*docs*.json --json $W/stalls.json > $W/stalls.md"
[ -n "$PYSPY" ] && step pyspy-minilm 120 "$PYSPY record --gil --subprocesses --rate 1000 --format raw -o $W/minilm/pyspy_gil.txt -- bash -c '$(RUN new minilm docs128v spy_docs128v)'"
rm -rf "$W/docs32v" "$W/docs128v"

step vs-torch-engine 240 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16.engine minilm=$N.fp16.engine) --out $W/engine.json"
step run-bert-base-docs8 120 "$(RUN new bert-base docs8 run_docs8)"
step run-minilm-docs8 120 "$(RUN new minilm docs8 run_docs8)"
step torch 420 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --out $W/torch.json"
step table 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch.json > $W/table.md"
touch "$W/DONE"
