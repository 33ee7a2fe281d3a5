// TrtforgeGemmGelu: a TensorRT 8.6+ plugin (IPluginV2DynamicExt) that runs y = gelu(x W + b) as one cuBLASLt matmul
// with its GELU_BIAS epilogue.
//
// Why it exists: on the H200 the fp16 BERT-base engine (TensorRT 8.6) writes FC1's output and reads it back for the
// GELU plugin: 12 x geluBiasKernel, 0.49 of its 3.34 ms at 16x512 (benchmarks/RESULTS.md, 2026-12-03). TensorRT 8.6
// fuses no GELU into a GEMM's epilogue; cuBLASLt does (CUBLASLT_EPILOGUE_GELU_BIAS: the tanh form, the same formula
// as TensorRT's GELU plugin the pass otherwise uses). The GEMM and the epilogue are cuBLASLt's; this file only maps
// TensorRT's tensors onto them. cuBLASLt is opened with dlopen (libcublasLt.so.13, else .so.12) and its entry points
// taken from that handle, so no same-named symbol elsewhere in the process (TensorRT 8.6's cuBLAS stand-ins on the
// GPU machine) can capture the calls.
//
// Contract (the ONNX node trtforge.fusion.gelu writes, domain "trt.plugins", plugin_version "1"):
//   input 0  x   fp16 [..., K] (row-major, contiguous);  output 0  y  fp16 [..., N]
//   fields:  weight fp16 [K*N] (row-major [K, N], as MatMul's B), bias fp16 [N], k, n (int32).

#include <NvInfer.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include "plugin_common.h"
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

constexpr char const* kPluginName = "TrtforgeGemmGelu";
constexpr char const* kPluginVersion = "1";
constexpr size_t kWorkspaceBytes = 32u << 20;

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

// The matmul description and algorithm for one token count (the rows of x), built once.
struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

class GemmGeluPlugin final : public IPluginV2DynamicExt {
   public:
    GemmGeluPlugin(int32_t k, int32_t n, std::vector<uint16_t> weight, std::vector<uint16_t> bias)
        : k_(k), n_(n), weight_(std::move(weight)), bias_(std::move(bias)) {}

    ~GemmGeluPlugin() override { release(); }

    char const* getPluginType() const noexcept override { return kPluginName; }
    char const* getPluginVersion() const noexcept override { return kPluginVersion; }
    int32_t getNbOutputs() const noexcept override { return 1; }
    int32_t initialize() noexcept override { return 0; }  // weights go to the device at the first enqueue
    void terminate() noexcept override { release(); }
    size_t getSerializationSize() const noexcept override {
        return 2 * sizeof(int32_t) + (weight_.size() + bias_.size()) * sizeof(uint16_t);
    }
    void serialize(void* buffer) const noexcept override {
        auto* p = static_cast<char*>(buffer);
        std::memcpy(p, &k_, sizeof(int32_t));
        std::memcpy(p + sizeof(int32_t), &n_, sizeof(int32_t));
        p += 2 * sizeof(int32_t);
        std::memcpy(p, weight_.data(), weight_.size() * sizeof(uint16_t));
        std::memcpy(p + weight_.size() * sizeof(uint16_t), bias_.data(), bias_.size() * sizeof(uint16_t));
    }
    void destroy() noexcept override { delete this; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }
    DataType getOutputDataType(int32_t, DataType const* inputTypes, int32_t) const noexcept override { return inputTypes[0]; }

    IPluginV2DynamicExt* clone() const noexcept override {
        auto* copy = new GemmGeluPlugin(k_, n_, weight_, bias_);
        copy->setPluginNamespace(namespace_.c_str());
        return copy;
    }

