"""SmoothQuant-style scale migration (as ModelOpt's int8_sq), applied to the fp32 ONNX.

BERT-style activations carry a few outlier channels, which ruin a per-tensor INT8 scale. For an
activation X feeding MatMuls with weights W (y = X W), per input channel k:

    s_k = max|X_k|^alpha / max|W_k|^(1 - alpha)        X' = X / s,  W' = diag(s) W

so X' W' = X W exactly, while X' has flatter channels. All MatMuls that read the same X share one s
(the weight term is their joint max). 1/s is folded into the preceding LayerNormalization's scale and
bias when X is that LayerNorm's output and nothing but the smoothed MatMuls reads it; otherwise an
explicit Mul by 1/s is inserted, which TensorRT fuses into the preceding pointwise kernel.

Shared tensors are never rescaled in place. With tied weights (ALBERT shares one layer's weights across
all layers; tied embeddings) one initializer feeds several MatMuls whose activations get different s,
and one LayerNorm's gamma/beta may serve several LayerNorms. Rescaling such a tensor once per consumer
compounded the scales (86x output error). A shared weight or LayerNorm parameter is cloned for the
consumer being smoothed instead; skipping them would be simpler but would leave ALBERT's outlier
channels (the reason for smoothing) unsmoothed in every layer. The cost is file size only: TensorRT
builds each layer with its own weights anyway, and the Q/DQ model quantizes each consumer's copy.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.graph.index import name_all_nodes

SCALE_MIN, SCALE_MAX = 1e-4, 1e4


def smoothing_groups(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Activation tensor -> MatMul nodes that read it as input 0 with a 2-D weight initializer as input 1."""
    name_all_nodes(model)
    inits = {i.name: i for i in model.graph.initializer}
    groups: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits and len(inits[node.input[1]].dims) == 2 and node.input[0] not in inits:
            groups.setdefault(node.input[0], []).append(node.name)
    return groups


def smoothing_scales(channel_amax: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """Pure: s_k from activation channel abs-max and the weights [K, N] that read the activation."""
    w_max = np.max(np.stack([np.abs(w).max(axis=1) for w in weights]), axis=0)
    a = np.maximum(channel_amax.astype(np.float64), 1e-5)
    w = np.maximum(w_max.astype(np.float64), 1e-5)
    return np.clip(a**alpha / w ** (1.0 - alpha), SCALE_MIN, SCALE_MAX).astype(np.float32)


def apply_smoothing(model: onnx.ModelProto, scales: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` with each activation divided by its s and the reading weights multiplied by it."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    name_all_nodes(out)
    groups = smoothing_groups(out)
    inits = {i.name: i for i in out.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in out.graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    producers = {o: n for n in out.graph.node for o in n.output}
    graph_outputs = {o.name for o in out.graph.output}
    new_nodes: list[tuple[int, onnx.NodeProto]] = []
    for tensor, s in scales.items():
        members = set(groups.get(tensor, []))
        if not members:
            continue
        for node in out.graph.node:
            if node.name in members:
                w = _own(out, node, 1, inits)
                array = numpy_helper.to_array(w) * s[:, None]
                w.CopyFrom(numpy_helper.from_array(array.astype(np.float32), w.name))
        producer = producers.get(tensor)
        only_smoothed = all(c.name in members for c in consumers.get(tensor, [])) and tensor not in graph_outputs
        if (
            producer is not None
            and producer.op_type == "LayerNormalization"
            and only_smoothed
            and _fold_into_layernorm(out, producer, s, inits)
        ):
            continue
        smoothed = f"{tensor}_smoothed"
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{tensor}_inv_smooth_scale")
        out.graph.initializer.append(inv)
        mul = helper.make_node("Mul", [tensor, inv.name], [smoothed], name=f"{tensor}_smooth")
        for node in out.graph.node:
            if node.name in members:
                node.input[0] = smoothed
        index = max((i for i, n in enumerate(out.graph.node) if tensor in n.output), default=-1)
        new_nodes.append((index, mul))
    for index, node in sorted(new_nodes, key=lambda x: -x[0]):
        out.graph.node.insert(index + 1, node)
    return out


def _own(model: onnx.ModelProto, node: onnx.NodeProto, index: int, inits: dict[str, onnx.TensorProto]) -> onnx.TensorProto:
    """The initializer at `node.input[index]`, cloned for this node first if anything else reads it."""
    name = node.input[index]
    readers = sum(1 for n in model.graph.node for t in n.input if t == name)
    if readers <= 1 and name not in {o.name for o in model.graph.output}:
        return inits[name]
    clone = model.graph.initializer.add()  # add(), not append(): append stores a copy, edits must reach the graph
    clone.CopyFrom(inits[name])
    clone.name = f"{name}__{node.name}"
    inits[clone.name] = clone
    node.input[index] = clone.name
    return clone


def _fold_into_layernorm(model: onnx.ModelProto, node: onnx.NodeProto, s: np.ndarray, inits: dict[str, onnx.TensorProto]) -> bool:
    names = list(node.input[1:3])
    if len(names) < 1 or any(n not in inits for n in names if n):
        return False
    for index, name in enumerate(names, start=1):
        if not name:
            continue
        tensor = _own(model, node, index, inits)
        name = tensor.name
        array = numpy_helper.to_array(tensor) / s
        tensor.CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))
    return True
