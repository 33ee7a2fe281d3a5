// TrtforgeFlashAttention: a TensorRT 8.6+ plugin (IPluginV2DynamicExt) that runs multi-head attention as one
// cuDNN scaled-dot-product-attention (flash) graph.
//
// Why it exists: TensorRT 8.6's own fused attention on sm_90 (CustomQKVToContextPluginDynamic v2,
// fmha_v2_fp16_512_64_sm90) runs at ~117 TFLOP/s on an H200, and its flash plugin (fMHA_V2) ships no sm_90
// kernels (benchmarks/RESULTS.md, 2026-12-01). cuDNN 9 carries Hopper flash-attention kernels; no library
// exposes them to a TensorRT 8.6 engine, so this file does that and nothing else: the attention arithmetic is
// cuDNN's (through the header-only cudnn-frontend), the plugin only maps TensorRT's tensors onto it.
//
// Contract (the ONNX node trtforge.fusion.attention writes, domain "trt.plugins", plugin_version "1"):
//   input 0  qkv   fp16 [T, 3E, 1, 1] (or [T, 3E]): T = B*S tokens, each token's columns laid out [heads, 3, head]
//                  (head h's q, k, v adjacent), the layout CustomQKVToContextPluginDynamic reads;
//   input 1  seq   int32 [S]: only its length is read (the sequence length; B = T / S);
//   output 0 ctx   fp16 [T, E, 1, 1] (input 0's rank): softmax(scale * q k^T [+ causal mask]) v, heads merged.
//   fields: hidden_size (E), num_heads, scale (float), causal (0/1).
// Every batch row is a full sequence (trtforge never pads a chunk), so no padding mask is applied; the engine's
// sidecar records that and `trtforge run` refuses a padded attention_mask for it.
//
// One cuDNN graph per (B, S) is built on first use, outside CUDA-graph capture (trtforge's run loop enqueues
// every new shape plainly before it captures), and shared by every layer and context of the process.

#include <NvInfer.h>
#include <cuda_runtime_api.h>
#include "plugin_common.h"
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;
using namespace nvinfer1;

namespace {

constexpr char const* kPluginName = "TrtforgeFlashAttention";
constexpr char const* kPluginVersion = "1";

struct Params {
    int32_t hidden;
    int32_t heads;
    float scale;
    int32_t causal;
};

void log_error(std::string const& what) { trtforge::log_plugin_error(kPluginName, what); }

// Process-wide cuDNN state: one handle and one built graph per attention shape, behind one lock.
class SdpaGraphs {
   public:
    static SdpaGraphs& get() {
        static SdpaGraphs* instance = new SdpaGraphs();  // leaked on purpose: plugins may be destroyed at exit
        return *instance;
    }

    // Enqueue one attention on `stream`; false (with a message on stderr) when cuDNN cannot run it.
    bool run(Params const& p, int64_t b, int64_t s, __half const* qkv, __half* out, cudaStream_t stream) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto key = std::make_tuple(b, s, p.heads, p.hidden, p.scale, p.causal);
        auto it = graphs_.find(key);
        if (it == graphs_.end()) {
            if (trtforge::capturing(stream)) {  // nothing is created or allocated under capture
                log_error("attention shape " + std::to_string(b) + "x" + std::to_string(s) +
                          " first seen under CUDA-graph capture; enqueue it once plainly first");
                return false;
            }
            if (!handle_ && !create_handle()) return false;
            Entry entry{build(p, b, s), nullptr};
            if (!entry.graph) return false;
            int64_t const bytes = entry.graph->get_workspace_size();
            if (bytes > 0) {
                // Kept for the process: a captured CUDA graph bakes this address in, so it is never freed or moved.
                // Streams running this shape at once would share it; trtforge's loop enqueues from one thread.
                if (cudaMalloc(&entry.workspace, bytes) != cudaSuccess) {
                    log_error("cudaMalloc of " + std::to_string(bytes) + " bytes of cuDNN workspace failed");
                    return false;
                }
                log_error("note: attention " + std::to_string(b) + "x" + std::to_string(s) + " uses " + std::to_string(bytes) +
                          " bytes of cuDNN workspace");
            }
            it = graphs_.emplace(key, entry).first;
        }
        Entry const& entry = it->second;
        int64_t const d = p.hidden / p.heads;
        // cuDNN reads the pointers only; the const_cast is its API's, not a write.
        auto* base = const_cast<__half*>(qkv);
        std::unordered_map<int64_t, void*> pack = {{1, base}, {2, base + d}, {3, base + 2 * d}, {4, out}};
        if (cudnnSetStream(handle_, stream) != CUDNN_STATUS_SUCCESS) {
            log_error("cudnnSetStream failed");
            return false;
        }
        auto status = entry.graph->execute(handle_, pack, entry.workspace);
        if (!status.is_good()) {
            log_error("cuDNN execute failed: " + status.get_message());
            return false;
        }
        return true;
    }

