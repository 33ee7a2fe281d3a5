"""trtforge: PyTorch to a validated TensorRT engine, every step proven with numbers."""

__version__ = "0.1.0"
