// Which cuBLASLt FP8 matmul descriptions run on this GPU, and how fast: the question TrtforgeGemmFp8 raised when cuBLASLt's
// heuristic offered 8 algorithms for its description and every call returned CUBLAS_STATUS_NOT_SUPPORTED. For each
// variant of TrtforgeGemmFp8's description (epilogue none / BIAS / GELU_BIAS, bias fp16 or bf16, fast accumulation on or
// off, C == D or apart, the workspace 256-byte aligned or not, the B scale 4 or 256 bytes after A's, D fp16 or e4m3 with
// an fp16 C of its own: the --fp8-chain-ffn form) it prints the heuristic's count, the first algorithm's
// status, and its time and TFLOP/s at BERT-base's 64x512 shapes; fp16 (TrtforgeGemm's description) for comparison.
// Build (dev machine): nvcc -std=c++17 -O2 -gencode arch=compute_90,code=sm_90 -I .native/cublas/include
//   benchmarks/gpu/fp8_probe.cu -o .native/fp8_probe -ldl        Run: .native/fp8_probe (dlopens libcublasLt.so.13/.12)
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#define SYM(name) auto name##_ = reinterpret_cast<decltype(&name)>(dlsym(lib, #name))

int main() {
    void* lib = dlopen("libcublasLt.so.13", RTLD_NOW);
    if (!lib) lib = dlopen("libcublasLt.so.12", RTLD_NOW);
    if (!lib) { std::printf("no libcublasLt: %s\n", dlerror()); return 1; }
    SYM(cublasLtCreate); SYM(cublasLtGetVersion); SYM(cublasLtMatmulDescCreate); SYM(cublasLtMatmulDescSetAttribute);
    SYM(cublasLtMatrixLayoutCreate); SYM(cublasLtMatmulPreferenceCreate); SYM(cublasLtMatmulPreferenceSetAttribute);
    SYM(cublasLtMatmulAlgoGetHeuristic); SYM(cublasLtMatmul); SYM(cublasLtMatmulDescDestroy); SYM(cublasLtMatrixLayoutDestroy);
    cublasLtHandle_t h;
    cublasLtCreate_(&h);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    std::printf("cuBLASLt %zu on %s (sm_%d%d)\n", cublasLtGetVersion_(), prop.name, prop.major, prop.minor);
    size_t const ws_bytes = 32u << 20;
    int64_t const T = 32768;
    void *x, *w, *y, *c, *bias, *scales, *ws;
    cudaMalloc(&x, T * 3072 * 2); cudaMalloc(&w, 3072 * 3072 * 2); cudaMalloc(&y, T * 3072 * 2); cudaMalloc(&c, T * 3072 * 2);
    cudaMalloc(&bias, 3072 * 4); cudaMalloc(&ws, ws_bytes + 4096); cudaMalloc(&scales, 1024);
    cudaMemset(x, 0, T * 3072 * 2); cudaMemset(w, 0, 3072 * 3072 * 2); cudaMemset(bias, 0, 3072 * 4);
    std::vector<float> ones(256, 1.f);  // every scale slot (A, B at +4 or +256 bytes, D at +512) is 1
    cudaMemcpy(scales, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice);
    struct Shape { int64_t k, n; };
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::printf("type shape epilogue bias fast inplace wsalign scale_gap | heuristic first_status ms TFLOP/s\n");
    for (int fp8 = 1; fp8 >= 0; --fp8)
        for (Shape s : {Shape{768, 2304}, Shape{768, 3072}, Shape{3072, 768}})
            for (int epi = 0; epi < 3; ++epi)
                for (int bf16 = 0; bf16 < 2; ++bf16)
                    for (int fast = 0; fast < 2; ++fast)
                        for (int inplace = 1; inplace >= 0; --inplace)
                            for (int wsoff = 0; wsoff < 2; ++wsoff)
                            for (int spaced = 1; spaced >= 0; --spaced)
                            for (int dfp8 = 0; dfp8 < 2; ++dfp8) {
                                if (dfp8 && (!fp8 || !spaced || !fast || !inplace)) continue;
                                if ((epi == 0 && bf16) || (!fp8 && (bf16 || fast || !inplace || wsoff || !spaced))) continue;
                                if (bf16 || wsoff || (!inplace && spaced) || (!fast && spaced && epi)) continue;  // answered already: a bf16 bias gets no algorithm, an unaligned workspace fails (status 7)
                                cublasLtMatmulDesc_t d;
                                cublasLtMatmulDescCreate_(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
                                cublasOperation_t ta = fp8 ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
                                cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
                                cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
                                cublasLtEpilogue_t ep = epi == 0 ? CUBLASLT_EPILOGUE_DEFAULT : epi == 1 ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
                                cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep));
                                if (epi) {
                                    cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
                                    cudaDataType_t bt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
                                    if (fp8) cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt));
                                }
                                if (fp8) {
                                    float* sa = static_cast<float*>(scales);
                                    float* sb = sa + (spaced ? 64 : 1);
                                    int8_t fa = static_cast<int8_t>(fast);
                                    cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
                                    cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
                                    cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa));
                                    float* sd = sa + 128;
                                    if (dfp8) cublasLtMatmulDescSetAttribute_(d, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &sd, sizeof(sd));
                                }
                                cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16F;
                                cublasLtMatrixLayout_t la, lb, ld, lc;
                                if (fp8) cublasLtMatrixLayoutCreate_(&la, in, s.k, s.n, s.k);
                                else cublasLtMatrixLayoutCreate_(&la, in, s.n, s.k, s.n);
                                cublasLtMatrixLayoutCreate_(&lb, in, s.k, T, s.k);
                                cublasLtMatrixLayoutCreate_(&ld, dfp8 ? CUDA_R_8F_E4M3 : CUDA_R_16F, s.n, T, s.n);
                                cublasLtMatrixLayoutCreate_(&lc, CUDA_R_16F, s.n, T, s.n);
                                cublasLtMatmulPreference_t pref;
                                cublasLtMatmulPreferenceCreate_(&pref);
                                cublasLtMatmulPreferenceSetAttribute_(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
                                cublasLtMatmulHeuristicResult_t r[8] = {};
                                int found = 0;
                                cublasLtMatrixLayout_t lcc = dfp8 ? lc : ld;
                                cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic_(h, d, la, lb, lcc, ld, pref, 8, r, &found);
                                float const alpha = 1.f, beta = 0.f;
                                void* cptr = inplace && !dfp8 ? y : c;
                                void* wsp = static_cast<char*>(ws) + (wsoff ? 16 : 0);
                                int status = -1;
                                float ms = 0.f;
                                if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
                                    status = cublasLtMatmul_(h, d, &alpha, w, la, x, lb, &beta, cptr, lcc, y, ld, &r[0].algo, wsp, ws_bytes, 0);
                                    if (status == 0) {
                                        cudaEventRecord(e0);
                                        for (int i = 0; i < 10; ++i) cublasLtMatmul_(h, d, &alpha, w, la, x, lb, &beta, cptr, lcc, y, ld, &r[0].algo, wsp, ws_bytes, 0);
                                        cudaEventRecord(e1);
                                        cudaEventSynchronize(e1);
                                        cudaEventElapsedTime(&ms, e0, e1);
                                        ms /= 10;
                                    }
                                }
                                cudaError_t ce = cudaDeviceSynchronize();
                                std::printf("%s %ldx%ldx%ld %s %s %d %d %d %d | %d(%d) %d %.4f %.0f %s\n", dfp8 ? "fp8->e4m3" : fp8 ? "fp8" : "fp16", (long)T, (long)s.k,
                                            (long)s.n, epi == 0 ? "none" : epi == 1 ? "bias" : "gelu_bias", epi ? (bf16 ? "bf16" : "fp16") : "-",
                                            fast, inplace, wsoff ? 16 : 256, spaced ? 256 : 4, found, static_cast<int>(hs), status, ms,
                                            ms > 0 ? 2.0 * T * s.k * s.n / (ms * 1e9) : 0.0, ce == cudaSuccess ? "" : cudaGetErrorString(ce));
                                cublasLtMatmulDescDestroy_(d);
                                cublasLtMatrixLayoutDestroy_(la); cublasLtMatrixLayoutDestroy_(lb); cublasLtMatrixLayoutDestroy_(ld);
                                cublasLtMatrixLayoutDestroy_(lc);
                            }
    return 0;
}
