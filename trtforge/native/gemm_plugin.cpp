// TrtforgeGemmGelu and TrtforgeGemm: TensorRT 8.6+ plugins (IPluginV2DynamicExt) that run y = gelu(x W + b), and
// y = x W (+ b), as one cuBLASLt matmul each, with the algorithm timed on the GPU, not guessed. TrtforgeGemmFp8 runs
// either in FP8 (e4m3 operands, fp32 accumulation, fp16 output) on GPUs with FP8 tensor cores (sm_89+).
//
// Why they exist: on the H200 the fp16 BERT-base engine (TensorRT 8.6) writes FC1's output and reads it back for the
// GELU plugin: 12 x geluBiasKernel, 0.49 of its 3.34 ms at 16x512 (benchmarks/RESULTS.md, 2026-12-03). TensorRT 8.6
// fuses no GELU into a GEMM's epilogue; cuBLASLt does (CUBLASLT_EPILOGUE_GELU_BIAS: the tanh form, the same formula
// as TensorRT's GELU plugin the pass otherwise uses). TrtforgeGemm is the same matmul without the GELU, for the
// projections TensorRT 8.6 runs with its own kernels (the attention output projection ran at ~500 TFLOP/s there, the
// FFN's second GEMM at ~720): whether cuBLASLt's timed pick beats them is measured on the H200, not assumed.
// The GEMM and the epilogues are cuBLASLt's; this file only maps TensorRT's tensors onto them and times cuBLASLt's
// own candidate algorithms (its heuristic's top kCandidates) once per problem shape in the process, outside CUDA-graph
// capture; TRTFORGE_GEMM_AUTOTUNE=0 takes the heuristic's first instead (for measuring what the timing buys).
// cuBLASLt is opened with dlopen (libcublasLt.so.13, else .so.12) and its entry points taken from that handle, so no
// same-named symbol elsewhere in the process (TensorRT 8.6's cuBLAS stand-ins on the GPU machine) can capture the calls.
//
// Contracts (the ONNX nodes trtforge.fusion.gelu / trtforge.fusion.gemm write, domain "trt.plugins", plugin_version "1"):
//   input 0  x   fp16 [..., K] (row-major, contiguous);  output 0  y  fp16 [..., N]
//   TrtforgeGemmGelu fields: weight fp16 [K*N] (row-major [K, N], as MatMul's B), bias fp16 [N], k, n (int32).
//   TrtforgeGemm     fields: weight fp16 [K*N], k, n, and optionally bias fp16 [N].
//   TrtforgeGemmFp8  fields: as TrtforgeGemm, plus gelu (int32 0/1), x_scale and w_scale (float32): y = [gelu](
//                    e4m3(x / x_scale) e4m3(W / w_scale) x_scale w_scale + b). Why: at 64x512 the GEMMs are 8.2 of
//                    BERT-base's 10.8 ms in fp16 (RESULTS.md, w34), and Hopper's FP8 tensor cores do twice fp16's FLOPs.
//                    The scales are per tensor, chosen by trtforge.fusion.fp8 from observed activations; x is converted
//                    into the workspace each enqueue (fp8_quantize.cu), W once at upload. cuBLASLt's FP8 kernels want
//                    A transposed ("TN"): the weight is kept as e4m3 [N, K]; K and N must be multiples of 16.
//                    Chained (both optional, for FC1 -> FC2): out_scale > 0 writes y as e4m3(y / out_scale) bytes in an
//                    fp16 tensor of half the width ([..., N/2] halves = [..., N] bytes; TensorRT 8.6 has no FP8 tensor
//                    type); in_fp8 1 reads x as such bytes ([..., K/2] halves), already divided by x_scale, and skips
//                    the conversion. trtforge.fusion.fp8 chains a TrtforgeGemmFp8 pair only where FC2 alone reads FC1.

#include <NvInfer.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include "plugin_common.h"
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace nvinfer1;

namespace trtforge {
cudaError_t quantize_fp8(void const* x, void* y, int64_t count, float scale, cudaStream_t stream);
cudaError_t quantize_transpose_fp8(void const* w, void* wt, int32_t k, int32_t n, float scale, cudaStream_t stream);
}  // namespace trtforge

