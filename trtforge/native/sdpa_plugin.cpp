// TrtforgeFlashAttention: TensorRT 8.6+ plugins (IPluginV2DynamicExt) that run multi-head attention as one
// cuDNN scaled-dot-product-attention (flash) graph: version 1 reads one packed QKV tensor, version 2 separate
// Q, K, V tensors (grouped-query heads, a diagonal band mask, an optional additive bias).
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
// Contract of version 2 (trtforge.fusion.sdpa writes it; plugin_version "2"):
//   input 0  q     fp16 [B, H, Sq, D]
//   input 1  k     fp16 [B, Hk, Skv, D]   H a multiple of Hk: query head h reads key/value head h / (H / Hk)
//   input 2  v     fp16 [B, Hk, Skv, D]
//   input 3  bias  fp16 [1|B, 1|H, Sq, Skv], only with has_bias=1: added to scale * q k^T
//   output 0 out   fp16 [B, H, Sq, D]: softmax(scale * q k^T [+ bias], band) v
//   fields: num_heads (H), kv_heads (Hk), head_size (D), scale (float), alignment (0 top-left, 1 bottom-right:
//   query i sits at key i + Skv - Sq), left_bound, right_bound (key j of query i' is kept iff
//   i' - left_bound < j <= i' + right_bound; -1: no bound; right_bound 0 is causal), has_bias (0/1).
//   Serialized as a layout tag then the fields (CoreParams); a tag or length it does not know is refused.
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
#include <functional>
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
constexpr char const* kCoreVersion = "2";
constexpr int32_t kCoreLayout = 1;  // CoreParams' serialized layout; bump it with any change to the struct
constexpr int32_t kNoBound = -1;

struct Params {
    int32_t hidden;
    int32_t heads;
    float scale;
    int32_t causal;
};

struct CoreParams {
    int32_t layout;  // kCoreLayout
    int32_t heads;
    int32_t kv_heads;
    int32_t head_size;
    float scale;
    int32_t alignment;
    int32_t left_bound;
    int32_t right_bound;
    int32_t has_bias;
};

void log_error(std::string const& what) { trtforge::log_plugin_error(kPluginName, what); }

