"""The GEMM pass: an fp16 MatMul by a constant weight (and the bias added to it) becomes one TrtforgeGemm node,
trtforge's cuBLASLt plugin (trtforge/native/gemm_plugin.cpp), which times cuBLASLt's candidate kernels for each shape
instead of taking TensorRT 8.6's pick.

Why it exists: on the H200, TensorRT 8.6's own fp16 GEMMs in BERT-base ran at ~500 TFLOP/s for the attention output
projection and ~670-720 for QKV and FC2 (benchmarks/RESULTS.md, 2026-12-03 kernel list), while cuBLASLt 13 carries
newer Hopper kernels. Whether the plugin is faster is measured there per build (`--fuse-gemm on`); `auto` leaves the
graph alone until a measurement says otherwise. Run after the GELU and skip-LayerNorm passes: those take their GEMMs
and biases first (TrtforgeGemmGelu; the dense bias into skip-LayerNorm), this one takes the MatMuls left.

Only graph surgery here; the arithmetic is cuBLASLt's. No numbers are needed to decide (the replacement computes the
same product in the same fp16 type); tests/test_gemm_fusion.py proves the rewrite through an ORT emulation of the
plugin's contract."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from trtforge.fusion.attention import PassReport, _Graph, drop_producers, finish_plugin_graph, plugin_with_cast

PLUGIN = "TrtforgeGemm"
PLUGIN_VERSION = "1"


def _bias_after(g: _Graph, y: str, width: int) -> tuple[np.ndarray, str] | None:
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


def gemm_candidates(model: onnx.ModelProto) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(what the pass takes: node, x, W, bias or None, the tensor the plugin writes; what it refuses, with why) over
    the MatMuls whose second input is a constant."""
    g = _Graph(model)
    taken, refused = [], []
    for node in model.graph.node:
        if node.op_type != "MatMul" or len(node.input) != 2:
            continue
        w = g.const(node.input[1])
        if w is None:
            continue  # activation x activation (attention's BMMs): not a projection
        reason = None
        if g.const(node.input[0]) is not None:
            reason = "both operands are constants (folded by the builder)"
        elif w.ndim != 2:
            reason = f"the weight is {w.ndim}-D; the plugin takes a [K, N] matrix"
        elif w.dtype != np.float16:
            reason = f"the weight is {w.dtype}; the plugin is fp16 (an fp32 island of this build stays TensorRT's)"
        if reason:
            refused.append({"node": node.name, "reason": reason})
            continue
        bias = _bias_after(g, node.output[0], w.shape[1])
        taken.append({"node": node, "x": node.input[0], "w": w, "bias": None if bias is None else bias[0],
                      "y": node.output[0] if bias is None else bias[1]})
    return taken, refused


def fuse_gemm(model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None,
              observe_model: onnx.ModelProto | None = None) -> tuple[onnx.ModelProto, PassReport]:
    """Every fp16 MatMul by a constant [K, N] weight, with the constant bias added to it where only that Add reads
    it, as one TrtforgeGemm node. feeds/observe_model: the elementwise passes' common arguments, unused (nothing is
    observed: the node computes the product it replaces, in its type)."""
    taken, refused = gemm_candidates(model)
    report = PassReport([], refused)
    if not taken:
        return model, report
    out = drop_producers(model, {c["y"] for c in taken} | {c["node"].output[0] for c in taken})
    for i, c in enumerate(taken):
        w, bias = c["w"], c["bias"]
        attrs: dict[str, Any] = {"weight": numpy_helper.from_array(np.ascontiguousarray(w).reshape(-1), f"fused_gemm_{i}/weight"),
                                 "k": int(w.shape[0]), "n": int(w.shape[1])}
        if bias is not None:
            attrs["bias"] = numpy_helper.from_array(bias, f"fused_gemm_{i}/bias")
        name = f"fused_gemm_{i}/gemm"
        out.graph.node.extend(plugin_with_cast(PLUGIN, PLUGIN_VERSION, [c["x"]], c["y"], np.float16, np.float16, name,
                                               f"fused_gemm_{i}", **attrs))
        report.replaced.append({"node": c["node"].name, "plugin": f"{PLUGIN} v{PLUGIN_VERSION}", "k": int(w.shape[0]),
                                "n": int(w.shape[1]), "bias_folded": bias is not None, "plugin_node": name})
    return finish_plugin_graph(out), report