    DimsExprs getOutputDimensions(int32_t, DimsExprs const* inputs, int32_t, IExprBuilder& builder) noexcept override {
        DimsExprs out = inputs[0];
        out.d[out.nbDims - 1] = builder.constant(n_);
        return out;
    }

    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* io, int32_t, int32_t) noexcept override {
        return io[pos].format == TensorFormat::kLINEAR && io[pos].type == DataType::kHALF;
    }

    void configurePlugin(DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*, int32_t) noexcept override {}

    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        return kWorkspaceBytes;
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*, void const* const* inputs,
                    void* const* outputs, void* workspace, cudaStream_t stream) noexcept override {
        Lt& lt = Lt::get();
        if (!lt.ok) return 1;
        Dims const& dims = inputDesc[0].dims;
        if (dims.d[dims.nbDims - 1] != k_) {
            log_error("input's last axis is " + std::to_string(dims.d[dims.nbDims - 1]) + ", the weight's K is " + std::to_string(k_));
            return 1;
        }
        int64_t tokens = 1;
        for (int32_t i = 0; i < dims.nbDims - 1; ++i) tokens *= dims.d[i];
        std::lock_guard<std::mutex> lock(mutex_);
        if (!device_weight_ && !upload(stream)) return 1;
        Plan* plan = plan_for(tokens, stream);
        if (!plan) return 1;
        float const alpha = 1.f, beta = 0.f;
        // Column-major view: D[N, T] = W[N, K] (row-major [K, N]) x X[K, T] (row-major [T, K]), + bias per row, GELU.
        auto st = lt.matmul(lt.handle, plan->desc, &alpha, device_weight_, plan->a, inputs[0], plan->b, &beta, outputs[0],
                            plan->d, outputs[0], plan->d, &plan->algo, workspace, kWorkspaceBytes, stream);
        if (st != CUBLAS_STATUS_SUCCESS) {
            log_error("cublasLtMatmul failed with status " + std::to_string(static_cast<int>(st)));
            return 1;
        }
        return 0;
    }

   private:
    static bool capturing(cudaStream_t stream) {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(stream, &status);
        return status != cudaStreamCaptureStatusNone;
    }

    bool upload(cudaStream_t stream) {
        if (capturing(stream)) {
            log_error("first enqueue under CUDA-graph capture; enqueue once plainly first");
            return false;
        }
        size_t const wbytes = weight_.size() * sizeof(uint16_t), bbytes = bias_.size() * sizeof(uint16_t);
        size_t const offset = (wbytes + 255) / 256 * 256;  // the bias 256-byte aligned, whatever K x N is
        if (cudaMalloc(&device_weight_, offset + bbytes) != cudaSuccess) {
            log_error("cudaMalloc of the weight failed");
            device_weight_ = nullptr;
            return false;
        }
        device_bias_ = static_cast<char*>(device_weight_) + offset;
        // On the enqueue's stream, so the matmul after it waits for the copies; synchronized, as the host
        // vectors are pageable and the copies must be done before this returns.
        bool ok = cudaMemcpyAsync(device_weight_, weight_.data(), wbytes, cudaMemcpyHostToDevice, stream) == cudaSuccess &&
                  cudaMemcpyAsync(device_bias_, bias_.data(), bbytes, cudaMemcpyHostToDevice, stream) == cudaSuccess &&
                  cudaStreamSynchronize(stream) == cudaSuccess;
        if (!ok) {
            log_error("copying the weight to the GPU failed");
            release();
            return false;
        }
        return true;
    }

    Plan* plan_for(int64_t tokens, cudaStream_t stream) {
        auto it = plans_.find(tokens);
        if (it != plans_.end()) return &it->second;
        if (capturing(stream)) {
            log_error("token count " + std::to_string(tokens) + " first seen under CUDA-graph capture");
            return nullptr;
        }
        Lt& lt = Lt::get();
        Plan p;
        cublasOperation_t const op = CUBLAS_OP_N;
        cublasLtEpilogue_t const epilogue = CUBLASLT_EPILOGUE_GELU_BIAS;
        bool ok = lt.desc_create(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
                  lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)) == CUBLAS_STATUS_SUCCESS &&
                  lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof(op)) == CUBLAS_STATUS_SUCCESS &&
                  lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS &&
                  lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &device_bias_, sizeof(device_bias_)) == CUBLAS_STATUS_SUCCESS &&
                  lt.layout_create(&p.a, CUDA_R_16F, n_, k_, n_) == CUBLAS_STATUS_SUCCESS &&
                  lt.layout_create(&p.b, CUDA_R_16F, k_, tokens, k_) == CUBLAS_STATUS_SUCCESS &&
                  lt.layout_create(&p.d, CUDA_R_16F, n_, tokens, n_) == CUBLAS_STATUS_SUCCESS;
        cublasLtMatmulPreference_t pref = nullptr;
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        size_t const ws = kWorkspaceBytes;
        ok = ok && lt.pref_create(&pref) == CUBLAS_STATUS_SUCCESS &&
             lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS &&
             lt.heuristic(lt.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found) == CUBLAS_STATUS_SUCCESS &&
             found > 0;
        if (pref) lt.pref_destroy(pref);
        if (!ok) {
            log_error("no cuBLASLt GELU_BIAS algorithm for " + std::to_string(tokens) + "x" + std::to_string(k_) + " x " +
                      std::to_string(k_) + "x" + std::to_string(n_));
            destroy_plan(p);
            return nullptr;
        }
        p.algo = result.algo;
        return &plans_.emplace(tokens, p).first->second;
    }

    static void destroy_plan(Plan& p) {
        Lt& lt = Lt::get();
        if (!lt.ok) return;
        if (p.desc) lt.desc_destroy(p.desc);
        for (auto* l : {p.a, p.b, p.d})
            if (l) lt.layout_destroy(l);
        p = Plan{};
    }

    void release() {
        for (auto& kv : plans_) destroy_plan(kv.second);
        plans_.clear();
        if (device_weight_) cudaFree(device_weight_);
        device_weight_ = nullptr;
        device_bias_ = nullptr;
    }

    int32_t k_, n_;
    std::vector<uint16_t> weight_, bias_;
    void* device_weight_ = nullptr;
    void* device_bias_ = nullptr;
    std::map<int64_t, Plan> plans_;
    std::mutex mutex_;
    std::string namespace_;
};

