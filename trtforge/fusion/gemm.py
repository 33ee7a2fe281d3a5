"""The GEMM pass: an fp16 MatMul by a constant weight (and the bias added to it), or an ONNX Gemm of the same kind (GPT-2's
Conv1D exports as one), becomes one TrtforgeGemm node,
trtforge's cuBLASLt plugin (trtforge/native/gemm_plugin.cpp), which times cuBLASLt's candidate kernels for each shape
instead of taking TensorRT 8.6's pick.

Why it exists: TensorRT 8.6's own fp16 GEMMs in BERT-base run below what cuBLASLt 13's newer Hopper kernels reach,
and with the plugin's timed pick BERT-base fp16 ran faster (docs/performance.md#fusion-passes-auto-modes), so `auto`
applies it to fp16 builds (trtforge.fusion.step.GEMM_PASS). Run after the GELU and skip-LayerNorm passes: those take
their GEMMs and biases first (TrtforgeGemmGelu; the dense bias into skip-LayerNorm), this one takes the MatMuls left.
A Gemm is taken where it is that same product: alpha 1, no transposed input (a transposed constant weight is transposed
here, once), and a constant bias C of [N] or [1, N] at beta 1.

The weights travel as node attributes (the plugin's fields), which ONNX cannot move to external data: a weight shared
by several MatMuls (ALBERT) is refused rather than copied per node, and the pass stops short of the 2 GB protobuf
limit (ATTRIBUTE_BUDGET, counting the attributes already in the graph, e.g. TrtforgeGemmGelu's).

Only graph surgery here; the arithmetic is cuBLASLt's. No numbers are needed to decide (the replacement computes the
same product in the same fp16 type); tests/test_gemm_fusion.py proves the rewrite through an ORT emulation of the
plugin's contract."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.core.onnxio import PROTOBUF_LIMIT
from trtforge.fusion.index import GraphIndex, PassReport, drop_producers, finish_plugin_graph, plugin_with_cast

PLUGIN = "TrtforgeGemm"
PLUGIN_VERSION = "1"
ATTRIBUTE_BUDGET = PROTOBUF_LIMIT * 3 // 4  # bytes of tensor attributes a graph may hold inline (the rest is headroom)


def attribute_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the tensors held in node attributes (plugin fields), which stay inside the .onnx file."""
    return sum(len(a.t.raw_data) or a.t.ByteSize() for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR)


def plugin_weight(g: GraphIndex, mm: onnx.NodeProto) -> tuple[np.ndarray | None, str | None]:
    """(MatMul mm's weight, None) when a GEMM plugin's fields can take it: a constant fp16 [K, N] matrix that mm alone
    reads, multiplying an activation; else (None, why). Both TrtforgeGemm and TrtforgeGemmGelu hold it as a field."""
    w = g.const(mm.input[1]) if len(mm.input) >= 2 else None
    if w is None:
        return None, "the weight is not a constant"
    if g.const(mm.input[0]) is not None:
        return None, "both operands are constants (folded by the builder)"
    if w.ndim != 2:
        return None, f"the weight is {w.ndim}-D; the plugin takes a [K, N] matrix"
    if w.dtype != np.float16:
        return None, f"the weight is {w.dtype}; the plugin is fp16 (an fp32 island of this build stays TensorRT's)"
    readers = len(g.consumers.get(mm.input[1], []))
    if readers > 1:
        return None, f"its weight is read by {readers} nodes; the plugin would copy it into each (TensorRT keeps one)"
    return w, None


def weight_fields(w: np.ndarray, bias: np.ndarray | None, prefix: str) -> dict[str, Any]:
    """The plugin fields of a [K, N] weight (row-major, flattened) and its optional [N] bias, in fp16."""
    fields: dict[str, Any] = {
        "weight": numpy_helper.from_array(np.ascontiguousarray(w, np.float16).reshape(-1), f"{prefix}/weight"),
        "k": int(w.shape[0]),
        "n": int(w.shape[1]),
    }
    if bias is not None:
        fields["bias"] = numpy_helper.from_array(bias.astype(np.float16), f"{prefix}/bias")
    return fields


