"""Skip-LayerNorm fusion: each residual `LayerNormalization(a + b)` (BERT, RoBERTa, ViT, GPT-2 blocks), with the
bias Add of the dense layer in front of it, becomes one `CustomSkipLayerNormPluginDynamic` node of TensorRT 8.6's
plugin library (version 2, the variable-sequence-length one: it takes any shape whose volume is a multiple of
the hidden size, so the tensors keep the graph's [B, S, E] layout and need no reshape).

Why: in the fp16 BERT-base engine on the H200 (TensorRT 8.6, 16x512) LayerNorm took 0.33 ms and Myelin's
region-boundary copies and casts around the plugins another 0.41 (benchmarks/RESULTS.md, w4): trtforge's fp16
conversion keeps LayerNormalization fp32, so every residual block reads its fp16 sum through a Cast and writes
a Cast back. The plugin adds, normalises and scales in fp16 in one memory-bound kernel, casts included.

The plugin computes LN(a + b + bias) with var = E[x^2] - mean^2 and epsilon = the machine epsilon of its type
(9.8e-4 in fp16, whatever the model's epsilon; TensorRT's skipLayerNormKernel.cu), so a candidate is kept only
when that formula, recomputed in numpy on the activations ONNX Runtime observes, matches the graph's output
(TOLERANCE).
Matching is structural: LayerNormalization over the last axis with constant scale and bias, its input an Add of
two same-shaped computed tensors (through at most one Cast), its output through at most one Cast; every tensor
in between read by nothing else. Pure onnx + numpy; the plugin runs only in TensorRT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.fusion.attention import _Graph, observe, prune

PLUGIN = "CustomSkipLayerNormPluginDynamic"
PLUGIN_VERSION = "2"
PLUGIN_DOMAIN = "trt.plugins"
PLUGIN_EPSILON = {np.dtype(np.float16): float(np.finfo(np.float16).eps), np.dtype(np.float32): float(np.finfo(np.float32).eps)}
# Relative L2 of the plugin's formula against the graph's LayerNorm on the observed activations. In fp16 the graph's
# own output rounding is ~3e-4 and the plugin's epsilon (9.8e-4) shifts the output by ~eps / (2 var): 3e-3 admits
# sums with variance above ~0.2 (the real MiniLM's: 0.8-1.3e-3 in all 12 blocks, 2.9e-4 of it rounding).
TOLERANCE = {np.dtype(np.float16): 3e-3, np.dtype(np.float32): 1e-3}


@dataclass
class SkipLnCandidate:
    node: str  # the LayerNormalization
    a: str = ""  # plugin input (the dense output before its bias, when the bias is folded)
    b: str = ""  # plugin skip input (the residual)
    y: str = ""  # the tensor the plugin writes (LayerNorm's output, or the Cast after it)
    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None
    bias: np.ndarray | None = None
    bias_input: str | None = None  # which Add operand the bias was added to
    removed: list[str] = field(default_factory=list)  # outputs of the nodes the plugin replaces
    error: float | None = None  # rel-L2 of the plugin's formula vs the graph, observed
    dtype: Any = np.float32  # the type the plugin runs in (the Add's)
    y_dtype: Any = np.float32
    reason: str | None = None


@dataclass
class SkipLnReport:
    replaced: list[dict[str, Any]]
    refused: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"replaced": self.replaced, "refused": self.refused}


def _only_consumer(g: _Graph, tensor: str) -> onnx.NodeProto | None:
    """The one node reading `tensor` (Shape included), when it is not also a graph output."""
    users = g.consumers.get(tensor, [])
    return users[0] if len(users) == 1 and tensor not in {o.name for o in g.model.graph.output} else None


def find_skip_layernorms(model: onnx.ModelProto) -> list[SkipLnCandidate]:
    g = _Graph(model)
    found = []
    for i, node in enumerate(model.graph.node):
        if node.op_type != "LayerNormalization":
            continue
        cand = SkipLnCandidate(node=node.name or f"LayerNormalization#{i}")
        found.append(cand)
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        gamma = g.const(node.input[1])
        beta = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if gamma is None or gamma.ndim != 1 or (beta is not None and beta.shape != gamma.shape):
            cand.reason = "LayerNorm scale/bias are not constant vectors"
            continue
        if axis != -1:
            cand.reason = f"LayerNorm over axis {axis}; the plugin normalises the last axis"
            continue
        if any(t and (g.consumers.get(t) or t in {o.name for o in g.model.graph.output}) for t in node.output[1:]):
            cand.reason = "the LayerNorm's mean or inverse deviation output is read; the plugin has only the normalised one"
            continue
        removed = [node.output[0]]
        x = node.input[0]
        producer = g.producer.get(x)
        if producer is not None and producer.op_type == "Cast":
            if _only_consumer(g, x) is None:
                cand.reason = "the Cast before the LayerNorm is read elsewhere"
                continue
            removed.append(x)
            x = producer.input[0]
            producer = g.producer.get(x)
        if producer is None or producer.op_type != "Add" or any(g.const(t) is not None for t in producer.input):
            cand.reason = "the LayerNorm's input is not a residual Add of two computed tensors"
            continue
        if _only_consumer(g, x) is None:
            cand.reason = f"the residual sum '{x}' is read elsewhere"
            continue
        removed.append(x)
        y = node.output[0]
        after = _only_consumer(g, y)
        if after is not None and after.op_type == "Cast" and len(node.output) == 1:
            removed.append(after.output[0])
            y = after.output[0]
        cand.a, cand.b = producer.input[0], producer.input[1]
        cand.y, cand.removed = y, removed
        cand.gamma = gamma
        cand.beta = beta if beta is not None else np.zeros_like(gamma)
        for operand in (producer.input[0], producer.input[1]):  # the dense layer's bias, if the Add before is one
            bias_add = g.producer.get(operand)
            if bias_add is None or bias_add.op_type != "Add" or _only_consumer(g, operand) is None:
                continue
            consts = [t for t in bias_add.input if g.const(t) is not None]
            if len(consts) == 1 and g.const(consts[0]).shape == gamma.shape:
                cand.bias = g.const(consts[0])
                cand.bias_input = operand
                break
    return found


def plugin_layernorm(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, gamma: np.ndarray, beta: np.ndarray,
                     dtype: Any) -> np.ndarray:
    """What the plugin computes (skipLayerNormKernel.cu), in float64: var = E[x^2] - mean^2, epsilon = the type's."""
    x = a.astype(np.float64) + b.astype(np.float64) + (0.0 if bias is None else bias.astype(np.float64))
    mean = x.mean(axis=-1, keepdims=True)
    var = (x * x).mean(axis=-1, keepdims=True) - mean * mean
    return (x - mean) / np.sqrt(np.maximum(var, 0.0) + PLUGIN_EPSILON[np.dtype(dtype)]) * gamma + beta


