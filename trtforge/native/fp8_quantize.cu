// The two conversions TrtforgeGemmFp8 needs around cuBLASLt's FP8 matmul, which takes e4m3 operands only:
//   activations: fp16 [T, K] -> e4m3 [T, K], x / x_scale, saturated to +-448 (each enqueue, into the workspace);
//   weights:     fp16 [K, N] (row-major, as MatMul's B) -> e4m3 [N, K], w / w_scale (once, at upload), the "T" operand
//                cuBLASLt's FP8 kernels require.
// Why hand-written: cuBLASLt has no fp16 -> fp8 conversion, and TensorRT 8.6 has no FP8 type to do it in the graph.
// The arithmetic (multiply in fp32, round to nearest even, saturate) is cuda_fp8.h's __nv_cvt_float2_to_fp8x2, the
// same as trtforge.fusion.fp8.quantize_e4m3 emulates on the CPU for the tests.

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace {

// 8 halves in, 8 e4m3 bytes out per step: 16-byte loads, 8-byte stores.
__global__ void quantize_vec8(uint4 const* __restrict__ x, uint2* __restrict__ y, int64_t groups, float inv_scale) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < groups;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        uint4 const v = x[i];
        __half2 const* h = reinterpret_cast<__half2 const*>(&v);
        __nv_fp8x2_storage_t out[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float2 f = __half22float2(h[j]);
            f.x *= inv_scale;
            f.y *= inv_scale;
            out[j] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
        }
        y[i] = *reinterpret_cast<uint2 const*>(out);
    }
}

__global__ void quantize_scalar(__half const* __restrict__ x, __nv_fp8_storage_t* __restrict__ y, int64_t count,
                                float inv_scale) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        y[i] = __nv_cvt_float_to_fp8(__half2float(x[i]) * inv_scale, __NV_SATFINITE, __NV_E4M3);
}

__global__ void quantize_transpose(__half const* __restrict__ w, __nv_fp8_storage_t* __restrict__ wt, int32_t k, int32_t n,
                                   float inv_scale) {
    int64_t const total = static_cast<int64_t>(k) * n;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        int64_t const row = i / n, col = i % n;  // w[row, col] -> wt[col, row]
        wt[col * k + row] = __nv_cvt_float_to_fp8(__half2float(w[i]) * inv_scale, __NV_SATFINITE, __NV_E4M3);
    }
}

int blocks_for(int64_t items, int threads) {
    int64_t const b = (items + threads - 1) / threads;
    return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

}  // namespace

namespace trtforge {

// y = e4m3(x / scale) over `count` fp16 values; vectorized where both pointers and the count allow it.
cudaError_t quantize_fp8(void const* x, void* y, int64_t count, float scale, cudaStream_t stream) {
    constexpr int kThreads = 256;
    float const inv = 1.f / scale;
    bool const vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0 && count % 8 == 0;
    if (vec) {
        int64_t const groups = count / 8;
        quantize_vec8<<<blocks_for(groups, kThreads), kThreads, 0, stream>>>(static_cast<uint4 const*>(x), static_cast<uint2*>(y),
                                                                            groups, inv);
    } else {
        quantize_scalar<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(static_cast<__half const*>(x),
                                                                             static_cast<__nv_fp8_storage_t*>(y), count, inv);
    }
    return cudaGetLastError();
}

// wt [N, K] = e4m3(w [K, N] / scale), transposed.
cudaError_t quantize_transpose_fp8(void const* w, void* wt, int32_t k, int32_t n, float scale, cudaStream_t stream) {
    constexpr int kThreads = 256;
    quantize_transpose<<<blocks_for(static_cast<int64_t>(k) * n, kThreads), kThreads, 0, stream>>>(
        static_cast<__half const*>(w), static_cast<__nv_fp8_storage_t*>(wt), k, n, 1.f / scale);
    return cudaGetLastError();
}

}  // namespace trtforge
