#!/usr/bin/env bash
# H200 window w26c (issue 11): which part of 857757e slowed `run` from text (w26b: 1.29-1.54M against 2.23-2.35M tokens/s
# for the code before it)? MiniLM from text by the code before (.gpu/old, 651f270), this checkout (new), and the new code
# with one part put back each: v1 per-window staging parts, v2 per-chunk Batcher.add, v3 the old pooled_mean; interleaved.
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w26c.sh $HOME/w 420 400  (carry .whl2 .native .trtinc .whl .gpu/old .gpu/v1 .gpu/v2 .gpu/v3)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
N=$(M minilm)
plugin_build
old_code_root
for v in v1 v2 v3; do R=$HOME/root_$v; rm -rf "$R"; mkdir -p "$R"; ln -s "$ROOT/zoo" "$ROOT/calib_data" "$ROOT/configs" "$R/"; ln -s "$ROOT/.gpu/$v/trtforge" "$R/trtforge"; done
export_clean minilm
docs_varied 32 docs32v
step build-fp16_def-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC --plugin-library $PLUG -o $N.fp16_def.engine"
NR="--no-precision-check --no-chunking-check"
for i in 1 2 3; do
  for which in old new v1 v2 v3; do
    case $which in old) TT=$T_OLD ;; new) TT=$T ;; *) TT="cd $HOME/root_$which && . \$HOME/trt86.env && PYTHONPATH=$HOME/root_$which:\$PYTHONPATH \$PY310" ;; esac
    step "text-$which-$i" 120 "$TT -m trtforge run $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v $NR --report $W/minilm/text_${which}_$i.json"
  done
done
rm -rf "$W/docs32v"
touch "$W/DONE"
