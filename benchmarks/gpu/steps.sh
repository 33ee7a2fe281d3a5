# Sourced by the GPU drivers: `step NAME TIMEOUT_S CMD...` runs CMD under a timeout capped by $DEADLINE,
# logs it to $W/log.NAME and appends {step, rc, seconds, cmd, tail} to $W/steps.jsonl; a step whose
# deadline has passed is recorded as skipped. Drivers go on after a failed step.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    printf '{"step": "%s", "rc": null, "skipped": "deadline"}\n' "$name" >> "$W/steps.jsonl"; return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s.%N) log="$W/log.$name"
  timeout "$limit" bash -c "$*" > "$log" 2>&1; local rc=$?
  local dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  python3 - "$name" "$rc" "$dt" "$*" "$log" >> "$W/steps.jsonl" <<'PY'
import json, sys
name, rc, dt, cmd, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-1500:]
print(json.dumps({"step": name, "rc": int(rc), "seconds": float(dt), "cmd": cmd, "tail": tail}))
PY
  echo "[$name] rc=$rc ${dt}s"
  return $rc
}

# The drivers' common setup (after ROOT, W and DEADLINE are set): offline, unbuffered, W/steps.jsonl fresh;
# P312 = the GPU box's python3 (torch) with the carried cp312 wheels, T = TensorRT 8.6's Python 3.10, TAC = the
# tactic sources a staged 8.6 can use, PYSPY = py-spy where carried, CFG = the full-size zoo configs.
driver_setup() {
  mkdir -p "$W"; : > "$W/steps.jsonl"
  export CI=true PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
  P312="PYTHONPATH=/tmp/site:$ROOT python3"
  T=". \$HOME/trt86.env && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310"
  TAC="--tactic-sources -CUBLAS,-CUBLAS_LT,-CUDNN"
  PYSPY=$(ls /tmp/pyspy/*/scripts/py-spy 2>/dev/null | head -1); [ -n "$PYSPY" ] && chmod +x "$PYSPY"  # carried as .whl4
  CFG=zoo/configs/full
}

# Where a zoo model's files live on the GPU box: $W/MODEL/MODEL(.onnx, .clean.onnx, .fp16.engine, ...).
M() { echo "$W/$1/$1"; }

# " --engine NAME=FILE" for each NAME=FILE argument whose FILE exists (a failed build drops out of a comparison).
eng() { for l in "$@"; do f=${l#*=}; [ -f "$f" ] && printf ' --engine %s' "$l"; done; }

# The fp16 engine of BERT-base or MiniLM (MiniLM: one profile up to seq 256), $W/MODEL/MODEL.fp16.engine.
build_fp16() {
  local m=$1 tiers=""; [ "$m" = minilm ] && tiers="--tiers seq=256"
  step "build-fp16-$m" 900 "$T -m trtforge build $(M $m).clean.onnx --config $CFG/$m.yaml --precision fp16 $tiers $TAC -o $(M $m).fp16.engine"
}

# `trtforge run` of MODEL's fp16 engine over $W/INPUT without the after-loop checks, report $W/MODEL/NAME.json.
run_fp16() {
  local m=$1 input=$2 name=$3; shift 3
  echo "$T -m trtforge run $(M $m).fp16.engine --config $CFG/$m.yaml --inputs $W/$input --no-precision-check --no-chunking-check $* --report $W/$m/$name.json"
}

# $W/docs8: calib_data/minilm_long eight times over (48 documents, 356,168 tokens), the `run` benchmarks' input.
docs8() {
  mkdir -p "$W/docs8"
  for k in 1 2 3 4 5 6 7 8; do for f in calib_data/minilm_long/*.txt; do cp "$f" "$W/docs8/${k}_$(basename "$f")"; done; done
}

# $W/DIR: each calib_data/minilm_long text N times, copy k cut to (100 - N + k)% of its bytes: documents of distinct
# lengths, so their last windows differ in length as real inputs' do (docs8's copies share 6 lengths).
docs_varied() {
  local n=$1 dir=$2; mkdir -p "$W/$dir"
  for k in $(seq 1 "$n"); do for f in calib_data/minilm_long/*.txt; do
    head -c $(( $(wc -c < "$f") * (100 - n + k) / 100 )) "$f" > "$W/$dir/${k}_$(basename "$f")"; done; done
}

# Export (the GPU box's torch) and clean each named zoo model in parallel, into $W/MODEL/MODEL.onnx.
export_clean() {
  for m in "$@"; do
    ( mkdir -p "$W/$m"
      step "export-$m" 600 "$P312 -m trtforge export --config $CFG/$m.yaml -o $W/$m/$m.onnx" &&
      step "clean-$m" 300 "$P312 -m trtforge clean $W/$m/$m.onnx" ) &
  done
  wait
}

# T_OLD: like T, for the previous code in .gpu/old (`git archive REV trtforge | tar -x -C .gpu/old`), run from a root of
# its own ($HOME/oldroot): `python -m` puts the working directory first on sys.path.
old_code_root() {
  OLDROOT=$HOME/oldroot; rm -rf "$OLDROOT"; mkdir -p "$OLDROOT"
  ln -s "$ROOT/zoo" "$ROOT/calib_data" "$ROOT/configs" "$OLDROOT/"; ln -s "$ROOT/.gpu/old/trtforge" "$OLDROOT/trtforge"
  T_OLD="cd $OLDROOT && . \$HOME/trt86.env && PYTHONPATH=$OLDROOT:\$PYTHONPATH \$PY310"
}

# RUN old|new MODEL DOCS NAME [FLAGS]: run_fp16 by the previous code (old, after old_code_root: its root links zoo/ too)
# or by this checkout's.
RUN() { local which=$1; shift; [ "$which" = old ] && local T=$T_OLD; run_fp16 "$@"; }

# The run-loop windows' start: MiniLM and BERT-base exported, cleaned and built fp16 (in parallel), $W/docs32v
# (docs_varied 32) and $W/docs128v (docs32v four times over).
fp16_engines_and_docs() {
  export_clean minilm bert-base
  ( build_fp16 minilm ) &
  ( build_fp16 bert-base ) &
  docs_varied 32 docs32v
  mkdir -p "$W/docs128v"; for k in 1 2 3 4; do for f in "$W"/docs32v/*.txt; do cp "$f" "$W/docs128v/${k}_$(basename "$f")"; done; done
  wait
}

# The drivers that use libtrtforge_plugins (session_w22.sh on): after driver_setup, SITE = the box's site-packages,
# CUDNN = its cuDNN 9, EXTRA = the directories of its nvrtc, cuDNN and cuBLASLt libraries; T puts them on the loader's
# path (cuDNN's runtime-compiled engines dlopen nvrtc, the GEMM plugin dlopens cuBLASLt); PLUG = the library in $W,
# built against the box's headers by `plugin_build` (falling back to the one carried in .native/).
plugin_env() {
  SITE=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))')
  CUDNN=$SITE/nvidia/cudnn
  EXTRA=$(find "$SITE/nvidia" \( -name 'libnvrtc*.so*' -o -name 'libcudnn.so.9' -o -name 'libcublasLt.so.*' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
  export TRTFORGE_CUDNN_LIB=$CUDNN/lib
  T=". \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$ROOT:\$PYTHONPATH \$PY310"
  PLUG=$W/libtrtforge_plugins.so
}

plugin_build() {
  local inc; inc=$(find "$SITE/nvidia" -name cublasLt.h -printf '%h\n' 2>/dev/null | head -1)
  step plugin-build 300 "TRT_INCLUDE=.trtinc/include CUDNN_INCLUDE=$CUDNN/include CUDNN_LIB=$CUDNN/lib CUDNN_FRONTEND_INCLUDE=.native/cudnn_frontend/include CUBLAS_INCLUDE=${inc:-.native/cublas/include} bash trtforge/native/build.sh $PLUG" \
    || cp .native/libtrtforge_plugins.so "$PLUG"
}

# The default fp16 engines (trtforge's plugins: flash attention, GEMM+GELU) of MiniLM and BERT-base with their inputs
# (session_w26.sh on): after driver_setup, plugin_env and plugin_build; sets B and N, exports and cleans both, builds
# $B.fp16_def.engine and $N.fp16_def.engine (MiniLM: one profile up to seq 256) in parallel, writes $W/docs8, $W/docs32v
# and its pre-tokenized $W/docs32v.jsonl.
default_engines_and_docs() {
  B=$(M bert-base); N=$(M minilm)
  local bb="$T -m trtforge build" fl="--plugin-library $PLUG"
  export_clean minilm bert-base
  docs8
  docs_varied 32 docs32v
  ( step build-fp16_def-bert-base 600 "$bb $B.clean.onnx --config $CFG/bert-base.yaml --precision fp16 $TAC $fl -o $B.fp16_def.engine" ) &
  ( step build-fp16_def-minilm 600 "$bb $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC $fl -o $N.fp16_def.engine" ) &
  step pretokenize 120 "$T benchmarks/gpu/pretokenize.py $W/docs32v $N.tokenizer $W/docs32v.jsonl"
  wait
}

# vs_torch.py on the default engines (after default_engines_and_docs): engine GPU ms, torch eager in the same window, a
# `trtforge run` over docs8 per model (report $W/MODEL/run_docs8NAME.json, FLAGS added), and the table in
# $W/table_def.md. vs_torch_default [NAME [FLAGS]]
vs_torch_default() {
  local name=${1:-} flags=${2:-}
  step engine-def 300 "$T benchmarks/vs_torch.py engine $(eng bert-base=$B.fp16_def.engine minilm=$N.fp16_def.engine) --out $W/engine_def.json"
  step torch 300 "$P312 benchmarks/vs_torch.py torch --models bert-base minilm --repeat 8 --batch 64 --out $W/torch.json"
  for m in bert-base minilm; do
    step "run-$m-docs8$name" 120 "$T -m trtforge run $(M $m).fp16_def.engine --config $CFG/$m.yaml --inputs $W/docs8 --no-precision-check --no-chunking-check $flags --report $W/$m/run_docs8$name.json"
  done
  step table-def 60 "python3 benchmarks/vs_torch.py table --torch $W/torch.json --engine $W/engine_def.json --run bert-base=$W/bert-base/run_docs8$name.json --run minilm=$W/minilm/run_docs8$name.json --out $W/vs_torch_def.json > $W/table_def.md"
}

# A/B drivers (session_w30.sh on): `snap_root NAME SRC` copies SRC/trtforge into a root of its own ($HOME/NAME, linking
# zoo, calib_data, configs and benchmarks): later device calls recopy the working tree over $ROOT, and `python -m` puts
# the working directory first on sys.path. `code_in ROOT` is the T of that root (after plugin_env).
snap_root() {
  local r=$HOME/$1; rm -rf "$r"; mkdir -p "$r"; cp -r "$2/trtforge" "$r/trtforge"
  ln -s "$ROOT/zoo" "$ROOT/calib_data" "$ROOT/configs" "$ROOT/benchmarks" "$r/"; echo "$r"
}
code_in() { echo "cd $1 && . \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA && PYTHONPATH=$1:\$PYTHONPATH \$PY310"; }

# MiniLM alone for the run-loop A/Bs (session_w32.sh on): the plugins built beside the export, the default engine
# $N.fp16_def.engine (one seq <= 256 profile) and $W/docs128v.jsonl (docs_varied 32, four times over, pre-tokenized).
minilm_docs128v() {
  plugin_build &  # beside the export (CPU), falling back to the carried library
  N=$(M minilm); mkdir -p "$W/minilm"
  step "export-minilm" 300 "$P312 -m trtforge export --config $CFG/minilm.yaml -o $N.onnx" && step "clean-minilm" 120 "$P312 -m trtforge clean $N.onnx"
  wait
  step build-fp16_def-minilm 300 "$T -m trtforge build $N.clean.onnx --config $CFG/minilm.yaml --precision fp16 --tiers seq=256 $TAC --plugin-library $PLUG -o $N.fp16_def.engine" &
  docs_varied 32 docs32v
  mkdir -p "$W/docs128v"; for k in 1 2 3 4; do for f in "$W"/docs32v/*.txt; do cp "$f" "$W/docs128v/${k}_$(basename "$f")"; done; done
  step pretokenize-128 180 "$T benchmarks/gpu/pretokenize.py $W/docs128v $N.tokenizer $W/docs128v.jsonl"
  wait
}

# A = the code carried in .gpu/old, B = this checkout, each in a root of its own: TA, TB, and T = TB (after plugin_env).
ab_roots() {
  SNAPA=$(snap_root snapA "$ROOT/.gpu/old"); SNAPB=$(snap_root snapB "$ROOT")
  TA=$(code_in "$SNAPA"); TB=$(code_in "$SNAPB"); T=$TB
}