namespace {

constexpr char const* kPluginName = "TrtforgeGemmGelu";
constexpr char const* kGemmPluginName = "TrtforgeGemm";
constexpr char const* kFp8PluginName = "TrtforgeGemmFp8";
constexpr char const* kPluginVersion = "1";
constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kCandidates = 16;  // cuBLASLt heuristic results timed per problem shape
constexpr int kTimedRuns = 5;    // after one untimed run each
constexpr size_t kScaleStride = 256;  // bytes between the FP8 scales on the device (cuBLASLt wants them aligned)
// TrtforgeGemmFp8's serialized header: k, n, has_bias, gelu, in_fp8 (int32), x_scale, w_scale, out_scale (float).
constexpr size_t kFp8Header = 5 * sizeof(int32_t) + 3 * sizeof(float);

enum class Epilogue : int32_t { kNone = 0, kBias = 1, kGeluBias = 2 };

// The FP8 form's per-tensor scales (fp8 value x scale = the real value); off: the fp16 plugins.
struct Fp8Scales {
    bool on = false;
    float x_scale = 1.f, w_scale = 1.f;
    float out_scale = 0.f;  // > 0: y written as e4m3(y / out_scale) bytes
    bool in_fp8 = false;    // x arrives as e4m3 bytes (x / x_scale)
    int32_t in_width(int32_t k) const { return in_fp8 ? k / 2 : k; }     // x's last axis, in halves
    int32_t out_width(int32_t n) const { return out_scale > 0.f ? n / 2 : n; }
};

char const* plugin_name(Epilogue e, bool fp8 = false) {
    return fp8 ? kFp8PluginName : e == Epilogue::kGeluBias ? kPluginName : kGemmPluginName;
}

size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

void log_error(char const* plugin, std::string const& what) { trtforge::log_plugin_error(plugin, what); }
void log_error(std::string const& what) { trtforge::log_plugin_error(kPluginName, what); }

// cuBLASLt's entry points, from one dlopen handle.
struct Lt {
    decltype(&cublasLtCreate) create = nullptr;
    decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
    decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
    decltype(&cublasLtMatmul) matmul = nullptr;
    cublasLtHandle_t handle = nullptr;
    bool ok = false;

    static Lt& get() {
        static Lt* lt = [] {
            auto* l = new Lt();
            l->load();
            return l;
        }();
        return *lt;
    }

    template <typename F>
    bool sym(void* lib, char const* name, F& f) {
        f = reinterpret_cast<F>(dlsym(lib, name));
        if (!f) log_error(std::string("libcublasLt has no ") + name);
        return f != nullptr;
    }

    void load() {
        void* lib = nullptr;
        for (char const* name : {"libcublasLt.so.13", "libcublasLt.so.12"}) {
            lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (lib) break;
        }
        if (!lib) {
            log_error(std::string("cannot dlopen libcublasLt.so.13 or .so.12: ") + dlerror());
            return;
        }
        ok = sym(lib, "cublasLtCreate", create) && sym(lib, "cublasLtMatmulDescCreate", desc_create) &&
             sym(lib, "cublasLtMatmulDescSetAttribute", desc_set) && sym(lib, "cublasLtMatmulDescDestroy", desc_destroy) &&
             sym(lib, "cublasLtMatrixLayoutCreate", layout_create) &&
             sym(lib, "cublasLtMatrixLayoutDestroy", layout_destroy) &&
             sym(lib, "cublasLtMatmulPreferenceCreate", pref_create) &&
             sym(lib, "cublasLtMatmulPreferenceSetAttribute", pref_set) &&
             sym(lib, "cublasLtMatmulPreferenceDestroy", pref_destroy) &&
             sym(lib, "cublasLtMatmulAlgoGetHeuristic", heuristic) && sym(lib, "cublasLtMatmul", matmul);
        if (ok && create(&handle) != CUBLAS_STATUS_SUCCESS) {
            log_error("cublasLtCreate failed");
            ok = false;
        }
    }
};

// The matmul description and algorithm for one token count (the rows of x), built once per plugin instance.
struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatrixLayout_t c = nullptr;  // only for an e4m3 D: fp16 C (D's layout serves as C otherwise)
    cublasLtMatmulAlgo_t algo{};
};

// The algorithm chosen per problem (epilogue, tokens, K, N, the x/y pointers' alignment, device), shared by every
// layer and context of the process: the twelve FC1s of BERT-base are timed once, not twelve times.
class AlgoChoices {
   public:
    static AlgoChoices& get() {
        static AlgoChoices* instance = new AlgoChoices();  // leaked on purpose: plugins may be destroyed at exit
        return *instance;
    }
    using Key = std::tuple<int32_t, int64_t, int32_t, int32_t, int32_t, int32_t>;
    bool find(Key const& key, cublasLtMatmulAlgo_t& algo) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = choices_.find(key);
        if (it == choices_.end()) return false;
        algo = it->second;
        return true;
    }
    void put(Key const& key, cublasLtMatmulAlgo_t const& algo) {
        std::lock_guard<std::mutex> lock(mutex_);
        choices_.emplace(key, algo);
    }

   private:
    std::mutex mutex_;
    std::map<Key, cublasLtMatmulAlgo_t> choices_;
};