def gemm_operands(g: GraphIndex, gemm: onnx.NodeProto) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """(W as [K, N], its bias C as [N] or None, None) when ONNX Gemm node gemm is a plugin GEMM: x @ W + C with alpha 1,
    beta 1 (where C is given) and x not transposed; else (None, None, why)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in gemm.attribute}
    if attrs.get("transA", 0):
        return None, None, "the Gemm transposes its input (transA); the plugin takes x as it is"
    if attrs.get("alpha", 1.0) != 1.0:
        return None, None, f"the Gemm scales the product (alpha {attrs['alpha']:g}); the plugin computes x @ W"
    w, why = plugin_weight(g, gemm)
    if w is None:
        return None, None, why
    w = np.ascontiguousarray(w.T) if attrs.get("transB", 0) else w
    if len(gemm.input) < 3 or not gemm.input[2]:
        return w, None, None
    c = g.const(gemm.input[2])
    if c is None:
        return None, None, "the Gemm's bias C is not a constant"
    if c.dtype != np.float16 or c.shape not in ((w.shape[1],), (1, w.shape[1])):
        return None, None, f"the Gemm's bias C is {c.dtype} {list(c.shape)}; the plugin's epilogue adds an fp16 [N] bias"
    if attrs.get("beta", 1.0) != 1.0:
        return None, None, f"the Gemm scales its bias (beta {attrs['beta']:g}); the plugin adds it as it is"
    return w, c.reshape(-1), None


def _bias_after(g: GraphIndex, y: str, width: int) -> tuple[np.ndarray, str] | None:
    """(bias, the Add's output) when MatMul output y's only reader is Add(y, constant [width]) and y is no graph output."""
    readers = g.consumers.get(y, [])
    if len(readers) != 1 or y in g.outputs or readers[0].op_type != "Add":
        return None
    add = readers[0]
    other = [i for i in add.input if i != y]
    if len(other) != 1 or len(add.input) != 2:
        return None
    bias = g.const(other[0])
    if bias is None or bias.dtype != np.float16 or bias.shape != (width,):
        return None
    return bias, add.output[0]


def gemm_candidates(model: onnx.ModelProto, budget: int = ATTRIBUTE_BUDGET) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(what the pass takes: node, x, W, bias or None, the tensor the plugin writes; what it refuses, with why) over
    the MatMuls and Gemms whose second input is a constant. budget: bytes of weights the graph may take into attributes."""
    g = GraphIndex(model)
    taken, refused = [], []
    room = budget - attribute_bytes(model)
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or g.const(node.input[1]) is None:
            continue  # activation x activation (attention's BMMs): not a projection
        own_bias = None
        if node.op_type == "Gemm":
            w, own_bias, reason = gemm_operands(g, node)
        else:
            w, reason = plugin_weight(g, node)
        if w is not None and w.nbytes > room:
            reason = "its weight would take the graph's plugin fields past ONNX's 2 GB protobuf limit"
        if reason:
            refused.append({"node": node.name, "reason": reason})
            continue
        bias = (own_bias, node.output[0]) if own_bias is not None else _bias_after(g, node.output[0], w.shape[1])
        room -= w.nbytes + (bias[0].nbytes if bias is not None else 0)
        taken.append(
            {
                "node": node,
                "x": node.input[0],
                "w": w,
                "bias": None if bias is None else bias[0],
                "y": node.output[0] if bias is None else bias[1],
            }
        )
    return taken, refused


def fuse_gemm(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None, observe_model: onnx.ModelProto | None = None
) -> tuple[onnx.ModelProto, PassReport]:
    """Every fp16 MatMul (or plain Gemm) by a constant [K, N] weight, with the constant bias added to it where only that
    Add reads it (a Gemm's own C), as one TrtforgeGemm node. feeds/observe_model: the elementwise passes' common arguments, unused (nothing is
    observed: the node computes the product it replaces, in its type)."""
    taken, refused = gemm_candidates(model)
    report = PassReport([], refused)
    if not taken:
        return model, report
    out = drop_producers(model, {c["y"] for c in taken} | {c["node"].output[0] for c in taken})
    for i, c in enumerate(taken):
        w, bias = c["w"], c["bias"]
        name = f"fused_gemm_{i}/gemm"
        out.graph.node.extend(
            plugin_with_cast(
                PLUGIN,
                PLUGIN_VERSION,
                [c["x"]],
                c["y"],
                np.float16,
                np.float16,
                name,
                f"fused_gemm_{i}",
                **weight_fields(w, bias, f"fused_gemm_{i}"),
            )
        )
        report.replaced.append(
            {
                "node": c["node"].name,
                "op": c["node"].op_type,
                "plugin": f"{PLUGIN} v{PLUGIN_VERSION}",
                "k": int(w.shape[0]),
                "n": int(w.shape[1]),
                "bias_folded": bias is not None,
                "plugin_node": name,
            }
        )
    return finish_plugin_graph(out), report
