#!/usr/bin/env bash
# H200 window w26b (issue 11): is w26's slower `run` from text the change (857757e/a198e0e) or the box? The same MiniLM
# engine run by the code before the change (651f270, .gpu/old: `git archive 651f270 trtforge | tar -x -C .gpu/old`) and
# by this checkout, interleaved, three rounds, from text and from ids. Staging as in session_w4.sh, then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w26b.sh $HOME/w 480 420   (carry .whl2 .native .trtinc .whl .gpu/old)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
N=$(M minilm)
FL="--plugin-library $PLUG"
plugin_build
old_code_root
export_clean minilm
docs_varied 32 docs32v
step build-fp16_def-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $FL -o $N.fp16_def.engine"
step pretokenize 120 "$T benchmarks/gpu/pretokenize.py $W/docs32v $N.tokenizer $W/docs32v.jsonl"
NR="--no-precision-check --no-chunking-check"
for i in 1 2 3; do
  for which in old new; do
    TT=$T; [ "$which" = old ] && TT=$T_OLD
    step "text-$which-$i" 120 "$TT -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v $NR --report $W/minilm/text_${which}_$i.json"
    step "ids-$which-$i" 120 "$TT -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl $NR --report $W/minilm/ids_${which}_$i.json"
  done
done
rm -rf "$W/docs32v"
touch "$W/DONE"