// The largest power of two up to 256 that divides the address: what cuBLASLt may assume of it.
int32_t alignment(void const* p) {
    auto const a = reinterpret_cast<uintptr_t>(p);
    int32_t align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

bool autotune_enabled() {
    char const* v = std::getenv("TRTFORGE_GEMM_AUTOTUNE");
    return !(v && std::string(v) == "0");
}

class GemmPlugin final : public IPluginV2DynamicExt {
   public:
    GemmPlugin(Epilogue epilogue, int32_t k, int32_t n, std::vector<uint16_t> weight, std::vector<uint16_t> bias,
               Fp8Scales fp8 = {})
        : epilogue_(epilogue), k_(k), n_(n), weight_(std::move(weight)), bias_(std::move(bias)), fp8_(fp8) {}

    ~GemmPlugin() override { release(); }

    char const* getPluginType() const noexcept override { return plugin_name(epilogue_, fp8_.on); }
    char const* getPluginVersion() const noexcept override { return kPluginVersion; }
    int32_t getNbOutputs() const noexcept override { return 1; }
    int32_t initialize() noexcept override { return 0; }  // weights go to the device at the first enqueue
    void terminate() noexcept override { release(); }
    // TrtforgeGemmGelu: k, n, weight, bias (its v1 layout). TrtforgeGemm: k, n, has_bias, weight, [bias].
    // TrtforgeGemmFp8: k, n, has_bias, gelu, in_fp8, x_scale, w_scale, out_scale, weight, [bias] (kFp8Header).
    size_t header_size() const {
        return fp8_.on ? kFp8Header : (epilogue_ == Epilogue::kGeluBias ? 2 : 3) * sizeof(int32_t);
    }
    size_t getSerializationSize() const noexcept override {
        return header_size() + (weight_.size() + bias_.size()) * sizeof(uint16_t);
    }
    void serialize(void* buffer) const noexcept override {
        auto* p = static_cast<char*>(buffer);
        int32_t const has_bias = bias_.empty() ? 0 : 1, gelu = epilogue_ == Epilogue::kGeluBias ? 1 : 0;
        std::memcpy(p, &k_, sizeof(int32_t));
        std::memcpy(p + sizeof(int32_t), &n_, sizeof(int32_t));
        if (fp8_.on || epilogue_ != Epilogue::kGeluBias) std::memcpy(p + 2 * sizeof(int32_t), &has_bias, sizeof(int32_t));
        if (fp8_.on) {
            int32_t const in_fp8 = fp8_.in_fp8 ? 1 : 0;
            float const scales[3] = {fp8_.x_scale, fp8_.w_scale, fp8_.out_scale};
            std::memcpy(p + 3 * sizeof(int32_t), &gelu, sizeof(int32_t));
            std::memcpy(p + 4 * sizeof(int32_t), &in_fp8, sizeof(int32_t));
            std::memcpy(p + 5 * sizeof(int32_t), scales, sizeof(scales));
        }
        p += header_size();
        std::memcpy(p, weight_.data(), weight_.size() * sizeof(uint16_t));
        std::memcpy(p + weight_.size() * sizeof(uint16_t), bias_.data(), bias_.size() * sizeof(uint16_t));
    }
    void destroy() noexcept override { delete this; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }
    DataType getOutputDataType(int32_t, DataType const* inputTypes, int32_t) const noexcept override { return inputTypes[0]; }

    IPluginV2DynamicExt* clone() const noexcept override {
        auto* copy = new GemmPlugin(epilogue_, k_, n_, weight_, bias_, fp8_);
        copy->max_tokens_ = max_tokens_;
        copy->setPluginNamespace(namespace_.c_str());
        return copy;
    }

    DimsExprs getOutputDimensions(int32_t, DimsExprs const* inputs, int32_t, IExprBuilder& builder) noexcept override {
        DimsExprs out = inputs[0];
        out.d[out.nbDims - 1] = builder.constant(fp8_.out_width(n_));
        return out;
    }

    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* io, int32_t, int32_t) noexcept override {
        return io[pos].format == TensorFormat::kLINEAR && io[pos].type == DataType::kHALF;
    }

    // The FP8 form converts x into the workspace: it needs the profile's largest token count, which TensorRT gives here.
    void configurePlugin(DynamicPluginTensorDesc const* in, int32_t, DynamicPluginTensorDesc const*, int32_t) noexcept override {
        int64_t tokens = 1;
        for (int32_t i = 0; i < in[0].max.nbDims - 1; ++i) tokens *= std::max<int64_t>(in[0].max.d[i], 1);
        max_tokens_ = std::max(max_tokens_, tokens);
    }

    size_t getWorkspaceSize(PluginTensorDesc const* inputs, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        if (!fp8_.on || fp8_.in_fp8) return kWorkspaceBytes;
        int64_t const tokens = std::max(max_tokens_, tokens_of(inputs[0].dims));  // a dynamic (-1) axis counts as none
        return kWorkspaceBytes + round256(static_cast<size_t>(std::max<int64_t>(tokens, 1)) * k_);
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*, void const* const* inputs,
                    void* const* outputs, void* workspace, cudaStream_t stream) noexcept override {
        Lt& lt = Lt::get();
        if (!lt.ok) return 1;
        Dims const& dims = inputDesc[0].dims;
        if (dims.d[dims.nbDims - 1] != fp8_.in_width(k_)) {
            error("input's last axis is " + std::to_string(dims.d[dims.nbDims - 1]) + ", the weight's K is " + std::to_string(k_) +
                  (fp8_.in_fp8 ? " (e4m3 bytes in halves: K / 2 expected)" : ""));
            return 1;
        }
        int64_t const tokens = tokens_of(dims);
        std::lock_guard<std::mutex> lock(mutex_);
        if (!device_weight_ && !upload(stream)) return 1;
        // FP8: cuBLASLt's workspace first, x as e4m3 after it.
        void const* b = inputs[0];
        void* lt_workspace = workspace;
        if (fp8_.on) {
            if (max_tokens_ > 0 && tokens > max_tokens_) {
                error(std::to_string(tokens) + " tokens, more than the " + std::to_string(max_tokens_) +
                      " its workspace was sized for");
                return 1;
            }
            if (!fp8_.in_fp8) {
                void* xq = static_cast<char*>(workspace) + kWorkspaceBytes;
                cudaError_t ce = trtforge::quantize_fp8(inputs[0], xq, tokens * k_, fp8_.x_scale, stream);
                if (ce != cudaSuccess) {
                    error(std::string("converting the input to FP8 failed: ") + cudaGetErrorString(ce));
                    return 1;
                }
                b = xq;
            }
        }
        // TensorRT's buffers are usually 256-byte aligned; one that is not (a slice of a concatenation) gets its own plan.
        int32_t const align = std::min(alignment(b), alignment(outputs[0]));
        Plan* plan = plan_for(tokens, align, b, outputs[0], lt_workspace, stream);
        if (!plan) return 1;
        auto st = matmul(*plan, plan->algo, b, outputs[0], lt_workspace, stream);
        if (st != CUBLAS_STATUS_SUCCESS) {
            error("cublasLtMatmul failed with status " + std::to_string(static_cast<int>(st)));
            return 1;
        }
        return 0;
    }

   private:
    void error(std::string const& what) const { log_error(plugin_name(epilogue_, fp8_.on), what); }

    static int64_t tokens_of(Dims const& dims) {
        int64_t tokens = 1;
        for (int32_t i = 0; i < dims.nbDims - 1; ++i) tokens *= dims.d[i];
        return tokens;
    }

    // Column-major view: D[N, T] = W[N, K] (row-major [K, N]) x X[K, T] (row-major [T, K]) (+ bias per row, GELU).
    // FP8: A is the e4m3 weight [N, K] read transposed, B the e4m3 x; their scales multiply the product. An e4m3 D gets
    // a C of its own (fp16, never read: beta is 0), as cuBLASLt takes neither null nor D there (torch's scaled_gemm).
    cublasStatus_t matmul(Plan const& p, cublasLtMatmulAlgo_t const& algo, void const* x, void* y, void* workspace,
                          cudaStream_t stream) const {
        float const alpha = 1.f, beta = 0.f;
        void* c = p.c ? device_dummy_c_ : y;
        return Lt::get().matmul(Lt::get().handle, p.desc, &alpha, device_weight_, p.a, x, p.b, &beta, c, p.c ? p.c : p.d, y,
                                p.d, &algo, workspace, kWorkspaceBytes, stream);
    }

    // Device memory: the weight (fp16 [K, N], or e4m3 [N, K]), the bias, x_scale and w_scale, each 256-byte aligned:
    // cuBLASLt refuses an FP8 matmul (CUBLAS_STATUS_NOT_SUPPORTED, after its heuristic offered the algorithms) whose B
    // scale sits 4 bytes after the A scale (benchmarks/gpu/fp8_probe.cu on the H100, RESULTS.md 2026-12-06).
    bool upload(cudaStream_t stream) {
        if (trtforge::capturing(stream)) {
            error("first enqueue under CUDA-graph capture; enqueue once plainly first");
            return false;
        }
        size_t const half_bytes = weight_.size() * sizeof(uint16_t), bbytes = bias_.size() * sizeof(uint16_t);
        size_t const wbytes = fp8_.on ? weight_.size() : half_bytes;
        size_t const bias_at = round256(wbytes), scales_at = round256(bias_at + bbytes);
        if (cudaMalloc(&device_weight_, scales_at + 4 * kScaleStride) != cudaSuccess) {
            error("cudaMalloc of the weight failed");
            device_weight_ = nullptr;
            return false;
        }
        device_bias_ = bias_.empty() ? nullptr : static_cast<char*>(device_weight_) + bias_at;
        device_scales_ = reinterpret_cast<float*>(static_cast<char*>(device_weight_) + scales_at);
        char* const scales = reinterpret_cast<char*>(device_scales_);
        device_dummy_c_ = scales + 3 * kScaleStride;  // an e4m3 D's C: 256 bytes, never read (beta is 0)
        float const inv_out = fp8_.out_scale > 0.f ? 1.f / fp8_.out_scale : 1.f;
        void* staging = nullptr;  // the fp16 weight on the GPU, converted to e4m3 [N, K] there
        bool ok = !fp8_.on || cudaMalloc(&staging, half_bytes) == cudaSuccess;
        // On the enqueue's stream, so the matmul after it waits for the copies; synchronized, as the host
        // vectors are pageable and the copies must be done before this returns.
        ok = ok &&
             cudaMemcpyAsync(fp8_.on ? staging : device_weight_, weight_.data(), half_bytes, cudaMemcpyHostToDevice, stream) ==
                 cudaSuccess &&
             (!fp8_.on || trtforge::quantize_transpose_fp8(staging, device_weight_, k_, n_, fp8_.w_scale, stream) == cudaSuccess) &&
             (!device_bias_ ||
              cudaMemcpyAsync(device_bias_, bias_.data(), bbytes, cudaMemcpyHostToDevice, stream) == cudaSuccess) &&
             cudaMemcpyAsync(scales, &fp8_.x_scale, sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess &&
             cudaMemcpyAsync(scales + kScaleStride, &fp8_.w_scale, sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess &&
             cudaMemcpyAsync(scales + 2 * kScaleStride, &inv_out, sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess &&
             cudaStreamSynchronize(stream) == cudaSuccess;
        if (staging) cudaFree(staging);
        if (!ok) {
            error("copying the weight to the GPU failed");
            release();
            return false;
        }
        return true;
    }

    std::string problem(int64_t tokens) const {
        return std::to_string(tokens) + "x" + std::to_string(k_) + " x " + std::to_string(k_) + "x" + std::to_string(n_) +
               (fp8_.on ? " (fp8)" : "");
    }

    Plan* plan_for(int64_t tokens, int32_t align, void const* x, void* y, void* workspace, cudaStream_t stream) {
        auto it = plans_.find({tokens, align});
        if (it != plans_.end()) return &it->second;
        if (trtforge::capturing(stream)) {
            error("token count " + std::to_string(tokens) + " first seen under CUDA-graph capture");
            return nullptr;
        }
        Lt& lt = Lt::get();
        Plan p;
        cublasOperation_t const op_n = CUBLAS_OP_N, op_a = fp8_.on ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasLtEpilogue_t const epilogue = epilogue_ == Epilogue::kGeluBias ? CUBLASLT_EPILOGUE_GELU_BIAS
                                            : device_bias_                 ? CUBLASLT_EPILOGUE_BIAS
                                                                           : CUBLASLT_EPILOGUE_DEFAULT;
        cudaDataType_t const in_type = fp8_.on ? CUDA_R_8F_E4M3 : CUDA_R_16F, bias_type = CUDA_R_16F;
        int8_t const fast_accum = 1;  // FP8: no periodic promotion of the partial sums (what TransformerEngine's forward uses)
        float const* x_scale = device_scales_;
        float const* w_scale = reinterpret_cast<float const*>(reinterpret_cast<char const*>(device_scales_) + kScaleStride);
        float const* d_scale = reinterpret_cast<float const*>(reinterpret_cast<char const*>(device_scales_) + 2 * kScaleStride);
        bool const out_fp8 = fp8_.out_scale > 0.f;
        bool ok = lt.desc_create(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
                  lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)) == CUBLAS_STATUS_SUCCESS &&
                  lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)) == CUBLAS_STATUS_SUCCESS &&
                  lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS &&
                  (!device_bias_ || lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &device_bias_,
                                                sizeof(device_bias_)) == CUBLAS_STATUS_SUCCESS) &&
                  (!fp8_.on ||
                   (lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)) == CUBLAS_STATUS_SUCCESS &&
                    lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)) == CUBLAS_STATUS_SUCCESS &&
                    lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)) == CUBLAS_STATUS_SUCCESS &&
                    (!device_bias_ || lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)) ==
                                          CUBLAS_STATUS_SUCCESS) &&
                    (!out_fp8 || (lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &d_scale, sizeof(d_scale)) ==
                                      CUBLAS_STATUS_SUCCESS &&
                                  lt.layout_create(&p.c, CUDA_R_16F, n_, tokens, n_) == CUBLAS_STATUS_SUCCESS)))) &&
                  // A: the weight, [K, N] row-major = column-major N x K (fp16), or e4m3 [N, K] = column-major K x N, transposed
                  (fp8_.on ? lt.layout_create(&p.a, in_type, k_, n_, k_) : lt.layout_create(&p.a, in_type, n_, k_, n_)) ==
                      CUBLAS_STATUS_SUCCESS &&
                  lt.layout_create(&p.b, in_type, k_, tokens, k_) == CUBLAS_STATUS_SUCCESS &&
                  lt.layout_create(&p.d, out_fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16F, n_, tokens, n_) == CUBLAS_STATUS_SUCCESS;
        int device = 0;
        cudaGetDevice(&device);
        int32_t const form = fp8_.on ? 1000 + (out_fp8 ? 100 : 0) : 0;  // fp16, fp8, fp8 with an e4m3 D
        AlgoChoices::Key const key{static_cast<int32_t>(epilogue) + form, tokens, k_, n_, align, device};
        ok = ok && (AlgoChoices::get().find(key, p.algo) || choose(p, key, tokens, align, x, y, workspace, stream));
        if (!ok) {
            error("no cuBLASLt algorithm for " + problem(tokens) +
                  (fp8_.on ? " (FP8 needs compute capability 8.9 or newer and a cuBLASLt with FP8 kernels)" : ""));
            destroy_plan(p);
            return nullptr;
        }
        return &plans_.emplace(std::make_pair(tokens, align), p).first->second;
    }

    // cuBLASLt's heuristic candidates for this problem, each timed on the enqueue's stream (into y, which the real
    // matmul overwrites next), the fastest kept for the process; the heuristic's first where timing is off.
    bool choose(Plan& p, AlgoChoices::Key const& key, int64_t tokens, int32_t align, void const* x, void* y, void* workspace,
                cudaStream_t stream) {
        Lt& lt = Lt::get();
        cublasLtMatmulPreference_t pref = nullptr;
        cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
        int found = 0;
        size_t const ws = kWorkspaceBytes;
        uint32_t const weight_align = 256, io_align = static_cast<uint32_t>(align);  // A: the weight; B: x; C, D: y
        bool ok = lt.pref_create(&pref) == CUBLAS_STATUS_SUCCESS &&
                  lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS &&
                  lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &weight_align, sizeof(weight_align)) ==
                      CUBLAS_STATUS_SUCCESS &&
                  lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &io_align, sizeof(io_align)) == CUBLAS_STATUS_SUCCESS &&
                  lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &io_align, sizeof(io_align)) == CUBLAS_STATUS_SUCCESS &&
                  lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &io_align, sizeof(io_align)) == CUBLAS_STATUS_SUCCESS &&
                  lt.heuristic(lt.handle, p.desc, p.a, p.b, p.c ? p.c : p.d, p.d, pref, kCandidates, results, &found) ==
                      CUBLAS_STATUS_SUCCESS &&
                  found > 0;
        if (pref) lt.pref_destroy(pref);
        if (!ok) return false;
        int best = 0;
        if (autotune_enabled() && found > 1) {
            cudaEvent_t start = nullptr, stop = nullptr;
            if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
                error("cudaEventCreate failed; taking cuBLASLt's first algorithm untimed");
            } else {
                float best_ms = std::numeric_limits<float>::infinity(), first_ms = -1.f;
                best = -1;
                std::string failure;  // the first candidate's failure, for the error when none runs
                for (int i = 0; i < found; ++i) {
                    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
                    cublasStatus_t st = matmul(p, results[i].algo, x, y, workspace, stream);
                    cudaError_t ce = st == CUBLAS_STATUS_SUCCESS ? cudaEventRecord(start, stream) : cudaSuccess;
                    for (int r = 0; st == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess && r < kTimedRuns; ++r)
                        st = matmul(p, results[i].algo, x, y, workspace, stream);
                    float ms = 0.f;
                    if (st == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess) ce = cudaEventRecord(stop, stream);
                    if (st == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess) ce = cudaEventSynchronize(stop);
                    if (st == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, start, stop);
                    if (st != CUBLAS_STATUS_SUCCESS || ce != cudaSuccess) {
                        if (failure.empty())
                            failure = st != CUBLAS_STATUS_SUCCESS ? "cublasLtMatmul status " + std::to_string(static_cast<int>(st))
                                                                  : std::string(cudaGetErrorString(ce));
                        cudaStreamSynchronize(stream);
                        continue;
                    }
                    ms /= kTimedRuns;
                    if (i == 0) first_ms = ms;
                    if (ms < best_ms) best_ms = ms, best = i;
                }
                cudaGetLastError();  // a candidate that failed to launch leaves nothing for later calls to trip on
                if (best >= 0) {
                    char line[256];
                    if (first_ms >= 0.f)
                        std::snprintf(line, sizeof(line), "note: %s: cuBLASLt algorithm %d of %d timed, %.4f ms (heuristic's first %.4f ms)",
                                      problem(tokens).c_str(), best + 1, found, best_ms, first_ms);
                    else
                        std::snprintf(line, sizeof(line), "note: %s: cuBLASLt algorithm %d of %d timed, %.4f ms (the heuristic's first did not run)",
                                      problem(tokens).c_str(), best + 1, found, best_ms);
                    error(line);
                } else {
                    error("no cuBLASLt candidate ran for " + problem(tokens) + " (" + std::to_string(found) + " candidates; the first failed: " +
                          failure + ")");
                }
            }
            if (start) cudaEventDestroy(start);
            if (stop) cudaEventDestroy(stop);
            if (best < 0) return false;
        }
        p.algo = results[best].algo;
        AlgoChoices::get().put(key, p.algo);
        return true;
    }

    static void destroy_plan(Plan& p) {
        Lt& lt = Lt::get();
        if (!lt.ok) return;
        if (p.desc) lt.desc_destroy(p.desc);
        for (auto* l : {p.a, p.b, p.c, p.d})
            if (l) lt.layout_destroy(l);
        p = Plan{};
    }

    void release() {
        for (auto& kv : plans_) destroy_plan(kv.second);
        plans_.clear();
        if (device_weight_) cudaFree(device_weight_);
        device_weight_ = nullptr;
        device_bias_ = nullptr;
        device_scales_ = nullptr;
        device_dummy_c_ = nullptr;
    }

    Epilogue epilogue_;
    int32_t k_, n_;
    std::vector<uint16_t> weight_, bias_;
    Fp8Scales fp8_;
    int64_t max_tokens_ = 0;  // the largest token count configurePlugin was given (0: not told)
    void* device_weight_ = nullptr;
    void* device_bias_ = nullptr;
    float* device_scales_ = nullptr;  // x_scale, w_scale, 1 / out_scale, kScaleStride bytes apart
    void* device_dummy_c_ = nullptr;  // after them: an e4m3 D's C
    std::map<std::pair<int64_t, int32_t>, Plan> plans_;  // by (tokens, alignment of x and y)
    std::mutex mutex_;
    std::string namespace_;
};