class GemmGeluPluginCreator final : public trtforge::CreatorBase {
   public:
    GemmGeluPluginCreator()
        : CreatorBase(kPluginName, kPluginVersion,
                      {PluginField("weight", nullptr, PluginFieldType::kFLOAT16, 0),
                       PluginField("bias", nullptr, PluginFieldType::kFLOAT16, 0),
                       PluginField("k", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("n", nullptr, PluginFieldType::kINT32, 1)}) {}

    IPluginV2* createPlugin(char const*, PluginFieldCollection const* fc) noexcept override {
        int32_t k = 0, n = 0;
        std::vector<uint16_t> weight, bias;
        for (int32_t i = 0; i < fc->nbFields; ++i) {
            PluginField const& f = fc->fields[i];
            std::string const name = f.name;
            auto const* half = static_cast<uint16_t const*>(f.data);
            if (name == "k" && f.type == PluginFieldType::kINT32) k = *static_cast<int32_t const*>(f.data);
            else if (name == "n" && f.type == PluginFieldType::kINT32) n = *static_cast<int32_t const*>(f.data);
            else if (name == "weight" && f.type == PluginFieldType::kFLOAT16) weight.assign(half, half + f.length);
            else if (name == "bias" && f.type == PluginFieldType::kFLOAT16) bias.assign(half, half + f.length);
        }
        if (k <= 0 || n <= 0 || weight.size() != static_cast<size_t>(k) * n || bias.size() != static_cast<size_t>(n)) {
            log_error("fields k " + std::to_string(k) + ", n " + std::to_string(n) + ", weight " + std::to_string(weight.size()) +
                      " and bias " + std::to_string(bias.size()) + " (fp16 values) do not agree");
            return nullptr;
        }
        return named(new GemmGeluPlugin(k, n, std::move(weight), std::move(bias)));
    }

    IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        auto const* p = static_cast<char const*>(data);
        int32_t k = 0, n = 0;
        if (length < 2 * sizeof(int32_t)) {
            log_error("serialized plugin data has " + std::to_string(length) + " bytes, too few for its header");
            return nullptr;
        }
        std::memcpy(&k, p, sizeof(int32_t));
        std::memcpy(&n, p + sizeof(int32_t), sizeof(int32_t));
        size_t const want = 2 * sizeof(int32_t) + (static_cast<size_t>(k) * n + n) * sizeof(uint16_t);
        if (k <= 0 || n <= 0 || length != want) {
            log_error("serialized plugin data has " + std::to_string(length) + " bytes, expected " + std::to_string(want));
            return nullptr;
        }
        p += 2 * sizeof(int32_t);
        auto const* w = reinterpret_cast<uint16_t const*>(p);
        std::vector<uint16_t> weight(w, w + static_cast<size_t>(k) * n), bias(w + static_cast<size_t>(k) * n, w + static_cast<size_t>(k) * n + n);
        return named(new GemmGeluPlugin(k, n, std::move(weight), std::move(bias)));
    }

};

}  // namespace

REGISTER_TENSORRT_PLUGIN(GemmGeluPluginCreator);
