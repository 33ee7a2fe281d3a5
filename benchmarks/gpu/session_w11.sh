#!/usr/bin/env bash
# The next H200 window (staging as in session_w4.sh; the real MiniLM as .whl2/gtpkg). Run from the project root:
#   bash benchmarks/gpu/session_w11.sh W DEADLINE_EPOCH   then  poll.sh W 540
# A (issue 11, `run` wall <= 1.1x GPU): planning's bounded lead (5b1c800, --plan-ahead; w10b's start-up excess with
#    processes was every document planned at once, 8 threads contending for the GIL) against the unbounded one, with
#    threads and with 4 / 8 tokenizing processes, on inputs of distinct lengths (steps.sh docs_varied), two runs each;
#    decides whether --tokenize-processes becomes the default. run_stalls table. Then the processes' start-up cost
#    with and without the warm-up's page-in of merged outputs.
# B: where the MiniLM engine's fixed ~1.31 ms per execution comes from (2026-12-02 window: no batch took less,
#    whatever its size): its GPU ms at 1x64, 16x128, 16x256 with the default fusions and with the GELU,
#    skip-LayerNorm and attention passes off one at a time (`vs_torch.py engine`), BERT-base's default for scale.
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm)

export_clean bert-base minilm
( step build-fp16-bert-base 900 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml $TAC --precision fp16 -o $B.fp16.engine" ) &
( step build-fp16-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" ) &
wait

docs_varied 8 docs8v; docs_varied 32 docs32v
RUN() { echo "$T -m trtforge run $(M $1).fp16.engine --config $CFG/$1.yaml --inputs $W/$2 --no-precision-check --no-chunking-check ${4:-} --report $W/$1/$3.json"; }
# planning's bounded lead (5b1c800: --plan-ahead 8, 2 planning threads with processes) against the unbounded one
for i in 1 2; do
  for m in minilm bert-base; do
    for d in docs8v docs32v; do
      step "run-$m-$d-$i" 300 "$(RUN $m $d threads_${d}_$i)"
      step "run-$m-ahead0-$d-$i" 300 "$(RUN $m $d ahead0_${d}_$i "--plan-ahead 0")"
      step "run-$m-tp8-$d-$i" 300 "$(RUN $m $d tp8_${d}_$i "--tokenize-processes 8")"
      step "run-$m-tp8-ahead0-$d-$i" 300 "$(RUN $m $d tp8ahead0_${d}_$i "--tokenize-processes 8 --plan-ahead 0 --plan-workers 8")"
      step "run-$m-tp4-$d-$i" 300 "$(RUN $m $d tp4_${d}_$i "--tokenize-processes 4")"
      step "run-$m-tp4-slots6-$d-$i" 300 "$(RUN $m $d tp4s6_${d}_$i "--tokenize-processes 4 --slots 6")"
    done
  done
done
# Where the processes' remaining start-up cost (w10b: ~0.18 s, the first ~40 batches) goes: without the warm-up there is
# no page-in of merged outputs on the planning threads (prepare_outputs), so if the cost follows it, this shows it.
for i in 1 2; do
  step "run-minilm-tp8-nowarm-$i" 300 "$(RUN minilm docs32v tp8_nowarm_docs32v_$i "--tokenize-processes 8 --warmup 0")"
  step "run-minilm-nowarm-$i" 300 "$(RUN minilm docs32v threads_nowarm_docs32v_$i "--warmup 0")"
done
step stalls 60 "python3 benchmarks/run_stalls.py $W/minilm/*docs*.json $W/bert-base/*docs*.json --json $W/stalls.json > $W/stalls.md"
rm -rf "$W/docs8v" "$W/docs32v"

# B: the same MiniLM graph built with one fusion pass off at a time, one after another (timing under the same load)
for pass in gelu skip-layernorm attention; do
  step "build-minilm-no-$pass" 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC --fuse-$pass off -o $N.no-$pass.engine"
done
step engine-ms 300 "$T benchmarks/vs_torch.py engine $(eng minilm=$N.fp16.engine minilm_no_gelu=$N.no-gelu.engine minilm_no_skipln=$N.no-skip-layernorm.engine minilm_no_attention=$N.no-attention.engine bert-base=$B.fp16.engine) --shapes 1x64 16x128 16x256 --out $W/engine_ms.json"
touch "$W/DONE"