// The fields the creators read; TrtforgeGemmGelu needs the bias, TrtforgeGemm and TrtforgeGemmFp8 take it where given.
struct GemmFields {
    int32_t k = 0, n = 0, gelu = 0, in_fp8 = 0;
    float x_scale = 0.f, w_scale = 0.f, out_scale = 0.f;
    std::vector<uint16_t> weight, bias;
    bool has_bias = false;

    static GemmFields read(PluginFieldCollection const* fc) {
        GemmFields g;
        for (int32_t i = 0; i < fc->nbFields; ++i) {
            PluginField const& f = fc->fields[i];
            std::string const name = f.name;
            auto const* half = static_cast<uint16_t const*>(f.data);
            if (name == "k" && f.type == PluginFieldType::kINT32) g.k = *static_cast<int32_t const*>(f.data);
            else if (name == "n" && f.type == PluginFieldType::kINT32) g.n = *static_cast<int32_t const*>(f.data);
            else if (name == "gelu" && f.type == PluginFieldType::kINT32) g.gelu = *static_cast<int32_t const*>(f.data);
            else if (name == "x_scale" && f.type == PluginFieldType::kFLOAT32) g.x_scale = *static_cast<float const*>(f.data);
            else if (name == "w_scale" && f.type == PluginFieldType::kFLOAT32) g.w_scale = *static_cast<float const*>(f.data);
            else if (name == "out_scale" && f.type == PluginFieldType::kFLOAT32) g.out_scale = *static_cast<float const*>(f.data);
            else if (name == "in_fp8" && f.type == PluginFieldType::kINT32) g.in_fp8 = *static_cast<int32_t const*>(f.data);
            else if (name == "weight" && f.type == PluginFieldType::kFLOAT16) g.weight.assign(half, half + f.length);
            else if (name == "bias" && f.type == PluginFieldType::kFLOAT16) g.bias.assign(half, half + f.length), g.has_bias = true;
        }
        return g;
    }

