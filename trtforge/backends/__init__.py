"""Runtimes behind one small protocol. Only backends/tensorrt.py imports TensorRT."""