int64_t float_bits(float value) {
    int32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

// Process-wide cuDNN state: one handle and one built graph per attention form and shape, behind one lock.
class SdpaGraphs {
   public:
    using Key = std::vector<int64_t>;
    // Declares one graph's tensors and its sdpa node (not built yet); nullptr when the form is invalid.
    using Describe = std::function<std::shared_ptr<fe::graph::Graph>()>;

    static SdpaGraphs& get() {
        static SdpaGraphs* instance = new SdpaGraphs();  // leaked on purpose: plugins may be destroyed at exit
        return *instance;
    }

    // Enqueue the graph of `key` (described by `describe` on first use) on `stream` with the device pointers of
    // `pack` (uid -> pointer); false (with a message on stderr) when cuDNN cannot run it. `what` names the shape.
    bool run(Key const& key, std::string const& what, Describe const& describe, std::unordered_map<int64_t, void*>& pack,
             cudaStream_t stream) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = graphs_.find(key);
        if (it == graphs_.end()) {
            if (trtforge::capturing(stream)) {  // nothing is created or allocated under capture
                log_error("attention " + what + " first seen under CUDA-graph capture; enqueue it once plainly first");
                return false;
            }
            if (!handle_ && !create_handle()) return false;
            Entry entry{build(describe(), what), nullptr};
            if (!entry.graph) return false;
            int64_t const bytes = entry.graph->get_workspace_size();
            if (bytes > 0) {
                // Kept for the process: a captured CUDA graph bakes this address in, so it is never freed or moved.
                // Streams running this shape at once would share it; trtforge's loop enqueues from one thread.
                if (cudaMalloc(&entry.workspace, bytes) != cudaSuccess) {
                    log_error("cudaMalloc of " + std::to_string(bytes) + " bytes of cuDNN workspace failed");
                    return false;
                }
                log_error("note: attention " + what + " uses " + std::to_string(bytes) + " bytes of cuDNN workspace");
            }
            it = graphs_.emplace(key, entry).first;
        }
        Entry const& entry = it->second;
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

    std::shared_ptr<fe::graph::Graph> build(std::shared_ptr<fe::graph::Graph> graph, std::string const& what) {
        if (!graph) return nullptr;
        auto fail = [&](char const* step, fe::error_t st) {
            log_error(std::string("cuDNN graph ") + step + " failed for attention " + what + ": " + st.get_message());
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
    std::map<Key, Entry> graphs_;
};

std::shared_ptr<fe::graph::Graph> half_graph() {
    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return graph;
}

// Version 1: the packed QKV of B sequences of S tokens.
bool run_packed(Params const& p, int64_t b, int64_t s, __half const* qkv, __half* out, cudaStream_t stream) {
    int64_t const h = p.heads, e = p.hidden, d = e / h;
    auto describe = [&]() {
        auto graph = half_graph();
        // q, k, v of token (b, s), head h at qkv[(b*S + s)*3E + h*3D + {0, D, 2D} + d]: dims [B, H, S, D].
        std::vector<int64_t> const qkv_stride = {s * 3 * e, 3 * d, 3 * e, 1};
        auto tensor = [&](char const* name, int64_t uid) {
            return graph->tensor(
                fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, h, s, d}).set_stride(qkv_stride));
        };
        auto q = tensor("q", 1), k = tensor("k", 2), v = tensor("v", 3);
        auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(false).set_attn_scale(p.scale);
        if (p.causal) options.set_causal_mask(true);
        auto outputs = graph->sdpa(q, k, v, options);
        outputs[0]->set_output(true).set_uid(4).set_dim({b, h, s, d}).set_stride({s * e, d, e, 1});
        return graph;
    };
    // cuDNN reads the pointers only; the const_cast is its API's, not a write.
    auto* base = const_cast<__half*>(qkv);
    std::unordered_map<int64_t, void*> pack = {{1, base}, {2, base + d}, {3, base + 2 * d}, {4, out}};
    SdpaGraphs::Key key = {1, b, s, p.heads, p.hidden, float_bits(p.scale), p.causal};
    std::string const what = std::to_string(b) + "x" + std::to_string(s) + " (heads " + std::to_string(h) + ", head size " +
                             std::to_string(d) + ")";
    return SdpaGraphs::get().run(key, what, describe, pack, stream);
}

// Version 2: separate Q [B, H, Sq, D], K and V [B, Hk, Skv, D], an optional bias [bb, bh, Sq, Skv], all contiguous.
bool run_core(CoreParams const& p, int64_t b, int64_t sq, int64_t skv, int64_t bb, int64_t bh, void const* const* in, void* out,
              cudaStream_t stream) {
    int64_t const h = p.heads, hk = p.kv_heads, d = p.head_size;
    auto describe = [&]() {
        auto graph = half_graph();
        auto heads = [&](char const* name, int64_t uid, int64_t n, int64_t s) {
            return graph->tensor(
                fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, n, s, d}).set_stride({n * s * d, s * d, d, 1}));
        };
        auto q = heads("q", 1, h, sq), k = heads("k", 2, hk, skv), v = heads("v", 3, hk, skv);
        auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(false).set_attn_scale(p.scale);
        if (p.left_bound != kNoBound || p.right_bound != kNoBound) {
            options.set_diagonal_alignment(p.alignment ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT);
            if (p.right_bound != kNoBound) options.set_diagonal_band_right_bound(p.right_bound);
            if (p.left_bound != kNoBound) options.set_diagonal_band_left_bound(p.left_bound);
        }
        if (p.has_bias) {
            auto bias = graph->tensor(fe::graph::Tensor_attributes()
                                          .set_name("bias")
                                          .set_uid(5)
                                          .set_dim({bb, bh, sq, skv})
                                          .set_stride({bh * sq * skv, sq * skv, skv, 1}));
            options.set_bias(bias);
        }
        auto outputs = graph->sdpa(q, k, v, options);
        outputs[0]->set_output(true).set_uid(4).set_dim({b, h, sq, d}).set_stride({h * sq * d, sq * d, d, 1});
        return graph;
    };
    std::unordered_map<int64_t, void*> pack = {
        {1, const_cast<void*>(in[0])}, {2, const_cast<void*>(in[1])}, {3, const_cast<void*>(in[2])}, {4, out}};
    if (p.has_bias) pack[5] = const_cast<void*>(in[3]);
    SdpaGraphs::Key key = {2,           b,           sq,           skv,         h, hk, d, float_bits(p.scale), p.alignment,
                           p.left_bound, p.right_bound, p.has_bias ? bb : -1, p.has_bias ? bh : -1};
    std::string const what = std::to_string(b) + "x" + std::to_string(sq) + "x" + std::to_string(skv) + " (heads " +
                             std::to_string(h) + "/" + std::to_string(hk) + ", head size " + std::to_string(d) + ")";
    return SdpaGraphs::get().run(key, what, describe, pack, stream);
}

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
        bool ok = run_packed(p_, tokens / seq, seq, static_cast<__half const*>(inputs[0]), static_cast<__half*>(outputs[0]), stream);
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