    bool valid(bool bias_required) const {
        return k > 0 && n > 0 && weight.size() == static_cast<size_t>(k) * n &&
               (has_bias ? bias.size() == static_cast<size_t>(n) : !bias_required);
    }
};

// FP8 scales must be positive and finite (out_scale: 0 for an fp16 y); K and N multiples of 16 (cuBLASLt's FP8 kernels);
// GELU comes with a bias; in_fp8 is 0 or 1.
std::string fp8_problem(int32_t k, int32_t n, int32_t gelu, bool has_bias, float x_scale, float w_scale, float out_scale,
                        int32_t in_fp8) {
    if (!(out_scale >= 0.f && out_scale < std::numeric_limits<float>::infinity()))
        return "out_scale " + std::to_string(out_scale) + " must be 0 (fp16 output) or positive and finite";
    if (in_fp8 != 0 && in_fp8 != 1) return "in_fp8 must be 0 or 1";
    if (!(x_scale > 0.f && x_scale < std::numeric_limits<float>::infinity()) ||
        !(w_scale > 0.f && w_scale < std::numeric_limits<float>::infinity()))
        return "x_scale " + std::to_string(x_scale) + " and w_scale " + std::to_string(w_scale) + " must be positive and finite";
    if (k % 16 != 0 || n % 16 != 0) return "k " + std::to_string(k) + " and n " + std::to_string(n) + " must be multiples of 16";
    if (gelu != 0 && gelu != 1) return "gelu must be 0 or 1";
    if (gelu == 1 && !has_bias) return "gelu needs a bias";
    return "";
}

