#!/usr/bin/env bash
# H200 window w27 (issue 11): (1) a partial last batch padded to the warm-up's batch size (TrtRunner._padded, default on)
# against --no-pad-batches, and the leaner planning (Window a named tuple, BlockChunk's lazy feeds, wrap_spans' strided
# gather) and merge (pooled rows kept as rows, one cast in pooled_mean), MiniLM and BERT-base from ids and from text,
# two interleaved rounds; (2) benchmarks/host_profile.py: each loop function's thread CPU per window on the box;
# (3) run --reference for both (the precision gate over padded batches); (4) docs8 runs for the vs-torch end-to-end table.
# Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w27.sh $HOME/w 900 560     (carry .whl2 .native .trtinc .whl)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
default_engines_and_docs  # steps.sh (the setup these windows ran inline, unchanged)

NR="--no-precision-check --no-chunking-check"
for i in 1 2; do
  for m in minilm bert-base; do
    E=$(M $m).fp16_def.engine
    step "run-$m-ids-pad-$i" 120 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs32v.jsonl $NR --report $W/$m/run_ids_pad_$i.json"
    step "run-$m-ids-nopad-$i" 120 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs32v.jsonl $NR --no-pad-batches --report $W/$m/run_ids_nopad_$i.json"
    step "run-$m-text-pad-$i" 120 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs32v $NR --report $W/$m/run_text_pad_$i.json"
    step "run-$m-text-nopad-$i" 120 "$T -m trtforge run $E --config $CFG/$m.yaml --inputs $W/docs32v $NR --no-pad-batches --report $W/$m/run_text_nopad_$i.json"
  done
done
step host-profile-minilm 180 "$T benchmarks/host_profile.py $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl --runs 2 --out $W/minilm/host_profile.json"
step host-profile-minilm-text 180 "$T benchmarks/host_profile.py $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v --runs 1 --out $W/minilm/host_profile_text.json"
step host-profile-bert-base 180 "$T benchmarks/host_profile.py $B.fp16_def.engine --config $CFG/bert-base.yaml --inputs $W/docs32v.jsonl --runs 1 --out $W/bert-base/host_profile.json"
for m in bert-base minilm; do
  step "run-ref-$m" 300 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref_def.json"
  step "run-$m-docs8" 120 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $W/docs8 $NR --report $W/$m/run_docs8.json"
done
rm -rf "$W/docs32v" "$W/docs8"
touch "$W/DONE"