   private:
    struct Entry {
        std::shared_ptr<fe::graph::Graph> graph;
        void* workspace;
    };

    bool create_handle() {
        auto st = cudnnCreate(&handle_);
        if (st != CUDNN_STATUS_SUCCESS) {
            log_error(std::string("cudnnCreate failed: ") + cudnnGetErrorString(st));
            handle_ = nullptr;
            return false;
        }
        return true;
    }

    std::shared_ptr<fe::graph::Graph> build(Params const& p, int64_t b, int64_t s) {
        int64_t const h = p.heads, e = p.hidden, d = e / h;
        auto graph = std::make_shared<fe::graph::Graph>();
        graph->set_io_data_type(fe::DataType_t::HALF)
            .set_intermediate_data_type(fe::DataType_t::FLOAT)
            .set_compute_data_type(fe::DataType_t::FLOAT);
        // q, k, v of token (b, s), head h at qkv[(b*S + s)*3E + h*3D + {0, D, 2D} + d]: dims [B, H, S, D].
        std::vector<int64_t> const qkv_stride = {s * 3 * e, 3 * d, 3 * e, 1};
        auto tensor = [&](char const* name, int64_t uid) {
            return graph->tensor(fe::graph::Tensor_attributes()
                                     .set_name(name)
                                     .set_uid(uid)
                                     .set_dim({b, h, s, d})
                                     .set_stride(qkv_stride));
        };
        auto q = tensor("q", 1), k = tensor("k", 2), v = tensor("v", 3);
        auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(false).set_attn_scale(p.scale);
        if (p.causal) options.set_causal_mask(true);
        auto outputs = graph->sdpa(q, k, v, options);
        outputs[0]->set_output(true).set_uid(4).set_dim({b, h, s, d}).set_stride({s * e, d, e, 1});
        auto fail = [&](char const* step, fe::error_t st) {
            log_error(std::string("cuDNN graph ") + step + " failed for " + std::to_string(b) + "x" + std::to_string(s) +
                      " (heads " + std::to_string(h) + ", head size " + std::to_string(d) + "): " + st.get_message());
            return nullptr;
        };
        fe::error_t st = graph->validate();
        if (!st.is_good()) return fail("validate", st);
        st = graph->build_operation_graph(handle_);
        if (!st.is_good()) return fail("build_operation_graph", st);
        st = graph->create_execution_plans({fe::HeurMode_t::A});
        if (!st.is_good()) return fail("create_execution_plans", st);
        st = graph->check_support(handle_);
        if (!st.is_good()) return fail("check_support", st);
        st = graph->build_plans(handle_);
        if (!st.is_good()) return fail("build_plans", st);
        return graph;
    }

    std::mutex mutex_;
    cudnnHandle_t handle_ = nullptr;
    std::map<std::tuple<int64_t, int64_t, int32_t, int32_t, float, int32_t>, Entry> graphs_;
};

class SdpaPlugin final : public IPluginV2DynamicExt {
   public:
    explicit SdpaPlugin(Params p) : p_(p) {}

    // IPluginV2
    char const* getPluginType() const noexcept override { return kPluginName; }
    char const* getPluginVersion() const noexcept override { return kPluginVersion; }
    int32_t getNbOutputs() const noexcept override { return 1; }
    int32_t initialize() noexcept override { return 0; }
    void terminate() noexcept override {}
    size_t getSerializationSize() const noexcept override { return sizeof(Params); }
    void serialize(void* buffer) const noexcept override { std::memcpy(buffer, &p_, sizeof(Params)); }
    void destroy() noexcept override { delete this; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }

    // IPluginV2Ext
    DataType getOutputDataType(int32_t, DataType const* inputTypes, int32_t) const noexcept override {
        return inputTypes[0];
    }

    // IPluginV2DynamicExt
    IPluginV2DynamicExt* clone() const noexcept override {
        auto* copy = new SdpaPlugin(p_);
        copy->setPluginNamespace(namespace_.c_str());
        return copy;
    }

