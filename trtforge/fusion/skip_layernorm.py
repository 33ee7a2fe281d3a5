"""Skip-LayerNorm fusion: each residual `LayerNormalization(a + b)` (BERT, RoBERTa, ViT, GPT-2 blocks), with the
bias Add of the dense layer in front of it, becomes one `CustomSkipLayerNormPluginDynamic` node of TensorRT 8.6's
plugin library (version 2, the variable-sequence-length one: it takes any shape whose volume is a multiple of
the hidden size, so the tensors keep the graph's [B, S, E] layout and need no reshape).

Why: in the fp16 BERT-base engine on TensorRT 8.6, LayerNorm and Myelin's region-boundary copies and casts around the
plugins take a measurable share of the time (docs/performance.md#fusion-passes-auto-modes): trtforge's fp16
conversion keeps LayerNormalization fp32, so every residual block reads its fp16 sum through a Cast and writes
a Cast back. The plugin adds, normalises and scales in fp16 in one memory-bound kernel, casts included.

The plugin computes LN(a + b + bias) its own way (TensorRT's skipLayerNormKernel.cu): sums and statistics in its
type (fp16 in fp16 engines), var = E[x^2] - mean^2, and for hidden sizes 768/1024 an epsilon of the type's machine
epsilon (9.8e-4 in fp16) whatever the model's. So a candidate is kept only when that arithmetic, replayed operation
by operation in numpy (`plugin_layernorm`) on the activations ONNX Runtime observes, matches the graph's output
(TOLERANCE); where E[x^2] - mean^2 cancels (a large mean against a small spread) it does not, and the block stays.
Matching is structural: LayerNormalization over the last axis with constant scale and bias, its input an Add of
two same-shaped computed tensors (through at most one Cast), its output through at most one Cast; every tensor
in between read by nothing else. Pure onnx + numpy; the plugin runs only in TensorRT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from trtforge.fusion.index import GraphIndex, Observation, PassReport, attr, drop_producers, finish_plugin_graph, observe, plugin_with_cast

PLUGIN = "CustomSkipLayerNormPluginDynamic"
PLUGIN_VERSION = "2"
# Relative L2 of the plugin's arithmetic against the graph's LayerNorm on the observed activations. In fp16 the
# graph's own output rounding is ~3e-4, the plugin's fp16 sums add ~3e-4 (the real MiniLM, hidden 384: 6.5-7.2e-4 in
# all 12 blocks) and at hidden 768/1024 its epsilon shifts the output by ~eps / (2 var): 3e-3 admits variances above ~0.2.
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
    pre_bias: str | None = None  # the tensor the bias is added to (the plugin reads it when the bias is folded)
    removed: list[str] = field(default_factory=list)  # outputs of the nodes the plugin replaces
    error: float | None = None  # rel-L2 of the plugin's formula vs the graph, observed
    dtype: Any = np.float32  # the type the plugin runs in (the Add's)
    y_dtype: Any = np.float32
    reason: str | None = None


def _only_consumer(g: GraphIndex, tensor: str) -> onnx.NodeProto | None:
    """The one node reading `tensor` (Shape included), when it is not also a graph output."""
    users = g.consumers.get(tensor, [])
    return users[0] if len(users) == 1 and tensor not in g.outputs else None


def find_skip_layernorms(model: onnx.ModelProto) -> list[SkipLnCandidate]:
    g = GraphIndex(model)
    found = []
    for i, node in enumerate(model.graph.node):
        if node.op_type != "LayerNormalization":
            continue
        cand = SkipLnCandidate(node=node.name or f"LayerNormalization#{i}")
        found.append(cand)
        axis = attr(node, "axis", -1)
        gamma = g.const(node.input[1])
        beta = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if gamma is None or gamma.ndim != 1 or (beta is not None and beta.shape != gamma.shape):
            cand.reason = "LayerNorm scale/bias are not constant vectors"
            continue
        if axis != -1:
            cand.reason = f"LayerNorm over axis {axis}; the plugin normalises the last axis"
            continue
        if any(t and (g.consumers.get(t) or t in g.outputs) for t in node.output[1:]):
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
                cand.pre_bias = next(t for t in bias_add.input if t != consts[0])
                break
    return found


def _block_sum(values: np.ndarray, dtype: Any) -> np.ndarray:
    """cub::BlockReduce over the threads' partial sums [rows, threads], in `dtype`: a pairwise tree inside each warp
    of 32 (shuffle-down by 1, 2, 4, 8, 16), then the warps' totals added in order by thread 0."""
    rows, threads = values.shape
    warps = -(-threads // 32)
    v = np.zeros((rows, warps * 32), dtype)
    v[:, :threads] = values
    v = v.reshape(rows, warps, 32)
    while v.shape[-1] > 1:
        v = (v[..., 0::2] + v[..., 1::2]).astype(dtype)
    total = v[:, 0, 0]
    for w in range(1, warps):
        total = (total + v[:, w, 0]).astype(dtype)
    return total


def plugin_layernorm(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, gamma: np.ndarray, beta: np.ndarray, dtype: Any) -> np.ndarray:
    """What the plugin computes, operation by operation in its type (TensorRT's skipLayerNormKernel.cu and
    common.cuh): x = a + b (+ bias); each thread sums x/ld and x^2/ld of its elements, the block adds the threads'
    sums (_block_sum); var = E[x^2] - mean^2; out = gamma * (x - mean) * rsqrt(var + eps) + beta. Hidden sizes 768
    and 1024 take the vectorised kernel (16-byte vectors per thread, eps = the type's machine epsilon); others the
    256-thread kernel (element i on thread i mod 256, no epsilon). In fp16 every sum is fp16."""
    t = np.dtype(dtype)
    ld = a.shape[-1]
    x = (a.reshape(-1, ld).astype(t) + b.reshape(-1, ld).astype(t)).astype(t)
    if bias is not None:
        x = (x + bias.astype(t)).astype(t)
    rld = t.type(1) / t.type(ld)
    part = (rld * x).astype(t)
    square = (part * x).astype(t)
    if ld in (768, 1024):
        vpt, eps = 16 // t.itemsize, float(np.finfo(t).eps)
        lanes = (part.reshape(len(x), ld // vpt, vpt), square.reshape(len(x), ld // vpt, vpt))
    else:
        threads = 256 if ld > 32 else 32
        vpt, eps = -(-ld // threads), 0.0
        padded = [np.zeros((len(x), vpt * threads), t) for _ in range(2)]
        padded[0][:, :ld], padded[1][:, :ld] = part, square
        lanes = tuple(p.reshape(len(x), vpt, threads).transpose(0, 2, 1) for p in padded)  # thread i: i, i + 256, ...
    sums = []
    for lane in lanes:
        acc = np.zeros(lane.shape[:2], t)
        for k in range(lane.shape[2]):
            acc = (acc + lane[..., k]).astype(t)
        sums.append(_block_sum(acc, t))
    mean, mean_square = sums
    var = (mean_square - (mean * mean).astype(t)).astype(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        rsigma = (1.0 / np.sqrt((var + t.type(eps)).astype(t).astype(np.float64))).astype(t)
    centred = (x - mean[:, None]).astype(t)
    out = (((gamma.astype(t) * centred).astype(t) * rsigma[:, None]).astype(t) + beta.astype(t)).astype(t)
    return out.reshape(a.shape).astype(np.float64)


def _names(cands: list[SkipLnCandidate]) -> list[str]:
    return sorted({t for c in cands if c.reason is None for t in (c.a, c.b, c.y)})


def observed_names(model: onnx.ModelProto) -> set[str]:
    """The tensors fuse_skip_layernorm reads, for an observation shared with other passes."""
    return set(_names(find_skip_layernorms(model)))


def verify(
    model: onnx.ModelProto, cands: list[SkipLnCandidate], feeds: dict[str, np.ndarray], observation: Observation | None = None
) -> None:
    live = [c for c in cands if c.reason is None]
    if not live:
        return
    names = _names(live)
    values = observation.values(names) if observation is not None else observe(model, feeds, names)
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
        if not c.error <= tolerance:  # NaN too: E[x^2] - mean^2 went negative, the plugin would write NaN
            c.reason = (
                f"the plugin's LayerNorm ({np.dtype(c.dtype)} sums and statistics) differs from the graph's "
                f"by rel-L2 {c.error:.2g} on the observed activations (> {tolerance:g})"
            )
            continue
        if c.bias is not None:  # fold it: the plugin reads the dense output before its bias Add (names from the
            c.removed.append(c.bias_input)  # graph being rewritten, find_skip_layernorms; only numbers come from here)
            if c.bias_input == c.a:
                c.a = c.pre_bias
            else:
                c.b = c.pre_bias


def fuse_skip_layernorm(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    observe_model: onnx.ModelProto | None = None,
    observation: Observation | None = None,
) -> tuple[onnx.ModelProto, PassReport]:
    """Replace every verified residual LayerNorm by one plugin node. `observe_model`: the ONNX Runtime-runnable
    graph the numbers come from when `model` already holds plugin nodes; the tensors matched keep their names.
    observation: observe_model's tensors observed with the other passes' (else observed here on `feeds`)."""
    cands = find_skip_layernorms(model)
    verify(observe_model if observe_model is not None else model, cands, feeds, observation)
    report = PassReport([], [{"node": c.node, "reason": c.reason} for c in cands if c.reason is not None])
    accepted = [c for c in cands if c.reason is None]
    if not accepted:
        return model, report
    out = drop_producers(model, {t for c in accepted for t in c.removed})
    for i, c in enumerate(accepted):
        name = f"fused_skip_layernorm_{i}/skip_layernorm"
        attrs: dict[str, Any] = {
            "type_id": 1 if c.dtype == np.float16 else 0,  # the plugin copies its weights in its own type
            "gamma": numpy_helper.from_array(c.gamma.astype(c.dtype), f"{name}/gamma"),
            "beta": numpy_helper.from_array(c.beta.astype(c.dtype), f"{name}/beta"),
        }
        if c.bias is not None:
            attrs["bias"] = numpy_helper.from_array(c.bias.astype(c.dtype), f"{name}/bias")
        out.graph.node.extend(
            plugin_with_cast(PLUGIN, PLUGIN_VERSION, [c.a, c.b], c.y, c.dtype, c.y_dtype, name, f"fused_skip_layernorm_{i}", **attrs)
        )
        report.replaced.append(
            {
                "node": c.node,
                "plugin": f"{PLUGIN} v{PLUGIN_VERSION}",
                "bias_folded": c.bias is not None,
                "rel_l2": c.error,
                "type": str(np.dtype(c.dtype)),
                "plugin_node": name,
            }
        )
    return finish_plugin_graph(out), report