// Version 2: separate Q, K, V (and bias) tensors; see the contract at the top of this file.
class SdpaCorePlugin final : public IPluginV2DynamicExt {
   public:
    explicit SdpaCorePlugin(CoreParams p) : p_(p) {}

    // IPluginV2
    char const* getPluginType() const noexcept override { return kPluginName; }
    char const* getPluginVersion() const noexcept override { return kCoreVersion; }
    int32_t getNbOutputs() const noexcept override { return 1; }
    int32_t initialize() noexcept override { return 0; }
    void terminate() noexcept override {}
    size_t getSerializationSize() const noexcept override { return sizeof(CoreParams); }
    void serialize(void* buffer) const noexcept override { std::memcpy(buffer, &p_, sizeof(CoreParams)); }
    void destroy() noexcept override { delete this; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }

    // IPluginV2Ext
    DataType getOutputDataType(int32_t, DataType const* inputTypes, int32_t) const noexcept override { return inputTypes[0]; }

    // IPluginV2DynamicExt
    IPluginV2DynamicExt* clone() const noexcept override {
        auto* copy = new SdpaCorePlugin(p_);
        copy->setPluginNamespace(namespace_.c_str());
        return copy;
    }

    DimsExprs getOutputDimensions(int32_t, DimsExprs const* inputs, int32_t, IExprBuilder&) noexcept override {
        return inputs[0];  // [B, H, Sq, D]
    }

    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* io, int32_t, int32_t) noexcept override {
        return io[pos].format == TensorFormat::kLINEAR && io[pos].type == DataType::kHALF;  // q, k, v, [bias], out
    }

    void configurePlugin(DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*, int32_t) noexcept override {}

    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        return 0;  // cuDNN's workspace, if any, is the one SdpaGraphs keeps per shape
    }

    int32_t enqueue(PluginTensorDesc const* in, PluginTensorDesc const*, void const* const* inputs, void* const* outputs, void*,
                    cudaStream_t stream) noexcept override {
        Dims const& q = in[0].dims;
        Dims const& k = in[1].dims;
        Dims const& v = in[2].dims;
        if (q.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4) {
            log_error("q, k and v must be [batch, heads, seq, head]");
            return 1;
        }
        int64_t const b = q.d[0], sq = q.d[2], skv = k.d[2];
        bool const shapes_ok = q.d[1] == p_.heads && q.d[3] == p_.head_size && k.d[0] == b && k.d[1] == p_.kv_heads &&
                               k.d[3] == p_.head_size;
        bool const v_ok = v.d[0] == k.d[0] && v.d[1] == k.d[1] && v.d[2] == k.d[2] && v.d[3] == k.d[3];
        if (!shapes_ok || !v_ok) {
            log_error("q [" + std::to_string(b) + ", " + std::to_string(q.d[1]) + ", " + std::to_string(sq) + ", " +
                      std::to_string(q.d[3]) + "] and k/v with " + std::to_string(k.d[1]) + " heads do not match num_heads " +
                      std::to_string(p_.heads) + ", kv_heads " + std::to_string(p_.kv_heads) + ", head_size " +
                      std::to_string(p_.head_size));
            return 1;
        }
        int64_t bb = 1, bh = 1;
        if (p_.has_bias) {
            Dims const& bias = in[3].dims;
            bool const ok = bias.nbDims == 4 && (bias.d[0] == 1 || bias.d[0] == b) && (bias.d[1] == 1 || bias.d[1] == p_.heads) &&
                            bias.d[2] == sq && bias.d[3] == skv;
            if (!ok) {
                log_error("bias must be [1|batch, 1|heads, " + std::to_string(sq) + ", " + std::to_string(skv) + "]");
                return 1;
            }
            bb = bias.d[0];
            bh = bias.d[1];
        }
        return run_core(p_, b, sq, skv, bb, bh, inputs, outputs[0], stream) ? 0 : 1;
    }

   private:
    CoreParams p_;
    std::string namespace_;
};

