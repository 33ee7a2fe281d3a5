#!/usr/bin/env bash
# H200 window w29 (issue 11: run wall <= 1.1x GPU on MiniLM): text inputs planned in worker processes
# (--plan-processes N, trtforge/planning_processes.py: each input tokenized and cut into its window blocks in a spawned
# worker, so the loop's process only unpickles a plan) against the planning threads (the default), interleaved, two
# rounds: MiniLM and BERT-base, from ids and from text; py-spy --gil (main process only, 500 Hz) on docs128v.jsonl (4x
# docs32v) with and without them; run --reference with --plan-processes 8 (the gates through the process path);
# vs_torch.py engine / torch once more for the 64x512 margin.
# Staging as in session_w4.sh (the last part carries .whl .whl3 .whl5), then
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w29.sh $HOME/w 720 560   (carry .whl2 .native .trtinc .whl .whl4)
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
plugin_env
plugin_build
default_engines_and_docs  # steps.sh: MiniLM and BERT-base default fp16 engines, docs8, docs32v(.jsonl)
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
lines = open(f"{w}/docs32v.jsonl").read().splitlines()
with open(f"{w}/docs128v.jsonl", "w") as f:
    for k in range(4):
        for line in lines:
            item = json.loads(line); item["name"] = f"{k}_{item.get('name', '')}"; f.write(json.dumps(item) + "\n")
PY

NR="--no-precision-check --no-chunking-check"
R() {  # R MODEL INPUT NAME [FLAGS]: `trtforge run` of MODEL's default engine, report $W/MODEL/NAME.json
  local m=$1 input=$2 name=$3; shift 3
  echo "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $input $NR $* --report $W/$m/$name.json"
}
for i in 1 2; do
  for pp in 0 4 8; do
    step "run-minilm-ids-pp$pp-$i" 120 "$(R minilm $W/docs32v.jsonl ids_pp${pp}_$i --plan-processes $pp)"
  done
  for pp in 0 8 12; do
    step "run-minilm-text-pp$pp-$i" 120 "$(R minilm $W/docs32v text_pp${pp}_$i --plan-processes $pp)"
  done
  for pp in 0 8; do
    step "run-bert-base-ids-pp$pp-$i" 120 "$(R bert-base $W/docs32v.jsonl ids_pp${pp}_$i --plan-processes $pp)"
    step "run-bert-base-text-pp$pp-$i" 120 "$(R bert-base $W/docs32v text_pp${pp}_$i --plan-processes $pp)"
  done
done
for pp in 0 8; do
  step "run-minilm-ids128-pp$pp" 120 "$(R minilm $W/docs128v.jsonl ids128_pp$pp --plan-processes $pp)"
done
if [ -n "$PYSPY" ]; then
  for pp in 8 0; do
    step "pyspy-minilm-ids128-pp$pp" 150 "$PYSPY record --gil --nonblocking --rate 500 --format raw -o $W/minilm/pyspy_gil_pp$pp.txt -- bash -c '$(R minilm $W/docs128v.jsonl spy128_pp$pp --plan-processes $pp)'"
  done
fi
for m in minilm bert-base; do
  step "run-ref-$m-pp8" 150 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --reference $(M $m).clean.onnx --plan-processes 8 --report $W/$m/run_ref_pp8.json"
done
step engine-def 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def.json"
step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
for m in bert-base minilm; do
  step "run-$m-docs8-pp8" 120 "$(R $m $W/docs8 run_docs8_pp8 --plan-processes 8)"
done
step table-def 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_def.json --run bert-base=$W/bert-base/run_docs8_pp8.json --run minilm=$W/minilm/run_docs8_pp8.json --out $W/vs_torch_def.json > $W/table_def.md"
rm -rf "$W/docs32v" "$W/docs8" "$W/docs128v.jsonl"
touch "$W/DONE"
