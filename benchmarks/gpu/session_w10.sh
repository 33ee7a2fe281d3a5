#!/usr/bin/env bash
# The H200 window of 2026-12-02 (staging as in session_w4.sh; the real MiniLM as .whl2/gtpkg; the code before this
# session as .gpu/old, made by `git archive e3ed82c trtforge | tar -x -C .gpu/old`). Run from the project root:
#   bash benchmarks/gpu/session_w10.sh W DEADLINE_EPOCH   then  poll.sh W 540
# A (issue 11, `run` wall <= 1.1x GPU): this session's loop against the code before it (.gpu/old), in one window,
#    alternating. New: less Python per batch (windows built as blocks and staged in one copy, 'center' merges one
#    np.take per run of windows), a full-length last window (--last-window full, the default, vs short), worker
#    processes tokenizing (--tokenize-processes 8). Inputs: docs8v / docs32v (steps.sh docs_varied: 48 / 192
#    documents of distinct lengths, as real inputs are) and docs8 (earlier sessions' input: 8 copies of 6 texts).
#    Each report's runtime.timeline through benchmarks/run_stalls.py.
# B (issue 10's caveat): ResNet-50 fp16, TensorRT implicit INT8 and trtforge INT8 best built one after another in
#    this window and compared, after A (skipped if the window runs out).
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
B=$(M bert-base); N=$(M minilm); R=$(M resnet50)
# the previous code runs from a root of its own: `python -m` puts the working directory first on sys.path
OLDROOT=$HOME/oldroot; rm -rf "$OLDROOT"; mkdir -p "$OLDROOT"
ln -s "$ROOT/zoo" "$ROOT/calib_data" "$ROOT/configs" "$OLDROOT/"; ln -s "$ROOT/.gpu/old/trtforge" "$OLDROOT/trtforge"
T_OLD="cd $OLDROOT && . \$HOME/trt86.env && PYTHONPATH=$OLDROOT:\$PYTHONPATH \$PY310"

( export_clean resnet50 ) &
export_clean bert-base minilm
( step build-fp16-bert-base 900 "$T -m trtforge build $B.clean.onnx --config $CFG/bert-base.yaml $TAC --precision fp16 -o $B.fp16.engine" ) &
( step build-fp16-minilm 600 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" ) &
wait

docs8; docs_varied 8 docs8v; docs_varied 32 docs32v
# RUN CODE MODEL DOCS NAME [FLAGS]: one `trtforge run` of the fp16 engine, report in W/MODEL/NAME.json
RUN() { local code=$T; [ "$1" = old ] && code=$T_OLD
  echo "$code -m trtforge run $(M $2).fp16.engine --config $ROOT/$CFG/$2.yaml --inputs $W/$3 --no-precision-check ${5:-} --report $W/$2/$4.json"; }
for i in 1 2; do
  for m in minilm bert-base; do
    step "run-$m-old-docs8v-$i" 240 "$(RUN old $m docs8v old_docs8v_$i)"
    step "run-$m-new-docs8v-$i" 240 "$(RUN new $m docs8v new_docs8v_$i)"
    step "run-$m-new-short-docs8v-$i" 240 "$(RUN new $m docs8v new_short_docs8v_$i "--last-window short")"
    step "run-$m-new-tp8-docs8v-$i" 240 "$(RUN new $m docs8v new_tp8_docs8v_$i "--tokenize-processes 8")"
    step "run-$m-old-docs32v-$i" 300 "$(RUN old $m docs32v old_docs32v_$i)"
    step "run-$m-new-docs32v-$i" 300 "$(RUN new $m docs32v new_docs32v_$i)"
    step "run-$m-new-tp8-docs32v-$i" 300 "$(RUN new $m docs32v new_tp8_docs32v_$i "--tokenize-processes 8")"
    step "run-$m-old-docs8-$i" 240 "$(RUN old $m docs8 old_docs8_$i)"
    step "run-$m-new-docs8-$i" 240 "$(RUN new $m docs8 new_docs8_$i)"
  done
done
step stalls 60 "python3 benchmarks/run_stalls.py $W/minilm/*docs*.json $W/bert-base/*docs*.json --json $W/stalls.json > $W/stalls.md"
rm -rf "$W/docs8" "$W/docs8v" "$W/docs32v"

step calibrate-resnet50 600 "$T -m trtforge calibrate $R.clean.onnx --data calib_data/images --eval-data calib_data/images_eval --max-samples 64 --max-eval-samples 64 --min-top1-agreement 0.99 --no-engine-check"
step build-best-resnet50 600 "$T -m trtforge build $R.int8.onnx --config $CFG/resnet50.yaml --precision best $TAC -o $R.best.engine"
step build-fp16-resnet50 900 "$T -m trtforge build $R.clean.onnx --config $CFG/resnet50.yaml --precision fp16 $TAC -o $R.fp16.engine"
step build-implicit-resnet50 900 "$T benchmarks/gpu/implicit_int8.py build $R.clean.onnx $W/resnet50/implicit.engine --data calib_data/images --max-samples 64"
step compare-resnet50 300 "$T benchmarks/gpu/implicit_int8.py compare $R.clean.onnx --eval-data calib_data/images_eval $(eng trtforge_int8_best=$R.best.engine fp16=$R.fp16.engine trt_implicit_int8=$W/resnet50/implicit.engine) --json $W/resnet50/compare.json"
touch "$W/DONE"
