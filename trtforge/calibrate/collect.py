"""Which tensors get quantized, and streaming their statistics through ONNX Runtime.

The model runs batch by batch with the tensors to calibrate exposed as extra outputs; each batch
updates running abs-max and a 2048-bin histogram per tensor (methods.StreamingHistogram), so memory
stays bounded whatever the number of samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import onnx

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate.methods import StreamingHistogram
from trtforge.graph import expose_tensors, name_all_nodes

GEMM_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
# Ops that pass a convolution's output on unchanged in sign structure, for the residual-Add rule.
_CONV_EPILOGUE = ("Relu", "BatchNormalization", "Clip")


@dataclass
class QuantTarget:
    """One GEMM-like node and what its inputs are."""

    node: str
    op: str
    activations: list[str]  # input tensors to quantize per-tensor (calibrated)
    weight: str | None  # initializer quantized per-channel, or None (activation x activation)


@dataclass
class QuantPlan:
    targets: list[QuantTarget]
    residual_adds: dict[str, str] = field(default_factory=dict)  # Add node -> its residual input tensor

    def activation_tensors(self, nodes: set[str] | None = None) -> list[str]:
        names = [t for target in self.targets if nodes is None or target.node in nodes for t in target.activations]
        names += [t for add, t in self.residual_adds.items() if nodes is None or add in nodes]
        return list(dict.fromkeys(names))


def plan_quantization(model: onnx.ModelProto) -> QuantPlan:
    """Q/DQ targets by TensorRT's placement rules: inputs of Conv/ConvTranspose/MatMul/Gemm, and the
    residual input of an Add whose other input comes from a convolution (ModelOpt's rule, which lets
    TensorRT fuse the Add into the convolution). Softmax, LayerNorm and the rest stay float."""
    name_all_nodes(model)
    initializers = {i.name for i in model.graph.initializer}
    constants = {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    producers = {o: n for n in model.graph.node for o in n.output}
    targets = []
    for node in model.graph.node:
        if node.op_type not in GEMM_OPS:
            continue
        inputs = list(node.input[:2])
        weight = next((t for t in inputs[1:] if t in initializers or t in constants), None)
        activations = [t for t in inputs if t and t not in initializers and t not in constants]
        if activations:
            targets.append(QuantTarget(node.name, node.op_type, activations, weight))
    residual = {}
    for node in model.graph.node:
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        from_conv = [_comes_from_conv(t, producers) for t in node.input]
        if sum(from_conv) == 1 and all(t not in initializers for t in node.input):
            other = node.input[from_conv.index(False)]
            residual[node.name] = other
    return QuantPlan(targets, residual)


def _comes_from_conv(tensor: str, producers: dict[str, Any]) -> bool:
    node = producers.get(tensor)
    while node is not None and node.op_type in _CONV_EPILOGUE:
        node = producers.get(node.input[0])
    return node is not None and node.op_type in ("Conv", "ConvTranspose")


@dataclass
class Statistics:
    histograms: dict[str, StreamingHistogram]
    channel_amax: dict[str, np.ndarray]
    samples: int = 0


def collect(model: onnx.ModelProto, batches: Iterable[dict[str, np.ndarray]], tensors: list[str],
            channel_tensors: list[str] | None = None, num_bins: int = 2048, progress: Any = None) -> Statistics:
    """Stream batches through ORT; histograms for `tensors`, per-last-axis abs-max for `channel_tensors`."""
    channel_tensors = channel_tensors or []
    wanted = list(dict.fromkeys(tensors + channel_tensors))
    runner = OrtRunner(expose_tensors(model, wanted).SerializeToString())
    stats = Statistics({t: StreamingHistogram(num_bins) for t in tensors}, {})
    for batch in batches:
        values = runner.run(batch, wanted)
        for name in tensors:
            stats.histograms[name].update(values[name])
        for name in channel_tensors:
            value = np.abs(values[name].astype(np.float32))
            peak = value.reshape(-1, value.shape[-1]).max(axis=0)
            stats.channel_amax[name] = np.maximum(stats.channel_amax.get(name, peak), peak)
        stats.samples += len(next(iter(batch.values())))
        if progress is not None:
            progress.advance(1)
    return stats


def gemm_flops(model: onnx.ModelProto, plan: QuantPlan, feeds: dict[str, np.ndarray]) -> dict[str, float]:
    """FLOPs of every GEMM-like node at the shapes of `feeds`, from one ORT run with I/O exposed."""
    nodes = {n.name: n for n in model.graph.node}
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    wanted = []
    for target in plan.targets:
        node = nodes[target.node]
        wanted += [t for t in list(node.input[:2]) + [node.output[0]] if t not in inits]
    wanted = list(dict.fromkeys(wanted))
    values = OrtRunner(expose_tensors(model, wanted).SerializeToString()).run(feeds, wanted)
    shapes = {k: v.shape for k, v in values.items()} | inits
    flops = {}
    for target in plan.targets:
        node = nodes[target.node]
        out = shapes[node.output[0]]
        if node.op_type in ("MatMul", "Gemm"):
            a = shapes[node.input[0]]
            transposed = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if transposed else a[-1]
            flops[target.node] = 2.0 * float(np.prod(out)) * k
        else:  # Conv: each output element needs C_in/groups * kernel area MACs
            w = shapes[node.input[1]]
            flops[target.node] = 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    return flops
