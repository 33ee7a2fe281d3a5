#!/usr/bin/env bash
# H200 window w27b (issue 11), after w27: (1) the collector's wait for the GPU as a blocking-sync event (--gpu-wait block)
# against CUDA's spinning default, alone and with one merge thread, one planning thread or a 2 ms GIL switch interval
# (fewer or longer-running threads contending for the GIL), MiniLM from ids and text, BERT-base from ids, two rounds;
# (2) vs_torch.py in one window: engine vs torch eager per shape, and `run` over docs8 vs the torch fp16 loop.
# Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w27b.sh $HOME/w 700 560     (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
default_engines_and_docs  # steps.sh (the setup these windows ran inline, unchanged)

NR="--no-precision-check --no-chunking-check"
declare -A SET=([spin]="" [block]="--gpu-wait block" [block_mw1]="--gpu-wait block --merge-workers 1"
                [block_pw1]="--gpu-wait block --plan-workers 1" [block_si2000]="--gpu-wait block --switch-interval-us 2000")
for i in 1 2; do
  for s in spin block block_mw1 block_pw1 block_si2000; do
    step "run-minilm-ids-$s-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl $NR ${SET[$s]} --report $W/minilm/ids_${s}_$i.json"
  done
  for s in spin block; do
    step "run-minilm-text-$s-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v $NR ${SET[$s]} --report $W/minilm/text_${s}_$i.json"
    step "run-bert-base-ids-$s-$i" 120 "$T -m trtforge run $B.fp16_def.engine --config $CFG/bert-base.yaml --inputs $W/docs32v.jsonl $NR ${SET[$s]} --report $W/bert-base/ids_${s}_$i.json"
  done
done
step engine-def 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
for m in bert-base minilm; do
  step "run-$m-docs8" 120 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $W/docs8 $NR --report $W/$m/run_docs8.json"
done
step table-def 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_def.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch_def.json > $W/table_def.md"
rm -rf "$W/docs32v" "$W/docs8"
touch "$W/DONE"