class GemmCreator : public trtforge::CreatorBase {
   public:
    explicit GemmCreator(Epilogue epilogue)
        : CreatorBase(plugin_name(epilogue), kPluginVersion,
                      {PluginField("weight", nullptr, PluginFieldType::kFLOAT16, 0),
                       PluginField("bias", nullptr, PluginFieldType::kFLOAT16, 0),
                       PluginField("k", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("n", nullptr, PluginFieldType::kINT32, 1)}),
          epilogue_(epilogue) {}

    IPluginV2* createPlugin(char const*, PluginFieldCollection const* fc) noexcept override {
        GemmFields g = GemmFields::read(fc);
        if (!g.valid(epilogue_ == Epilogue::kGeluBias)) {
            log_error(plugin_name(epilogue_), "fields k " + std::to_string(g.k) + ", n " + std::to_string(g.n) + ", weight " +
                                                  std::to_string(g.weight.size()) + " and bias " + std::to_string(g.bias.size()) +
                                                  " (fp16 values) do not agree");
            return nullptr;
        }
        Epilogue const e = epilogue_ == Epilogue::kGeluBias ? epilogue_ : g.has_bias ? Epilogue::kBias : Epilogue::kNone;
        return named(new GemmPlugin(e, g.k, g.n, std::move(g.weight), std::move(g.bias)));
    }

    IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        auto const* p = static_cast<char const*>(data);
        bool const gelu = epilogue_ == Epilogue::kGeluBias;
        size_t const header = (gelu ? 2 : 3) * sizeof(int32_t);
        int32_t k = 0, n = 0, has_bias = 1;
        if (length < header) {
            log_error(plugin_name(epilogue_), "serialized plugin data has " + std::to_string(length) + " bytes, too few for its header");
            return nullptr;
        }
        std::memcpy(&k, p, sizeof(int32_t));
        std::memcpy(&n, p + sizeof(int32_t), sizeof(int32_t));
        if (!gelu) std::memcpy(&has_bias, p + 2 * sizeof(int32_t), sizeof(int32_t));
        size_t const bias_values = has_bias ? static_cast<size_t>(n) : 0;
        size_t const want = header + (static_cast<size_t>(k) * n + bias_values) * sizeof(uint16_t);
        if (k <= 0 || n <= 0 || (has_bias != 0 && has_bias != 1) || length != want) {
            log_error(plugin_name(epilogue_), "serialized plugin data has " + std::to_string(length) + " bytes, expected " +
                                                  std::to_string(want));
            return nullptr;
        }
        auto const* w = reinterpret_cast<uint16_t const*>(p + header);
        size_t const kn = static_cast<size_t>(k) * n;
        std::vector<uint16_t> weight(w, w + kn), bias(w + kn, w + kn + bias_values);
        Epilogue const e = gelu ? epilogue_ : has_bias ? Epilogue::kBias : Epilogue::kNone;
        return named(new GemmPlugin(e, k, n, std::move(weight), std::move(bias)));
    }

