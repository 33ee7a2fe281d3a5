#!/usr/bin/env bash
# Fetch the headers libtrtforge_plugins is built from (git-ignored: .trtinc, .native) and build
# the library here, as the fallback start.sh uses where the GPU machine has no CUDA toolkit. Run from the repository root:
#   bash benchmarks/gpu/pack_native.sh TENSORRT_GIT_DIR
# TENSORRT_GIT_DIR: a git directory of NVIDIA/TensorRT holding the tag v8.6.0 (the search tool's `fetch` of
# github:NVIDIA/TensorRT gives one); its include/ becomes .trtinc/include.
# .native/cudnn_frontend/include  cudnn-frontend 1.14.0's headers (PyPI nvidia-cudnn-frontend; 1.32 needs nvrtc.h)
# .native/cublas/include          cublasLt.h (PyPI nvidia-cublas, CUDA 13)
# .native/libtrtforge_plugins.so  built against cuDNN 9.17's headers (PyPI nvidia-cudnn-cu13), CUDA 13's static runtime
# Downloads ~800 MB of wheels into a temporary directory (only headers and cuDNN's libraries are kept while building).
set -euo pipefail
GIT=${1:?a git directory of NVIDIA/TensorRT with the tag v8.6.0}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
mkdir -p .trtinc .native/cudnn_frontend .native/cublas
git --git-dir "$GIT" archive v8.6.0 include | tar -x -C .trtinc
PIP="python3 -m pip download -q --no-deps --only-binary=:all:"
$PIP -d "$TMP" nvidia-cudnn-frontend==1.14.0 'nvidia-cublas>=13,<14' nvidia-cudnn-cu13==9.17.1.4
(cd "$TMP" && python3 -m zipfile -e nvidia_cudnn_frontend-*.whl fe >/dev/null && python3 -m zipfile -e nvidia_cublas-*.whl cb >/dev/null \
  && python3 -m zipfile -e nvidia_cudnn_cu13-*.whl dnn >/dev/null)
rm -rf .native/cudnn_frontend/include .native/cublas/include
cp -r "$TMP/fe/include" .native/cudnn_frontend/include
cp -r "$TMP/cb/nvidia/cu13/include" .native/cublas/include
TRT_INCLUDE=.trtinc/include CUDNN_INCLUDE="$TMP/dnn/nvidia/cudnn/include" CUDNN_LIB="$TMP/dnn/nvidia/cudnn/lib" \
  CUDNN_FRONTEND_INCLUDE=.native/cudnn_frontend/include CUBLAS_INCLUDE=.native/cublas/include \
  bash trtforge/native/build.sh .native/libtrtforge_plugins.so
du -sh .native .trtinc
