"""Streaming activation statistics through ONNX Runtime (which tensors: placement.py), and GEMM shapes.

The model runs batch by batch with the tensors to calibrate exposed as extra outputs; each batch
updates running abs-max and a 2048-bin histogram per tensor (methods.StreamingHistogram), so memory
stays bounded whatever the number of samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import onnx

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate.methods import StreamingHistogram
from trtforge.calibrate.placement import GEMM_OPS, QuantPlan, QuantTarget, plan_quantization  # noqa: F401 (re-exported)
from trtforge.graph.index import expose_tensors


@dataclass
class Statistics:
    histograms: dict[str, StreamingHistogram]
    channel_amax: dict[str, np.ndarray]
    samples: int = 0

    def merge(self, other: "Statistics") -> None:
        """Add the statistics of another shard of the data. Exact and order-independent (histograms on
        power-of-two ranges, maxima, counts), so shards collected apart give what one pass gives."""
        for name, hist in other.histograms.items():
            if name in self.histograms:
                self.histograms[name].merge(hist)
            else:
                self.histograms[name] = hist.copy()
        for name, peak in other.channel_amax.items():
            self.channel_amax[name] = np.maximum(self.channel_amax[name], peak) if name in self.channel_amax else peak.copy()
        self.samples += other.samples


def collect(
    model: onnx.ModelProto,
    batches: Iterable[dict[str, np.ndarray]],
    tensors: list[str],
    channel_tensors: list[str] | None = None,
    num_bins: int = 2048,
    progress: Any = None,
) -> Statistics:
    """Stream batches through ORT; histograms for `tensors`, per-last-axis abs-max for `channel_tensors`."""
    return collect_with(exposing_runner(model, tensors, channel_tensors), batches, tensors, channel_tensors, num_bins, progress)


def exposing_runner(
    model: onnx.ModelProto | bytes, tensors: list[str], channel_tensors: list[str] | None = None, threads: int | None = None
) -> OrtRunner:
    """An ORT session of `model` with the tensors to measure as extra outputs (bytes: already exposed)."""
    if isinstance(model, bytes):
        return OrtRunner(model, threads=threads)
    wanted = list(dict.fromkeys(tensors + (channel_tensors or [])))
    return OrtRunner(expose_tensors(model, wanted).SerializeToString(), threads=threads)


def collect_with(
    runner: OrtRunner,
    batches: Iterable[dict[str, np.ndarray]],
    tensors: list[str],
    channel_tensors: list[str] | None = None,
    num_bins: int = 2048,
    progress: Any = None,
) -> Statistics:
    """collect() on a given session: what a Ray actor runs on its shard of the batches."""
    channel_tensors = channel_tensors or []
    wanted = list(dict.fromkeys(tensors + channel_tensors))
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


def gemm_shapes(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Shapes of every GEMM-like node's inputs and output at the shapes of `feeds`, from one ORT run."""
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    wanted = list(
        dict.fromkeys(
            t for n in model.graph.node if n.op_type in GEMM_OPS for t in list(n.input[:2]) + [n.output[0]] if t and t not in inits
        )
    )
    values = OrtRunner(expose_tensors(model, wanted).SerializeToString()).run(feeds, wanted)
    return {k: tuple(v.shape) for k, v in values.items()} | inits


def gemm_flops(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, float]:
    """FLOPs of every GEMM-like node (quantized or not) at the given tensor shapes."""
    flops = {}
    for node in model.graph.node:
        if node.op_type not in GEMM_OPS or node.output[0] not in shapes:
            continue
        out = shapes[node.output[0]]
        if node.op_type in ("MatMul", "Gemm"):
            a = shapes.get(node.input[0])
            if a is None:
                continue
            transposed = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if transposed else a[-1]
            flops[node.name] = 2.0 * float(np.prod(out)) * k
        elif node.input[1] in shapes:  # Conv: each output element needs C_in/groups * kernel area MACs
            flops[node.name] = 2.0 * float(np.prod(out)) * float(np.prod(shapes[node.input[1]][1:]))
    return flops