   private:
    Epilogue epilogue_;
};

class GemmGeluPluginCreator final : public GemmCreator {
   public:
    GemmGeluPluginCreator() : GemmCreator(Epilogue::kGeluBias) {}
};

class GemmPluginCreator final : public GemmCreator {
   public:
    GemmPluginCreator() : GemmCreator(Epilogue::kBias) {}  // kBias or kNone per node, by whether it has a bias
};

class GemmFp8PluginCreator final : public trtforge::CreatorBase {
   public:
    GemmFp8PluginCreator()
        : CreatorBase(kFp8PluginName, kPluginVersion,
                      {PluginField("weight", nullptr, PluginFieldType::kFLOAT16, 0),
                       PluginField("bias", nullptr, PluginFieldType::kFLOAT16, 0),
                       PluginField("k", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("n", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("gelu", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("x_scale", nullptr, PluginFieldType::kFLOAT32, 1),
                       PluginField("w_scale", nullptr, PluginFieldType::kFLOAT32, 1),
                       PluginField("out_scale", nullptr, PluginFieldType::kFLOAT32, 1),
                       PluginField("in_fp8", nullptr, PluginFieldType::kINT32, 1)}) {}

    IPluginV2* createPlugin(char const*, PluginFieldCollection const* fc) noexcept override {
        GemmFields g = GemmFields::read(fc);
        std::string why = g.valid(false) ? fp8_problem(g.k, g.n, g.gelu, g.has_bias, g.x_scale, g.w_scale, g.out_scale, g.in_fp8)
                                         : "fields k " + std::to_string(g.k) + ", n " + std::to_string(g.n) + ", weight " +
                                               std::to_string(g.weight.size()) + " and bias " + std::to_string(g.bias.size()) +
                                               " (fp16 values) do not agree";
        if (!why.empty()) {
            log_error(kFp8PluginName, why);
            return nullptr;
        }
        return make(g.k, g.n, g.gelu, std::move(g.weight), std::move(g.bias), Fp8Scales{true, g.x_scale, g.w_scale, g.out_scale, g.in_fp8 == 1});
    }

    IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        auto const* p = static_cast<char const*>(data);
        size_t const header = kFp8Header;
        int32_t v[5] = {};
        float scales[3] = {};
        if (length < header) {
            log_error(kFp8PluginName, "serialized plugin data has " + std::to_string(length) + " bytes, too few for its header");
            return nullptr;
        }
        std::memcpy(v, p, sizeof(v));
        std::memcpy(scales, p + sizeof(v), sizeof(scales));
        int32_t const k = v[0], n = v[1], has_bias = v[2], gelu = v[3], in_fp8 = v[4];
        size_t const bias_values = has_bias == 1 ? static_cast<size_t>(n) : 0;
        size_t const want = header + (static_cast<size_t>(std::max(k, 0)) * std::max(n, 0) + bias_values) * sizeof(uint16_t);
        std::string why = k <= 0 || n <= 0 || (has_bias != 0 && has_bias != 1) || length != want
                              ? "serialized plugin data has " + std::to_string(length) + " bytes, expected " + std::to_string(want)
                              : fp8_problem(k, n, gelu, has_bias == 1, scales[0], scales[1], scales[2], in_fp8);
        if (!why.empty()) {
            log_error(kFp8PluginName, why);
            return nullptr;
        }
        auto const* w = reinterpret_cast<uint16_t const*>(p + header);
        size_t const kn = static_cast<size_t>(k) * n;
        return make(k, n, gelu, std::vector<uint16_t>(w, w + kn), std::vector<uint16_t>(w + kn, w + kn + bias_values),
                    Fp8Scales{true, scales[0], scales[1], scales[2], in_fp8 == 1});
    }

   private:
    IPluginV2* make(int32_t k, int32_t n, int32_t gelu, std::vector<uint16_t> weight, std::vector<uint16_t> bias,
                    Fp8Scales scales) const {
        Epilogue const e = gelu ? Epilogue::kGeluBias : bias.empty() ? Epilogue::kNone : Epilogue::kBias;
        return named(new GemmPlugin(e, k, n, std::move(weight), std::move(bias), scales));
    }
};

}  // namespace

REGISTER_TENSORRT_PLUGIN(GemmGeluPluginCreator);
REGISTER_TENSORRT_PLUGIN(GemmPluginCreator);
REGISTER_TENSORRT_PLUGIN(GemmFp8PluginCreator);
