#!/usr/bin/env bash
# H200 window w27c (issue 11): the review's padding rules (c2373d0: only where every input leads with one batch axis and
# every output's axis 0 is dynamic) on the real MiniLM engine: `run` from ids twice and `run --reference`, padded.
# Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w27c.sh $HOME/w 300 320     (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
N=$(M minilm)
export_clean minilm
docs_varied 32 docs32v
step build-fp16_def-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC --plugin-library $PLUG -o $N.fp16_def.engine"
step pretokenize 120 "$T benchmarks/gpu/pretokenize.py $W/docs32v $N.tokenizer $W/docs32v.jsonl"
for i in 1 2; do
  step "run-minilm-ids-$i" 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl --no-precision-check --no-chunking-check --report $W/minilm/ids_$i.json"
done
step run-ref-minilm 120 "$T -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --reference $N.clean.onnx --report $W/minilm/run_ref_def.json"
rm -rf "$W/docs32v"
touch "$W/DONE"
