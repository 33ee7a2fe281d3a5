"""Where Q/DQ goes: a per-op placement table, weight resolution, and ModelOpt-style exclusion rules. Pure.

Per-op table (TensorRT's int8 GEMM inputs): which inputs are data, which may carry a constant weight,
and the weight's per-channel axis, which is always the OUTPUT-channel axis and depends on the rank:
Conv 0 ([O, I/g, k...]); ConvTranspose 1 ([I, O/g, k...]); MatMul weight as input B: last axis
([..., K, N] at any rank >= 2, so a batched [G, K, N] gets N scales, not K); as input A: axis -2;
Gemm B: 0 with transB else 1; Gemm A: 1 with transA else 0.

A weight is a constant reaching the node through Identity or Cast (fp16 checkpoints store
`fp16 initializer -> Cast(float) -> MatMul`): an initializer or a Constant node's value. Such weights
are quantized per channel as weights, never per tensor as activations.

Exclusions, as in ModelOpt's int8 ONNX PTQ (modelopt/onnx/quantization: graph_utils
find_nodes_from_matmul_to_exclude, find_nodes_from_convs_to_exclude, find_nodes_from_mha_to_exclude),
each recorded with the rule's name:
- `attention_bmm`: a MatMul whose both inputs are activations (QK^T, softmax.V). TensorRT 8.6 computes
  int8 attention BMMs differently from the ONNX semantics (a BERT engine's cosine fell far below the ORT
  figure with them int8; docs/performance.md#int8-qdq-placement), so they stay float unless asked for.
- `gemv`: a matrix-vector product (ModelOpt: M or N is 1 at the calibration shapes), which cannot use
  tensor cores; Q/DQ there only adds work.
- `conv_channels`: ModelOpt's int8 Conv rule: input or output channels < 16, unless (group 1, a
  channel count % 8 == 0, the Conv reads a graph input or the other count is >= 16, square kernel) or
  (grouped, output channels % 8 == 0, kernel >= 3). So ModelOpt keeps e.g. a 3 -> 6 first Conv float
  but quantizes ResNet's 3 -> 64 stem.
- `output_layer`: a GEMM whose output is a graph output through at most bias/reshape ops (logits
  heads). Not in ModelOpt (its output-layer rule skips non-GEMM producers only); kept because a
  classifier's logits are what its top-1 gate reads and the layer is a negligible share of FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

GEMM_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
RULES = ("attention_bmm", "gemv", "conv_channels", "output_layer")
_PASS_THROUGH = ("Identity", "Cast")
_HEAD_TAIL = ("Add", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
# Ops that pass a convolution's output on unchanged in sign structure, for the residual-Add rule.
_CONV_EPILOGUE = ("Relu", "BatchNormalization", "Clip")


@dataclass
class QuantTarget:
    """One GEMM-like node and what its inputs are."""

    node: str
    op: str
    activations: list[str]  # input tensors to quantize per tensor (calibrated)
    weight: str | None  # the node's input tensor that carries a constant weight, or None
    axis: int | None = None  # the weight's per-channel (output-channel) axis, non-negative


# Bumped whenever plan_quantization's rules change which tensors get scales: a calibration cache made under
# another placement lacks some, so calibrate recalibrates instead of failing on it (2: residual Adds of two convs).
PLACEMENT_VERSION = 2


@dataclass
class QuantPlan:
    targets: list[QuantTarget]
    residual_adds: dict[str, str] = field(default_factory=dict)  # Add node -> its residual input tensor
    residual_convs: dict[str, str] = field(default_factory=dict)  # Add node -> the Conv feeding its other input
    residual_skip_convs: dict[str, str] = field(default_factory=dict)  # Add node -> the Conv behind the residual input
    excluded: dict[str, str] = field(default_factory=dict)  # GEMM node kept float by a rule -> the rule

    def activation_tensors(self, nodes: set[str] | None = None) -> list[str]:
        names = [t for target in self.targets if nodes is None or target.node in nodes for t in target.activations]
        names += [t for add, t in self.residual_adds.items() if nodes is None or add in nodes]
        return list(dict.fromkeys(names))


def weight_axis(op: str, rank: int, index: int, node: onnx.NodeProto | None = None) -> int:
    """Output-channel axis of a weight of this rank at input `index` of an `op` node."""
    attrs = {a.name: a.i for a in node.attribute} if node is not None else {}
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "Gemm":
        if index == 1:
            return 0 if attrs.get("transB") else 1
        return 1 if attrs.get("transA") else 0
    if rank < 2:
        return 0
    return rank - 1 if index == 1 else rank - 2  # MatMul


def constant_value(tensor: str, inits: dict[str, onnx.TensorProto], producers: dict[str, onnx.NodeProto]) -> np.ndarray | None:
    """The value of a constant tensor reached through Identity/Cast, as the node sees it; None if not constant."""
    if tensor in inits:
        return numpy_helper.to_array(inits[tensor])
    node = producers.get(tensor)
    if node is None:
        return None
    if node.op_type == "Constant":
        attr = next((a for a in node.attribute if a.name == "value"), None)
        return numpy_helper.to_array(attr.t) if attr is not None else None
    if node.op_type in _PASS_THROUGH:
        value = constant_value(node.input[0], inits, producers)
        if value is None or node.op_type == "Identity":
            return value
        to = next(a.i for a in node.attribute if a.name == "to")
        return value.astype(onnx.helper.tensor_dtype_to_np_dtype(to))
    return None


def plan_quantization(
    model: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]] | None = None,
    quantize_attention: bool = False,
    rules: tuple[str, ...] = RULES,
) -> QuantPlan:
    """Q/DQ targets by the placement table, minus the nodes the exclusion `rules` keep float (recorded).

    `shapes` (tensor -> shape at the calibration/opt sizes) feeds the `gemv` rule; without it that rule
    is skipped. Also the residual input of an Add whose other input comes from a convolution (ModelOpt's
    rule, which lets TensorRT fuse the Add into the convolution); where both come from convolutions, the one
    read elsewhere too, else input 1."""
    from trtforge.graph.index import name_all_nodes

    name_all_nodes(model)
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    graph_inputs = {i.name for i in model.graph.input} - set(inits)
    graph_outputs = {o.name for o in model.graph.output}
    constants = set(inits) | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    targets, excluded = [], {}
    for node in model.graph.node:
        if node.op_type not in GEMM_OPS:
            continue
        inputs = list(node.input[:2])
        values = [constant_value(t, inits, producers) if t else None for t in inputs]
        weight_index = next(
            (i for i in (1, 0) if i < len(values) and values[i] is not None and (node.op_type in ("MatMul", "Gemm") or i == 1)), None
        )
        weight = inputs[weight_index] if weight_index is not None else None
        activations = [t for i, t in enumerate(inputs) if t and values[i] is None]
        if not activations:
            continue  # constant x constant: folded away by TensorRT
        axis = weight_axis(node.op_type, values[weight_index].ndim, weight_index, node) if weight is not None else None
        rule = _exclusion(node, weight, values, shapes, graph_inputs, graph_outputs, consumers, constants, quantize_attention, rules)
        if rule:
            excluded[node.name] = rule
            continue
        targets.append(QuantTarget(node.name, node.op_type, activations, weight, axis))
    residual, residual_convs, skip_convs = {}, {}, {}
    for node in model.graph.node:
        if node.op_type != "Add" or len(node.input) != 2 or any(t in constants for t in node.input):
            continue
        convs = [_conv_behind(t, producers) for t in node.input]
        if convs[0] is not None and convs[1] is not None:
            if convs[0] is convs[1]:
                continue
            # Both branches are convolutions (ResNet's downsampling blocks, MobileNetV2's blocks after a stride).
            # TensorRT fuses the Add into one of them only if the other arrives int8; without a Q/DQ both wrote
            # fp16 and a separate kernel quantized the sum (docs/performance.md#int8-qdq-placement). The Q/DQ goes on the
            # branch read elsewhere too (already quantized for that reader: no new rounding, and the other conv
            # can fuse), else on input 1, the skip branch of torch exports (`out += identity`), which NVIDIA's
            # QAT ResNet recipe quantizes.
            read_elsewhere = [len(consumers.get(t, [])) > 1 for t in node.input]
            k = 1 if read_elsewhere[0] and not read_elsewhere[1] else 0  # the input whose conv the Add fuses into
            residual[node.name] = node.input[1 - k]
            residual_convs[node.name] = convs[k].name
            skip_convs[node.name] = convs[1 - k].name
        elif convs[0] is not None or convs[1] is not None:
            k = 0 if convs[0] is not None else 1
            residual[node.name] = node.input[1 - k]
            residual_convs[node.name] = convs[k].name
    return QuantPlan(targets, residual, residual_convs, skip_convs, excluded)


def _exclusion(
    node: onnx.NodeProto,
    weight: str | None,
    values: list,
    shapes: dict | None,
    graph_inputs: set[str],
    graph_outputs: set[str],
    consumers: dict[str, list],
    constants: set[str],
    quantize_attention: bool,
    rules: tuple[str, ...],
) -> str | None:
    if "attention_bmm" in rules and not quantize_attention and node.op_type in ("MatMul", "Gemm") and weight is None:
        return "attention_bmm"
    if "gemv" in rules and shapes and node.op_type in ("MatMul", "Gemm") and node.output[0] in shapes:
        out = shapes[node.output[0]]
        if weight is None:
            if len(out) < 2 or out[-1] == 1 or out[-2] == 1:
                return "gemv"
        elif len(out) < 3 and any(d == 1 for d in out):
            return "gemv"
    if (
        "conv_channels" in rules
        and node.op_type == "Conv"
        and weight is not None
        and _conv_unsupported(node, values[1].shape, graph_inputs)
    ):
        return "conv_channels"
    if "output_layer" in rules and _reaches_output(node.output[0], graph_outputs, consumers, constants, 3):
        return "output_layer"
    return None


def _conv_unsupported(node: onnx.NodeProto, shape: tuple[int, ...], graph_inputs: set[str]) -> bool:
    """ModelOpt's find_nodes_from_convs_to_exclude, int8 mode."""
    attrs = {a.name: a for a in node.attribute}
    out_ch, in_ch = shape[0], shape[1]
    group = attrs["group"].i if "group" in attrs else 1
    kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else list(shape[2:])
    if out_ch >= 16 and in_ch >= 16:
        return False
    if (
        group == 1
        and (out_ch % 8 == 0 or in_ch % 8 == 0)
        and (any(t in graph_inputs for t in node.input) or out_ch >= 16 or in_ch >= 16)
        and len(set(kernel)) == 1
    ):
        return False
    if group > 1 and out_ch % 8 == 0 and all(k >= 3 for k in kernel):
        return False
    return True


def _reaches_output(tensor: str, graph_outputs: set[str], consumers: dict[str, list], constants: set[str], depth: int) -> bool:
    if tensor in graph_outputs:
        return True
    users = consumers.get(tensor, [])
    if depth == 0 or len(users) != 1 or users[0].op_type not in _HEAD_TAIL:
        return False
    if users[0].op_type == "Add" and not all(t == tensor or t in constants for t in users[0].input):
        return False  # a residual Add, not a bias
    return _reaches_output(users[0].output[0], graph_outputs, consumers, constants, depth - 1)


def _conv_behind(tensor: str, producers: dict[str, Any]) -> onnx.NodeProto | None:
    node = producers.get(tensor)
    while node is not None and node.op_type in _CONV_EPILOGUE:
        node = producers.get(node.input[0])
    return node if node is not None and node.op_type in ("Conv", "ConvTranspose") else None
