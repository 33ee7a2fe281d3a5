"""bias + GELU fusion: each GELU an exporter wrote as elementwise ops (erf form, BERT/ViT; tanh form, GPT-2),
with the bias Add in front of it, becomes one `CustomGeluPluginDynamic` node of TensorRT 8.6's plugin library.

Why: the fp16 BERT-base engine spends a large share of its time in Myelin's GELU kernels, at several times their memory
time (docs/performance.md#fusion-passes-auto-modes). The plugin is one
memory-bound kernel with the bias fused. It computes the tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x +
0.044715x^3))) (TensorRT's geluKernel.cu) whatever form the graph had: for an erf GELU the difference is
measured on the observed activations and reported; the engine is then held to the usual gates.

Matching is structural, then numeric, like the attention pass: from each Erf/Tanh, down a chain of
elementwise Add/Mul (by scalars or by x) to y, up through scalar Mul/Div to x; a candidate is kept only if
gelu(x) recomputed in numpy equals the graph's y on ONNX Runtime. The bias is folded into the plugin when x
is Add(t, constant [E]) and nothing else reads x. Pure onnx + numpy; the plugin runs only in TensorRT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from trtforge.fusion import gemm as gemm_pass  # the budget read at call time (one setting for both GEMM plugins)
from trtforge.fusion.gemm import attribute_bytes, plugin_weight, weight_fields
from trtforge.fusion.index import GraphIndex, Observation, PassReport, drop_producers, finish_plugin_graph, observe, plugin_with_cast

PLUGIN = "CustomGeluPluginDynamic"
PLUGIN_VERSION = "1"
# trtforge's own (trtforge/native/gemm_plugin.cpp, in libtrtforge_plugins.so): the GEMM in front of the GELU with
# it, as one cuBLASLt matmul with the GELU_BIAS epilogue (the same tanh formula), so FC1's output is written once.
GEMM_PLUGIN = "TrtforgeGemmGelu"
GEMM_VERSION = "1"
_CHAIN = ("Add", "Mul", "Cast")
_SQRT_2_PI = math.sqrt(2.0 / math.pi)


# Abramowitz & Stegun 7.1.26: erf to 1.5e-7 absolute, vectorized (math.erf element by element took seconds per layer
# on a full-size model; the check it serves tolerates 1e-4).
_ERF_P = 0.3275911
_ERF_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def erf(x: np.ndarray) -> np.ndarray:
    """erf(x) in float64 to 1.5e-7 absolute."""
    z = np.abs(x)
    t = 1.0 / (1.0 + _ERF_P * z)
    poly = np.zeros_like(t)
    for a in _ERF_A:
        poly = (poly + a) * t
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return 0.5 * x64 * (1.0 + erf(x64 / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """What the plugin computes (TensorRT's geluKernel.cu)."""
    x64 = x.astype(np.float64)
    return 0.5 * x64 * (1.0 + np.tanh(_SQRT_2_PI * (x64 + 0.044715 * x64**3)))


@dataclass
class GeluCandidate:
    node: str  # the Erf/Tanh node
    form: str  # "erf" | "tanh"
    x: str = ""
    y: str = ""
    bias: np.ndarray | None = None
    pre_bias: str | None = None  # the tensor the bias is added to (the plugin's input when the bias is folded)
    approximation: float | None = None  # max |plugin formula - graph| on the checked sample of the observed x
    dtypes: tuple[Any, Any] = (np.float32, np.float32)  # observed types of x and y
    reason: str | None = None


def _non_scalar_operand(g: GraphIndex, node: onnx.NodeProto) -> str | None:
    """The other input of a binary node whose one input is a scalar constant, else None."""
    a, b = node.input[0], node.input[1]
    if g.scalar(b) is not None:
        return a
    if g.scalar(a) is not None:
        return b
    return None


def _up_to_x(g: GraphIndex, t: str) -> list[str]:
    """Tensors above t through scalar Mul/Div/Add and Cast: the candidates for x (nearest first)."""
    out = [t]
    for _ in range(6):
        node = g.producer.get(t)
        if node is None or node.op_type not in ("Mul", "Div", "Cast", "Add", "Pow"):
            break
        if node.op_type == "Cast":
            t = node.input[0]
        else:
            other = _non_scalar_operand(g, node)
            if other is None:
                break
            t = other
        out.append(t)
    return out


def find_gelus(model: onnx.ModelProto) -> list[GeluCandidate]:
    g = GraphIndex(model)
    found = []
    for i, node in enumerate(model.graph.node):
        if node.op_type not in ("Erf", "Tanh"):
            continue
        cand = GeluCandidate(node=node.name or f"{node.op_type}#{i}", form="erf" if node.op_type == "Erf" else "tanh")
        found.append(cand)
        chain, factors, t = [], [], node.output[0]
        for _ in range(6):  # down: Add(1) / Mul(0.5) / Mul(x) / Cast, single data consumer each
            users = g.data_consumers(t)
            if len(users) != 1 or users[0].op_type not in _CHAIN:
                break
            u = users[0]
            if u.op_type in ("Add", "Mul"):
                other = u.input[1] if u.input[0] == t else u.input[0]
                if g.scalar(other) is None:
                    if u.op_type != "Mul":
                        break
                    factors.append(other)
            chain.append(u.output[0])
            t = u.output[0]
        if not factors:
            cand.reason = f"{node.op_type} is not multiplied back by its input (not a GELU)"
            continue
        xs = [x for f in factors for x in _up_to_x(g, f)]
        cand.x = ",".join(dict.fromkeys(xs))  # resolved numerically in verify()
        cand.y = ",".join(chain)
    return found


def _region(g: GraphIndex, x: str, y: str) -> set[str] | None:
    """Every tensor on a path from x to y (y included): what the plugin replaces. None when a node on the
    way reads a non-constant tensor that does not come from x (then it is not a function of x alone)."""
    below, frontier = set(), [x]
    for _ in range(12):  # x's descendants up to a GELU's depth (breadth first: the whole GELU before anything deeper)
        frontier = [o for t in frontier for u in g.data_consumers(t) for o in u.output if o not in below]
        below.update(frontier)
    region, stack = set(), [y]
    while stack:
        t = stack.pop()
        if t in region:
            continue
        if t not in below:
            return None
        region.add(t)
        node = g.producer[t]
        stack.extend(i for i in node.input if i and i != x and g.const(i) is None)
    return region


def _names(cands: list[GeluCandidate]) -> list[str]:
    return sorted({t for c in cands if c.reason is None for t in (*c.x.split(","), *c.y.split(","))})


SAMPLE = 1 << 18  # elements of a tensor the numeric check reads: every k-th, the same positions of x and y


def _sample(a: np.ndarray) -> np.ndarray:
    """Every k-th element of `a` flattened, at most about SAMPLE of them: the check's cost stays flat as models grow
    (a full-size FFN activation is tens of millions of elements), and a chain that is not GELU still fails on them."""
    flat = a.reshape(-1)
    return flat[:: max(1, flat.size // SAMPLE)]


def observed_names(model: onnx.ModelProto) -> set[str]:
    """The tensors fuse_gelu reads, for an observation shared with other passes."""
    return set(_names(find_gelus(model)))


def verify(
    model: onnx.ModelProto, cands: list[GeluCandidate], feeds: dict[str, np.ndarray], observation: Observation | None = None
) -> None:
    live = [c for c in cands if c.reason is None]
    if not live:
        return
    g = GraphIndex(model)
    names = _names(live)
    values = observation.values(names) if observation is not None else observe(model, feeds, names)
    for c in live:
        gelu = gelu_erf if c.form == "erf" else gelu_tanh
        wants: dict[str, np.ndarray] = {}  # gelu of each x candidate, computed once
        match = None
        for y in reversed(c.y.split(",")):  # the longest chain that is still a GELU
            got = _sample(values[y]).astype(np.float64)
            for x in c.x.split(","):
                if values[x].shape != values[y].shape:
                    continue
                if x not in wants:
                    wants[x] = gelu(_sample(values[x]))
                want = wants[x]
                err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
                if err <= (2e-2 if values[y].dtype == np.float16 else 1e-4):
                    match = (x, y)
                    break
            if match:
                break
        if match is None:
            c.reason = f"{c.form} chain does not compute gelu(x) of any tensor above it (numeric check)"
            continue
        c.x, c.y = match
        region = _region(g, c.x, c.y)
        if region is None:
            c.reason = "the chain reads a tensor that is not computed from its input"
            continue
        inner = region - {c.y}
        outside = [t for t in inner for u in g.consumers.get(t, []) if not set(u.output) & region]
        if outside:
            c.reason = f"an intermediate of the GELU ('{outside[0]}') is read outside it"
            continue
        c.dtypes = (values[c.x].dtype, values[c.y].dtype)
        c.approximation = float(np.abs(gelu_tanh(_sample(values[c.x])) - _sample(values[c.y]).astype(np.float64)).max())
        c.bias, c.pre_bias = _foldable_bias(g, c.x, region, values[c.x].shape[-1])


def _foldable_bias(g: GraphIndex, x: str, region: set[str], width: int) -> tuple[np.ndarray | None, str | None]:
    """(bias, the tensor it is added to) when x = Add(t, constant [width]) and only the GELU reads x."""
    add = g.producer.get(x)
    if add is None or add.op_type != "Add" or any(not set(u.output) & region for u in g.data_consumers(x)):
        return None, None
    consts = [i for i in add.input if g.const(i) is not None]
    if len(consts) != 1 or g.const(consts[0]).shape != (width,):
        return None, None
    return g.const(consts[0]), next(i for i in add.input if i != consts[0])


def gemm_in_front(g: GraphIndex, c: GeluCandidate) -> tuple[str, np.ndarray] | None:
    """(x, W) when the GELU's folded bias is added to MatMul(x, W) with W a constant [K, N] fp16 matrix that only this
    GELU reads, in an fp16 GELU: what TrtforgeGemmGelu takes whole. None otherwise (the GELU plugin alone then)."""
    if c.bias is None or c.pre_bias is None or c.dtypes[0] != np.float16:
        return None
    mm = g.producer.get(c.pre_bias)
    if mm is None or mm.op_type != "MatMul" or len(g.consumers.get(c.pre_bias, [])) != 1 or c.pre_bias in g.outputs:
        return None
    w, _ = plugin_weight(g, mm)
    if w is None or w.shape[1] != c.bias.shape[0]:
        return None
    return mm.input[0], w


def fuse_gelu(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    observe_model: onnx.ModelProto | None = None,
    gemm_plugin: bool = False,
    observation: Observation | None = None,
) -> tuple[onnx.ModelProto, PassReport]:
    """Replace every verified GELU (with its bias Add where it can) by one plugin node. `observe_model`: the
    ONNX Runtime-runnable graph the numbers come from when `model` already holds plugin nodes (attention fused
    first); the GELUs' tensors keep their names across that pass. gemm_plugin: TrtforgeGemmGelu is registered; a GELU
    whose bias follows an fp16 MatMul by a constant weight then takes the MatMul into the plugin too. observation:
    observe_model's tensors observed with the other passes' (else observed here on `feeds`)."""
    cands = find_gelus(model)
    verify(observe_model if observe_model is not None else model, cands, feeds, observation)
    report = PassReport([], [{"node": c.node, "reason": c.reason} for c in cands if c.reason is not None])
    accepted = [c for c in cands if c.reason is None]
    if not accepted:
        return model, report
    out = drop_producers(model, {c.y for c in accepted})
    g = GraphIndex(model)
    room = gemm_pass.ATTRIBUTE_BUDGET - attribute_bytes(model)  # the plugin's weight is a node attribute: never past 2 GB inline
    for i, c in enumerate(accepted):
        source = c.pre_bias if c.bias is not None else c.x
        x_dtype, y_dtype = c.dtypes  # an Add's inputs share a type: pre_bias has x's
        gemm = gemm_in_front(g, c) if gemm_plugin else None
        if gemm is not None and gemm[1].nbytes > room:
            gemm = None  # the GELU plugin alone; the GEMM stays TensorRT's
        room -= gemm[1].nbytes if gemm is not None else 0
        name = f"fused_gelu_{i}/gelu"
        if gemm is not None:  # MatMul + bias + GELU as one cuBLASLt matmul (its weight and bias in the plugin's fp16)
            x, w = gemm
            attrs: dict[str, Any] = weight_fields(w, c.bias, f"fused_gelu_{i}")
            plugin, version, inputs = GEMM_PLUGIN, GEMM_VERSION, [x]
        else:
            attrs = {"type_id": 1 if x_dtype == np.float16 else 0}
            if c.bias is not None:  # the plugin copies count x sizeof(type) bytes: the bias in the plugin's type
                attrs["bias"] = numpy_helper.from_array(c.bias.astype(x_dtype), f"fused_gelu_{i}/bias")
            plugin, version, inputs = PLUGIN, PLUGIN_VERSION, [source]
        out.graph.node.extend(plugin_with_cast(plugin, version, inputs, c.y, x_dtype, y_dtype, name, f"fused_gelu_{i}", **attrs))
        report.replaced.append(
            {
                "node": c.node,
                "form": c.form,
                "plugin": f"{plugin} v{version}",
                "bias_folded": c.bias is not None,
                "gemm_folded": gemm is not None,
                "approximation_max_abs": c.approximation,
                "plugin_node": name,
            }
        )
    out = finish_plugin_graph(out)
    return out, report