class SdpaCorePluginCreator final : public trtforge::CreatorBase {
   public:
    SdpaCorePluginCreator()
        : CreatorBase(kPluginName, kCoreVersion,
                      {PluginField("num_heads", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("kv_heads", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("head_size", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("scale", nullptr, PluginFieldType::kFLOAT32, 1),
                       PluginField("alignment", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("left_bound", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("right_bound", nullptr, PluginFieldType::kINT32, 1),
                       PluginField("has_bias", nullptr, PluginFieldType::kINT32, 1)}) {}

    IPluginV2* createPlugin(char const*, PluginFieldCollection const* fc) noexcept override {
        CoreParams p{kCoreLayout, 0, 0, 0, 0.f, 0, kNoBound, kNoBound, 0};
        bool have_scale = false;
        for (int32_t i = 0; i < fc->nbFields; ++i) {
            PluginField const& f = fc->fields[i];
            std::string const name = f.name;
            if (f.type == PluginFieldType::kFLOAT32 && name == "scale") {
                p.scale = *static_cast<float const*>(f.data);
                have_scale = true;
                continue;
            }
            if (f.type != PluginFieldType::kINT32) continue;
            int32_t const value = *static_cast<int32_t const*>(f.data);
            if (name == "num_heads") p.heads = value;
            else if (name == "kv_heads") p.kv_heads = value;
            else if (name == "head_size") p.head_size = value;
            else if (name == "alignment") p.alignment = value;
            else if (name == "left_bound") p.left_bound = value;
            else if (name == "right_bound") p.right_bound = value;
            else if (name == "has_bias") p.has_bias = value;
        }
        if (!valid(p)) return nullptr;
        if (!have_scale) p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_size));
        return named(new SdpaCorePlugin(p));
    }

    IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        CoreParams p;
        if (length != sizeof(CoreParams)) {
            log_error("serialized v2 plugin data has " + std::to_string(length) + " bytes, expected " + std::to_string(sizeof(CoreParams)) +
                      " (an engine built with another libtrtforge_plugins: rebuild it)");
            return nullptr;
        }
        std::memcpy(&p, data, sizeof(CoreParams));
        if (p.layout != kCoreLayout) {
            log_error("serialized v2 plugin data has layout " + std::to_string(p.layout) + ", this library reads " +
                      std::to_string(kCoreLayout) + " (rebuild the engine)");
            return nullptr;
        }
        return valid(p) ? named(new SdpaCorePlugin(p)) : nullptr;
    }

   private:
    static bool valid(CoreParams const& p) {
        if (p.heads <= 0 || p.kv_heads <= 0 || p.heads % p.kv_heads != 0) {
            log_error("num_heads " + std::to_string(p.heads) + " must be a positive multiple of kv_heads " + std::to_string(p.kv_heads));
            return false;
        }
        if (p.head_size <= 0 || p.head_size % 8 != 0 || p.head_size > 128) {
            log_error("head_size " + std::to_string(p.head_size) + " must be a multiple of 8 up to 128");
            return false;
        }
        if ((p.alignment != 0 && p.alignment != 1) || (p.has_bias != 0 && p.has_bias != 1) ||
            (p.left_bound != kNoBound && p.left_bound < 1) || (p.right_bound != kNoBound && p.right_bound < 0)) {
            log_error("alignment and has_bias must be 0 or 1, left_bound -1 or >= 1, right_bound -1 or >= 0");
            return false;
        }
        return true;
    }
};

}  // namespace

REGISTER_TENSORRT_PLUGIN(SdpaPluginCreator);
REGISTER_TENSORRT_PLUGIN(SdpaCorePluginCreator);

// What the library registers, for a person inspecting it (e.g. with ctypes); trtforge does not read it.
extern "C" char const* trtforge_plugin_names() { return "TrtforgeFlashAttention/1 TrtforgeFlashAttention/2 TrtforgeGemmGelu/1 TrtforgeGemm/1 TrtforgeGemmFp8/1"; }
