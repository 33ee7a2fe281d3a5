"""Build-time graph passes that hand TensorRT fused kernels it does not find by itself ."""
