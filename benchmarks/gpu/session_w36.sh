#!/usr/bin/env bash
# (Ran on an H100 on 2026-12-06, RESULTS w36: no gain; the plan timing was reverted in f2281a6, so TRTFORGE_SDPA_AUTOTUNE no longer exists.)
# GPU window w36, at most 330 s of driver: does timing cuDNN's attention plans (TrtforgeFlashAttention, this checkout)
# move BERT-base's 64x512 margin over 1.5x torch eager (w34: 1.48-1.49x)? One fp16 default engine, timed by
# `vs_torch.py engine` with TRTFORGE_SDPA_AUTOTUNE=0 (the heuristic's first plan, as before) and =1 (the timed pick),
# rotated 0 1 1 0, torch eager in the same window, then `run --reference` with the timed pick (the accuracy gate).
# Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w36.sh $HOME/w 330 320   (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
CAP=$(( $(date +%s) + 330 )); [ "$DEADLINE" -gt "$CAP" ] && DEADLINE=$CAP
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build &
B=$(M bert-base)
export_clean bert-base
wait
step build-fp16_def-bert-base 300 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC --plugin-library $PLUG -o $B.fp16_def.engine"
i=0
for a in 0 1 1 0; do
  i=$((i + 1))
  step "engine-sdpa$a-$i" 120 "export TRTFORGE_SDPA_AUTOTUNE=$a; $T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine) --out $W/engine_sdpa${a}_$i.json"
done
step torch 200 "$P312 benchmarks/vs_torch.py torch --models bert-base --repeat 8 --batch 64 --no-e2e --out $W/torch.json"
for i in 1 2 3 4; do
  for f in "$W"/engine_sdpa?_$i.json; do
    [ -f "$f" ] && step "table-$i" 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $f --out ${f%.json}_vs_torch.json > ${f%.json}.md"
  done
done
step run-ref-bert-base 150 "$T -m trtforge run $B.fp16_def.engine --config $CFG/bert-base.yaml --reference $B.clean.onnx --report $W/bert-base/run_ref.json"
touch "$W/DONE"
