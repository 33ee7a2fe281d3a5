"""Q/DQ insertion from scales, by TensorRT's placement rules.

INT8, symmetric, zero point 0. Activations per tensor (scale = amax / 127 from the calibration
cache); weights per output channel with the axis set explicitly: Conv 0, ConvTranspose 1,
MatMul 1 (weight [K, N]), Gemm 0 with transB else 1. Weights keep their fp32 values behind a
QuantizeLinear -> DequantizeLinear pair, which TensorRT folds at build time and which every TensorRT
from 8.6 on accepts. Nodes named in `float_nodes` (accuracy fallback) get no Q/DQ at all.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.calibrate.collect import QuantPlan
from trtforge.errors import UserError
from trtforge.graph import toposorted

INT8_MAX = 127.0


def weight_axis(node: onnx.NodeProto) -> int:
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        return 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
    return 1  # MatMul weight [K, N]: one scale per output column


def per_channel_scales(weight: np.ndarray, axis: int) -> np.ndarray:
    reduce_axes = tuple(i for i in range(weight.ndim) if i != axis)
    amax = np.abs(weight).max(axis=reduce_axes) if reduce_axes else np.abs(weight)
    return np.maximum(amax / INT8_MAX, 1e-12).astype(np.float32)


def insert_qdq(model: onnx.ModelProto, plan: QuantPlan, amax: dict[str, float], float_nodes: set[str] | None = None) -> onnx.ModelProto:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        raise UserError(f"Q/DQ with per-channel weights needs opset >= 13, the model has {opset}; re-export with --opset 17.")
    float_nodes = float_nodes or set()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes_by_name = {n.name: n for n in out.graph.node}
    inits = {i.name: i for i in out.graph.initializer}
    new_nodes: list[onnx.NodeProto] = []
    dq_of: dict[str, str] = {}  # activation tensor -> its DequantizeLinear output (shared by consumers)

    def activation_dq(tensor: str) -> str:
        if tensor not in dq_of:
            if tensor not in amax:
                raise UserError(f"the calibration cache has no scale for tensor '{tensor}'; recalibrate without --from-cache or add it.")
            scale = max(float(amax[tensor]) / INT8_MAX, 1e-12)
            base = _safe(tensor)
            out.graph.initializer.extend([
                numpy_helper.from_array(np.array(scale, dtype=np.float32), f"{base}_scale"),
                numpy_helper.from_array(np.array(0, dtype=np.int8), f"{base}_zero_point"),
            ])
            new_nodes.append(helper.make_node("QuantizeLinear", [tensor, f"{base}_scale", f"{base}_zero_point"], [f"{base}_q"], name=f"{base}_QuantizeLinear"))
            new_nodes.append(helper.make_node("DequantizeLinear", [f"{base}_q", f"{base}_scale", f"{base}_zero_point"], [f"{base}_dq"], name=f"{base}_DequantizeLinear"))
            dq_of[tensor] = f"{base}_dq"
        return dq_of[tensor]

    for target in plan.targets:
        if target.node in float_nodes:
            continue
        node = nodes_by_name[target.node]
        for i, tensor in enumerate(node.input[:2]):
            if tensor in target.activations:
                node.input[i] = activation_dq(tensor)
        if target.weight and target.weight in inits:
            axis = weight_axis(node)
            weight = numpy_helper.to_array(inits[target.weight])
            scales = per_channel_scales(weight, axis)
            base = _safe(target.weight) + f"_{_safe(target.node)}"
            out.graph.initializer.extend([
                numpy_helper.from_array(scales, f"{base}_wscale"),
                numpy_helper.from_array(np.zeros_like(scales, dtype=np.int8), f"{base}_wzero_point"),
            ])
            new_nodes.append(helper.make_node("QuantizeLinear", [target.weight, f"{base}_wscale", f"{base}_wzero_point"], [f"{base}_wq"], name=f"{base}_wQuantizeLinear", axis=axis))
            new_nodes.append(helper.make_node("DequantizeLinear", [f"{base}_wq", f"{base}_wscale", f"{base}_wzero_point"], [f"{base}_wdq"], name=f"{base}_wDequantizeLinear", axis=axis))
            index = list(node.input).index(target.weight)
            node.input[index] = f"{base}_wdq"
    for add_name, tensor in plan.residual_adds.items():
        if add_name in float_nodes:
            continue
        node = nodes_by_name[add_name]
        for i, t in enumerate(node.input):
            if t == tensor:
                node.input[i] = activation_dq(tensor)
    out.graph.node.extend(new_nodes)
    return toposorted(out)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_." else "_" for c in name).strip("_") or "t"
