#!/usr/bin/env bash
# The next H200 window (staging as in session_w4.sh, then benchmarks/gpu/start.sh, carrying .whl2 and .whl4). Run from
# the project root:
#   bash benchmarks/gpu/session_w16.sh W DEADLINE_EPOCH   then  poll.sh W 540
# Issue 11 (`run` wall <= 1.1x GPU): w14/w15 left open what `run`'s merge threads do for ~3 ms per batch (5.5 MB of
# MiniLM rows, 11 MB of BERT-base's; 0.41 ms for the same np.take on the dev VM), since neither the GIL switch interval
# nor the output pool moved it.
# A: benchmarks/merge_probe.py on the box: the take alone from ordinary and from pinned memory just written by a D2H
#    copy, alone and beside 8 tokenizing threads, on 1 and 2 merge threads, MiniLM's and BERT-base's widths; and the
#    copy engine writing the kept rows straight into a registered merged output (no host copy).
# B: `run` over docs32v from text and pre-tokenized (no tokenizing load), and py-spy --native --idle --threads over
#    the text run: where each merge thread's time goes, GIL waits (take_gil) included.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
N=$(M minilm)
export_clean minilm
( build_fp16 minilm ) &
docs_varied 32 docs32v
wait
TOK=$W/minilm/minilm.tokenizer
for f in 384 768; do
  step "merge-probe-$f" 240 "$T benchmarks/merge_probe.py --gpu --tokenizer $TOK --feature $f --out $W/merge_probe_$f.json"
done
step pretokenize 120 "$T benchmarks/gpu/pretokenize.py $W/docs32v $TOK $W/docs32v.jsonl"
for i in 1 2; do
  step "run-text-$i" 120 "$(RUN new minilm docs32v text_docs32v_$i)"
  step "run-ids-$i" 120 "$(RUN new minilm docs32v.jsonl ids_docs32v_$i)"
done
[ -n "$PYSPY" ] && step pyspy-native 180 "$PYSPY record --native --idle --threads --subprocesses --rate 500 --format raw -o $W/minilm/pyspy_native.txt -- bash -c '$(RUN new minilm docs32v spy_docs32v)'"
step stalls 60 "python3 benchmarks/run_stalls.py $W/minilm/*docs*.json --json $W/stalls.json > $W/stalls.md"
touch "$W/DONE"