def verify(model: onnx.ModelProto, cands: list[SkipLnCandidate], feeds: dict[str, np.ndarray]) -> None:
    live = [c for c in cands if c.reason is None]
    if not live:
        return
    g = _Graph(model)
    names = sorted({t for c in live for t in (c.a, c.b, c.y)})
    values = observe(model, feeds, names)
    for c in live:
        a, b = values[c.a], values[c.b]
        if a.shape != b.shape or a.dtype != b.dtype or a.shape[-1:] != c.gamma.shape:
            c.reason = f"the residual operands differ in shape or type ({list(a.shape)} {a.dtype}, {list(b.shape)} {b.dtype})"
            continue
        if a.dtype not in (np.float16, np.float32):
            c.reason = f"the residual sum is {a.dtype}; the plugin runs fp16 or fp32"
            continue
        c.dtype, c.y_dtype = a.dtype, values[c.y].dtype
        y = values[c.y].astype(np.float64)
        want = plugin_layernorm(a, b, None, c.gamma, c.beta, c.dtype)  # the bias is already inside a or b
        c.error = float(np.linalg.norm(want - y) / max(np.linalg.norm(y), 1e-30))
        tolerance = TOLERANCE[np.dtype(c.dtype)]
        if c.error > tolerance:
            c.reason = (f"the plugin's LayerNorm (epsilon {PLUGIN_EPSILON[np.dtype(c.dtype)]:.2g}) differs from the graph's "
                        f"by rel-L2 {c.error:.2g} on the observed activations (> {tolerance:g})")
            continue
        if c.bias is not None:  # fold it: the plugin reads the dense output before its bias Add
            bias_add = g.producer[c.bias_input]
            pre = next(t for t in bias_add.input if g.const(t) is None)
            c.removed.append(c.bias_input)
            if c.bias_input == c.a:
                c.a = pre
            else:
                c.b = pre


def fuse_skip_layernorm(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                        observe_model: onnx.ModelProto | None = None) -> tuple[onnx.ModelProto, SkipLnReport]:
    """Replace every verified residual LayerNorm by one plugin node. `observe_model`: the ONNX Runtime-runnable
    graph the numbers come from when `model` already holds plugin nodes; the tensors matched keep their names."""
    cands = find_skip_layernorms(model)
    verify(observe_model if observe_model is not None else model, cands, feeds)
    report = SkipLnReport([], [{"node": c.node, "reason": c.reason} for c in cands if c.reason is not None])
    accepted = [c for c in cands if c.reason is None]
    if not accepted:
        return model, report
    out = onnx.ModelProto()
    out.CopyFrom(model)
    removed = {t for c in accepted for t in c.removed}
    kept = [n for n in out.graph.node if not (set(n.output) & removed)]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    for i, c in enumerate(accepted):
        name = f"fused_skip_layernorm_{i}/skip_layernorm"
        attrs: dict[str, Any] = {"type_id": 1 if c.dtype == np.float16 else 0,  # the plugin copies its weights in its own type
                                 "gamma": numpy_helper.from_array(c.gamma.astype(c.dtype), f"{name}/gamma"),
                                 "beta": numpy_helper.from_array(c.beta.astype(c.dtype), f"{name}/beta")}
        if c.bias is not None:
            attrs["bias"] = numpy_helper.from_array(c.bias.astype(c.dtype), f"{name}/bias")
        plugin_out = c.y if c.y_dtype == c.dtype else f"fused_skip_layernorm_{i}/out"
        out.graph.node.append(helper.make_node(PLUGIN, [c.a, c.b], [plugin_out], name=name, domain=PLUGIN_DOMAIN,
                                               plugin_version=PLUGIN_VERSION, plugin_namespace="", **attrs))
        if plugin_out != c.y:
            out.graph.node.append(helper.make_node("Cast", [plugin_out], [c.y], name=f"fused_skip_layernorm_{i}/cast",
                                                   to=helper.np_dtype_to_tensor_dtype(np.dtype(c.y_dtype))))
        report.replaced.append({"node": c.node, "plugin": f"{PLUGIN} v{PLUGIN_VERSION}", "bias_folded": c.bias is not None,
                                "rel_l2": c.error, "type": str(np.dtype(c.dtype)), "plugin_node": name})
    prune(out)
    from trtforge.graph import toposorted

    out = toposorted(out)
    if not any(o.domain == PLUGIN_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    return out, report
