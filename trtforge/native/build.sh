#!/usr/bin/env bash
# Build libtrtforge_plugins.so: sdpa_plugin.cpp (TrtforgeFlashAttention, over cuDNN's SDPA) and gemm_plugin.cpp
# (TrtforgeGemmGelu, TrtforgeGemm and TrtforgeGemmFp8, over cuBLASLt's matmul with its GELU_BIAS / BIAS epilogues;
# fp8_quantize.cu, compiled by nvcc for sm_89 and sm_90 plus PTX, converts the FP8 form's operands).
#   bash trtforge/native/build.sh OUT.so
# `trtforge plugins build` finds everything below, runs this script and caches the library where build and run load it.
# Needs a C++17 compiler, the CUDA toolkit (nvcc 12+, its headers and static runtime; CUDA_HOME or the nvcc on PATH) and:
#   TRT_INCLUDE             TensorRT 8.6's include/ (NvInfer.h ...: the TensorRT tarball's, or NVIDIA/TensorRT v8.6.0)
#   CUDNN_INCLUDE, CUDNN_LIB  cuDNN 9 (the nvidia-cudnn-cu12/cu13 wheel's nvidia/cudnn/include and lib)
#   CUDNN_FRONTEND_INCLUDE  cudnn-frontend's include/ (header-only; the nvidia-cudnn-frontend 1.14 wheel carries it; the
#                           directory must keep the name include/: the headers include "../include/...")
#   CUBLAS_INCLUDE          where cublasLt.h is (default: the CUDA toolkit's include/; the nvidia-cublas wheel has it);
#                           libcublasLt.so.13 (or .12) is opened at run time with dlopen, not linked
# The library links libcudnn.so.9 (found at run time beside libcudnn's other parts: put CUDNN_LIB on
# LD_LIBRARY_PATH or preload it) and libnvinfer.so.8 (already loaded by TensorRT's Python module when trtforge
# loads the plugin). At link time a stand-in for libnvinfer.so.8 is enough: the plugin calls only getPluginRegistry.
set -euo pipefail
OUT=${1:?output .so}
: "${TRT_INCLUDE:?TensorRT 8.6 include dir}" "${CUDNN_INCLUDE:?cuDNN include dir}" "${CUDNN_LIB:?cuDNN lib dir}"
: "${CUDNN_FRONTEND_INCLUDE:?cudnn-frontend include dir}"
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "${CUDA_HOME:-}" ]; then  # the toolkit whose include/ has cuda_runtime_api.h: beside nvcc, or a usual place
  for c in "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc 2>/dev/null || echo /x/x/x)")")")" /usr/local/cuda /usr/local/cuda-*; do
    [ -f "$c/include/cuda_runtime_api.h" ] && { CUDA_HOME=$c; break; }
  done
fi
: "${CUDA_HOME:?no CUDA toolkit found: set CUDA_HOME}"
CXX=${CXX:-g++}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
# Stand-in for libnvinfer.so.8 at link time only (the real one is in the process when the plugin is loaded).
echo 'extern "C" void* getPluginRegistry() noexcept { return nullptr; }' > "$TMP/nvinfer_stub.cpp"
$CXX -shared -fPIC -o "$TMP/libnvinfer.so" "$TMP/nvinfer_stub.cpp" -Wl,-soname,libnvinfer.so.8
# Export nothing (-fvisibility=hidden and this map): the library is loaded RTLD_GLOBAL, so its C++ template instances must not stand
# in for other libraries' (creators register through a static initializer, which needs no exported symbol).
echo '{ global: trtforge_plugin_names; local: *; };' > "$TMP/exports.map"
[ -e "$CUDNN_LIB/libcudnn.so" ] || ln -sf "$CUDNN_LIB/libcudnn.so.9" "$TMP/libcudnn.so"
CUBLAS_INCLUDE=${CUBLAS_INCLUDE:-$CUDA_HOME/include}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
[ -x "$NVCC" ] || { echo "no nvcc at $NVCC (fp8_quantize.cu needs it): set NVCC or CUDA_HOME" >&2; exit 1; }
"$NVCC" -std=c++17 -O2 -c -Xcompiler -fPIC,-fvisibility=hidden -ccbin "$CXX" \
  -gencode arch=compute_89,code=sm_89 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
  -o "$TMP/fp8_quantize.o" "$HERE/fp8_quantize.cu"
$CXX -std=c++17 -O2 -fPIC -shared -fvisibility=hidden -o "$OUT.tmp" "$HERE/sdpa_plugin.cpp" "$HERE/gemm_plugin.cpp" "$TMP/fp8_quantize.o" \
  -I"$TRT_INCLUDE" -I"$CUDNN_INCLUDE" -I"$CUDNN_FRONTEND_INCLUDE" -I"$CUDA_HOME/include" -I"$CUBLAS_INCLUDE" \
  -L"$TMP" -L"$CUDNN_LIB" -L"$CUDA_HOME/lib64" -lnvinfer -lcudnn -l:libcudart_static.a -ldl -lrt -lpthread \
  -Wl,--no-undefined -Wl,--version-script="$TMP/exports.map" -Wl,-rpath,'$ORIGIN'
mv "$OUT.tmp" "$OUT"
echo "built $OUT"
