"""Q/DQ insertion from scales, by the placement table (calibrate/placement.py).

INT8, symmetric, zero point 0. Activations per tensor (scale = amax / 127 from the calibration
cache); weights per output channel on the axis the plan computed for the weight's rank. A weight that
reaches its node through a Cast or comes from a Constant node is materialised as an fp32 initializer
of its own, then quantized like any other weight: otherwise it would stay float behind a one-sided
Q/DQ. Weights keep their fp32 values behind a QuantizeLinear -> DequantizeLinear pair, which TensorRT
folds at build time and which every TensorRT from 8.6 on accepts.

Nodes named in `float_nodes` (accuracy fallback) and the plan's excluded nodes get no Q/DQ at all, and a
residual Add gets its Q/DQ only while the convolution feeding it is quantized: the Q/DQ exists to let
TensorRT fuse the Add into an int8 convolution, and on a float one it only adds rounding.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.calibrate.placement import GEMM_OPS, QuantPlan, QuantTarget, constant_value, weight_axis  # noqa: F401 (re-exported)
from trtforge.core.errors import UserError
from trtforge.graph.index import toposorted

INT8_MAX = 127.0


def per_channel_scales(weight: np.ndarray, axis: int) -> np.ndarray:
    reduce_axes = tuple(i for i in range(weight.ndim) if i != axis)
    amax = np.abs(weight).max(axis=reduce_axes) if reduce_axes else np.abs(weight)
    return np.maximum(amax / INT8_MAX, 1e-12).astype(np.float32)


def quantized_nodes(plan: QuantPlan, float_nodes: set[str] | None = None) -> set[str]:
    """GEMM nodes that get Q/DQ (excluded nodes are never in the plan's targets)."""
    return {t.node for t in plan.targets} - (float_nodes or set())


def residual_adds(plan: QuantPlan, float_nodes: set[str] | None = None) -> dict[str, str]:
    """Residual Adds that keep their Q/DQ: those whose convolution stays quantized, and, where a convolution
    also produces the residual input, that one too (kept float, it must not be rounded to int8 after all)."""
    live = quantized_nodes(plan, float_nodes)

    def kept(add: str) -> bool:
        skip = plan.residual_skip_convs.get(add)
        return add not in (float_nodes or set()) and plan.residual_convs.get(add) in live and (skip is None or skip in live)

    return {add: t for add, t in plan.residual_adds.items() if kept(add)}


def insert_qdq(model: onnx.ModelProto, plan: QuantPlan, amax: dict[str, float], float_nodes: set[str] | None = None) -> onnx.ModelProto:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        raise UserError(f"Q/DQ with per-channel weights needs opset >= 13, the model has {opset}; re-export with --opset 17.")
    float_nodes = float_nodes or set()
    rewrite = _QdqRewrite(model, amax)
    live = quantized_nodes(plan, float_nodes)
    for target in plan.targets:
        if target.node not in live:
            continue
        node = rewrite.nodes_by_name[target.node]
        for i, tensor in enumerate(node.input[:2]):
            if tensor in target.activations:
                node.input[i] = rewrite.activation_dq(tensor)
        if target.weight is not None:
            rewrite.quantize_weight(target, node)
    for add_name, tensor in residual_adds(plan, float_nodes).items():
        node = rewrite.nodes_by_name[add_name]
        for i, t in enumerate(node.input):
            if t == tensor:
                node.input[i] = rewrite.activation_dq(tensor)
    out = rewrite.out
    out.graph.node.extend(rewrite.new_nodes)
    _prune_dead(out)
    return toposorted(out)


class _QdqRewrite:
    """The model copy being rewritten and the Q/DQ nodes made so far: an activation's pair is made once, shared by its
    consumers, and the graph's initializers and producers are read as they were before any was added."""

    def __init__(self, model: onnx.ModelProto, amax: dict[str, float]):
        self.out = onnx.ModelProto()
        self.out.CopyFrom(model)
        self.amax = amax
        self.nodes_by_name = {n.name: n for n in self.out.graph.node}
        self.inits = {i.name: i for i in self.out.graph.initializer}
        self.producers = {o: n for n in self.out.graph.node for o in n.output}
        self.new_nodes: list[onnx.NodeProto] = []
        self.dq_of: dict[str, str] = {}  # activation tensor -> its DequantizeLinear output (shared by consumers)

    def activation_dq(self, tensor: str) -> str:
        """The DequantizeLinear output standing for `tensor`, its per-tensor pair made on first use."""
        if tensor not in self.dq_of:
            if tensor not in self.amax:
                raise UserError(f"the calibration cache has no scale for tensor '{tensor}'; recalibrate without --from-cache or add it.")
            scale = max(float(self.amax[tensor]) / INT8_MAX, 1e-12)
            base = _safe(tensor)
            self.out.graph.initializer.extend(
                [
                    numpy_helper.from_array(np.array(scale, dtype=np.float32), f"{base}_scale"),
                    numpy_helper.from_array(np.array(0, dtype=np.int8), f"{base}_zero_point"),
                ]
            )
            self.new_nodes.append(
                helper.make_node(
                    "QuantizeLinear", [tensor, f"{base}_scale", f"{base}_zero_point"], [f"{base}_q"], name=f"{base}_QuantizeLinear"
                )
            )
            self.new_nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    [f"{base}_q", f"{base}_scale", f"{base}_zero_point"],
                    [f"{base}_dq"],
                    name=f"{base}_DequantizeLinear",
                )
            )
            self.dq_of[tensor] = f"{base}_dq"
        return self.dq_of[tensor]

    def quantize_weight(self, target: QuantTarget, node: onnx.NodeProto) -> None:
        """Put the target's weight behind a per-channel Q/DQ pair (a Cast-fed or Constant weight on an fp32 copy)."""
        assert target.weight is not None
        index = list(node.input).index(target.weight)
        value = constant_value(target.weight, self.inits, self.producers)
        if value is None:
            raise UserError(f"weight '{target.weight}' of node '{target.node}' is not a constant; re-run trtforge clean.")
        base = _safe(target.weight) + f"_{_safe(target.node)}"
        source = target.weight
        if not (source in self.inits and self.inits[source].data_type == onnx.TensorProto.FLOAT):
            source = f"{base}_w"  # Cast-fed or Constant weight: its own fp32 initializer
            self.out.graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), source))
        axis = target.axis if target.axis is not None else weight_axis(node.op_type, value.ndim, index, node)
        scales = per_channel_scales(value.astype(np.float32), axis)
        self.out.graph.initializer.extend(
            [
                numpy_helper.from_array(scales, f"{base}_wscale"),
                numpy_helper.from_array(np.zeros_like(scales, dtype=np.int8), f"{base}_wzero_point"),
            ]
        )
        self.new_nodes.append(
            helper.make_node(
                "QuantizeLinear",
                [source, f"{base}_wscale", f"{base}_wzero_point"],
                [f"{base}_wq"],
                name=f"{base}_wQuantizeLinear",
                axis=axis,
            )
        )
        self.new_nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{base}_wq", f"{base}_wscale", f"{base}_wzero_point"],
                [f"{base}_wdq"],
                name=f"{base}_wDequantizeLinear",
                axis=axis,
            )
        )
        node.input[index] = f"{base}_wdq"


def int8_gemm_nodes(model: onnx.ModelProto) -> set[str]:
    """GEMM nodes whose two inputs both come out of a DequantizeLinear: what really runs int8."""
    dq_outputs = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {
        n.name
        for n in model.graph.node
        if n.op_type in GEMM_OPS and len(n.input) >= 2 and n.input[0] in dq_outputs and n.input[1] in dq_outputs
    }


def _prune_dead(model: onnx.ModelProto) -> None:
    """Drop Constant/Cast/Identity nodes and initializers that nothing reads any more (replaced weights)."""
    outputs = {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    while True:
        used = {t for n in model.graph.node for t in n.input} | outputs
        dead = [n for n in model.graph.node if n.op_type in ("Constant", "Cast", "Identity") and not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            model.graph.node.remove(n)
    used = {t for n in model.graph.node for t in n.input} | outputs
    keep = [i for i in model.graph.initializer if i.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_." else "_" for c in name).strip("_") or "t"
