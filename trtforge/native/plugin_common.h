// What trtforge's TensorRT plugins share: the error line on stderr and the creator's field list and namespace.
#pragma once

#include <NvInfer.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

namespace trtforge {

// Whether `stream` is being captured into a CUDA graph: nothing may be created or allocated then.
inline bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(stream, &status);
    return status != cudaStreamCaptureStatusNone;
}

inline void log_plugin_error(char const* plugin, std::string const& what) {
    std::fprintf(stderr, "[%s] %s\n", plugin, what.c_str());
}

// An IPluginCreator's bookkeeping: name, version, the fields it reads, the namespace TensorRT gives it.
class CreatorBase : public nvinfer1::IPluginCreator {
   public:
    CreatorBase(char const* name, char const* version, std::vector<nvinfer1::PluginField> fields)
        : name_(name), version_(version), fields_(std::move(fields)) {
        collection_.nbFields = static_cast<int32_t>(fields_.size());
        collection_.fields = fields_.data();
    }

    char const* getPluginName() const noexcept override { return name_; }
    char const* getPluginVersion() const noexcept override { return version_; }
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override { return &collection_; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }

   protected:
    // A new plugin, given this creator's namespace.
    template <typename Plugin>
    Plugin* named(Plugin* plugin) const {
        plugin->setPluginNamespace(namespace_.c_str());
        return plugin;
    }

   private:
    char const* name_;
    char const* version_;
    std::vector<nvinfer1::PluginField> fields_;
    nvinfer1::PluginFieldCollection collection_{};
    std::string namespace_;
};

}  // namespace trtforge
