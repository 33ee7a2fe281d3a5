#!/usr/bin/env bash
# H200 window w28 (issue 11: run wall <= 1.1x GPU on MiniLM): a text input's windows kept as blocks through batching,
# staging, copy placement and merge (run.WindowBlock / DocumentPlan / Batch, chunking.row_runs, StreamingMerge.run_copies:
# no Python per window in the loop) against the previous code (62f53e3, carried in .gpu/old), interleaved: MiniLM from
# ids (two rounds) and text, BERT-base from ids; py-spy --gil (non-blocking, 200 Hz) and host_profile.py on the new loop;
# run --reference on both (the gates through the new merge); vs_torch.py engine / torch / docs8 for the 64x512 margin.
# Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w28.sh $HOME/w 720 560   (carry .whl2 .native .trtinc .whl .whl4 .gpu/old)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
default_engines_and_docs  # steps.sh: MiniLM and BERT-base default fp16 engines, docs8, docs32v(.jsonl)
old_code_root

NR="--no-precision-check --no-chunking-check"
R() {  # R new|old MODEL INPUT NAME: `trtforge run` of MODEL's default engine by this checkout's code or the previous code's
  local t=$T  # the previous code from a root of its own (old_code_root), with the plugins' libraries on the loader's path
  [ "$1" = old ] && t="cd $OLDROOT && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$OLDROOT:\$PYTHONPATH \$PY310"
  echo "$t -m trtforge run $(M $2).fp16_def.engine --config $ROOT/$CFG/$2.yaml --inputs $3 $NR --report $W/$2/$4.json"
}
for i in 1 2; do
  for v in new old; do
    step "run-minilm-ids-$v-$i" 120 "$(R $v minilm $W/docs32v.jsonl ids_${v}_$i)"
  done
done
for v in new old; do
  step "run-minilm-text-$v" 120 "$(R $v minilm $W/docs32v text_$v)"
  step "run-bert-base-ids-$v" 120 "$(R $v bert-base $W/docs32v.jsonl ids_$v)"
done
step host-profile-minilm 180 "$T benchmarks/host_profile.py $N.fp16_def.engine --config $CFG/minilm.yaml --inputs $W/docs32v.jsonl --runs 1 --out $W/minilm/host_profile.json"
[ -n "$PYSPY" ] && step pyspy-minilm-ids 150 "$PYSPY record --gil --nonblocking --rate 200 --format raw -o $W/minilm/pyspy_gil.txt -- bash -c '$(R new minilm $W/docs32v.jsonl spy_ids)'"
for m in minilm bert-base; do
  step "run-ref-$m" 150 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --report $W/$m/run_ref.json"
done
step engine-def 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
for m in bert-base minilm; do
  step "run-$m-docs8" 120 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $W/docs8 $NR --report $W/$m/run_docs8.json"
done
step table-def 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_def.json --run bert-base=$W/bert-base/run_docs8.json --run minilm=$W/minilm/run_docs8.json --out $W/vs_torch_def.json > $W/table_def.md"
rm -rf "$W/docs32v" "$W/docs8"
touch "$W/DONE"