    DimsExprs getOutputDimensions(int32_t, DimsExprs const* inputs, int32_t, IExprBuilder& builder) noexcept override {
        DimsExprs out = inputs[0];
        out.d[1] = builder.constant(p_.hidden);
        return out;
    }

    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* io, int32_t, int32_t) noexcept override {
        PluginTensorDesc const& t = io[pos];
        if (t.format != TensorFormat::kLINEAR) return false;
        if (pos == 1) return t.type == DataType::kINT32;
        return t.type == DataType::kHALF;  // qkv and the output
    }

    void configurePlugin(DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*, int32_t) noexcept override {}

    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        return 0;  // cuDNN's workspace, if any, is the one SdpaGraphs keeps per shape
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*, void const* const* inputs,
                    void* const* outputs, void*, cudaStream_t stream) noexcept override {
        int64_t const tokens = inputDesc[0].dims.d[0];
        int64_t const seq = inputDesc[1].dims.d[0];
        int64_t width = 1;
        for (int32_t i = 1; i < inputDesc[0].dims.nbDims; ++i) width *= inputDesc[0].dims.d[i];
        if (width != 3 * static_cast<int64_t>(p_.hidden)) {
            log_error("packed QKV has " + std::to_string(width) + " columns per token, expected 3 x " + std::to_string(p_.hidden));
            return 1;
        }
        if (seq <= 0 || tokens % seq != 0) {
            log_error("tokens " + std::to_string(tokens) + " are not a whole number of sequences of " + std::to_string(seq));
            return 1;
        }
        bool ok = SdpaGraphs::get().run(p_, tokens / seq, seq, static_cast<__half const*>(inputs[0]),
                                        static_cast<__half*>(outputs[0]), stream);
        return ok ? 0 : 1;
    }

   private:
    Params p_;
    std::string namespace_;
};

class SdpaPluginCreator final : public trtforge::CreatorBase {
   public:
    SdpaPluginCreator()
        : CreatorBase(kPluginName, kPluginVersion,
                      {PluginField("hidden_size", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("num_heads", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("scale", nullptr, PluginFieldType::kFLOAT32, 1),
                       PluginField("causal", nullptr, PluginFieldType::kINT32, 1)}) {}

    IPluginV2* createPlugin(char const*, PluginFieldCollection const* fc) noexcept override {
        Params p{0, 0, 0.f, 0};
        bool have_scale = false;
        for (int32_t i = 0; i < fc->nbFields; ++i) {
            PluginField const& f = fc->fields[i];
            std::string const name = f.name;
            if (name == "hidden_size" && f.type == PluginFieldType::kINT32) p.hidden = *static_cast<int32_t const*>(f.data);
            else if (name == "num_heads" && f.type == PluginFieldType::kINT32) p.heads = *static_cast<int32_t const*>(f.data);
            else if (name == "causal" && f.type == PluginFieldType::kINT32) p.causal = *static_cast<int32_t const*>(f.data);
            else if (name == "scale" && f.type == PluginFieldType::kFLOAT32) {
                p.scale = *static_cast<float const*>(f.data);
                have_scale = true;
            }
        }
        if (p.heads <= 0 || p.hidden <= 0 || p.hidden % p.heads != 0 || (p.hidden / p.heads) % 8 != 0) {
            log_error("hidden_size " + std::to_string(p.hidden) + " and num_heads " + std::to_string(p.heads) +
                      " must give a head size that is a multiple of 8");
            return nullptr;
        }
        if (!have_scale) p.scale = 1.0f / std::sqrt(static_cast<float>(p.hidden / p.heads));
        return named(new SdpaPlugin(p));
    }

    IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        if (length != sizeof(Params)) {
            log_error("serialized plugin data has " + std::to_string(length) + " bytes, expected " + std::to_string(sizeof(Params)));
            return nullptr;
        }
        Params p;
        std::memcpy(&p, data, sizeof(Params));
        if (p.heads <= 0 || p.hidden <= 0 || p.hidden % p.heads != 0) {
            log_error("serialized plugin data is corrupt (hidden " + std::to_string(p.hidden) + ", heads " + std::to_string(p.heads) + ")");
            return nullptr;
        }
        return named(new SdpaPlugin(p));
    }

};

}  // namespace

REGISTER_TENSORRT_PLUGIN(SdpaPluginCreator);

// What the library registers, for a person inspecting it (e.g. with ctypes); trtforge does not read it.
extern "C" char const* trtforge_plugin_names() { return "TrtforgeFlashAttention/1 TrtforgeGemmGelu/1 TrtforgeGemm/1 TrtforgeGemmFp8/1"; }
