#!/usr/bin/env bash
# H200, after session_w4 (same staging): `run` end to end on MiniLM with the new merge (outputs merged out of
# pinned memory on 4 threads, merged outputs paged in on the planning threads). One profile (seq 1-256: the
# chunks are 256) so that it fits one call after staging. Run from the project root, after copying .whl2/gtpkg
# into /tmp/site as session_w4 does:
#   bash benchmarks/gpu/session_w5.sh W DEADLINE_EPOCH
set -u
ROOT=$(pwd); W=${1:?work dir}; DEADLINE=${2:?deadline epoch}
. "$ROOT/benchmarks/gpu/steps.sh"
driver_setup
N=$W/minilm/minilm
mkdir -p "$W/minilm" "$W/docs8"
for k in 1 2 3 4 5 6 7 8; do for f in calib_data/minilm_long/*.txt; do cp "$f" "$W/docs8/${k}_$(basename "$f")"; done; done
step export-minilm 120 "$P312 -m trtforge export --config $CFG/minilm.yaml -o $N.onnx" &&
step clean-minilm 60 "$P312 -m trtforge clean $N.onnx" &&
step build-fp16-minilm 200 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC -o $N.fp16.engine" &&
for i in 1 2; do
  step "run-e2e-minilm-$i" 60 "$T -m trtforge run $N.fp16.engine --config $CFG/minilm.yaml --inputs $W/docs8 --no-precision-check --report $W/minilm/run_e2e_$i.json"
done
touch "$W/DONE"
