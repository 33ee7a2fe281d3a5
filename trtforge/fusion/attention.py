"""Attention fusion: find the multi-head attentions an exporter wrote and, where the installed TensorRT
runs a fused kernel for them that it would not pick itself (8.6: the plugin library), replace each with one
plugin node the ONNX parser resolves from the plugin registry.

Matching is structural and then numeric. Structure: from each Softmax, up to the scores MatMul (through
mask Add/Where, scalar Mul/Div, Cast), down to the probabilities x V MatMul (through the NaN guard and
Cast), and from the two MatMuls up to Q, K, V projections of one tensor X by constant weights (MatMul or
Gemm, optional bias, through Reshape/Transpose/scalar scale/Cast, whatever order the exporter chose).
Numbers: one ONNX Runtime run of the original graph on unpadded inputs gives X, the heads (the scores'
shape), the softmax probabilities (zero above the diagonal: causal) and the context tensor; the pass
keeps a candidate only if softmax(Q Kᵀ s) V recomputed in numpy from X and the weights equals that
context. So a layout the matcher misreads is refused, never fused wrong.

Every candidate ends as replaced or refused with one reason. Pure onnx + numpy: the plugin itself is
never called here (ORT cannot run it); the engine is proven on the GPU (benchmarks/gpu/attention_h200.sh).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.fusion.plugins import FLASH_PLUGIN, FLASH_VERSION, PLUGIN, PLUGIN_DOMAIN, PLUGIN_VERSION, Route

PASS_THROUGH = ("Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity")


@dataclass
class Projection:
    x: str
    weight: np.ndarray  # [E_in, E] as X @ W (a quantized weight: its dequantized values)
    bias: np.ndarray | None
    scale: float  # scalar factors met on the way from the projection to the scores MatMul
    wscale: np.ndarray | None = None  # INT8 weight (Q/DQ): its scale per output column [E]; None: a float weight


@dataclass
class Candidate:
    softmax: str
    scores: str = ""  # scores MatMul output [B, N, S, S]
    probs: str = ""  # softmax output
    ctx: str = ""  # merged-heads context [B, S, E]
    masked: bool = False  # an additive or Where mask term between the scores and the softmax
    terms: list[str] = field(default_factory=list)  # tensors Added to the scores on the way (masks, position biases)
    causal: bool = False  # the probabilities are zero above the diagonal on an unpadded input (a decoder)
    ctx_rank: int = 3  # the context tensor's rank: [B, S, E], or [B*S, E] where the exporter merged the tokens
    scale: float = 1.0  # scalar factors between the scores MatMul and the softmax
    q: Projection | None = None
    k: Projection | None = None
    v: Projection | None = None
    heads: int = 0
    head_size: int = 0
    seq: int | None = None  # observed sequence length (at the largest profile sizes when called from build)
    io_dtype: Any = np.float32  # the context tensor's observed type: what the plugin reads and writes
    reason: str | None = None
    # an attention whatever the pass makes of it: the softmax reads MatMul(Q, Kᵀ) and feeds MatMul(probs, V) (through
    # Q/DQ where quantized); what a TensorRT that fuses attention itself is expected to fuse
    attention: bool = False
    quantized: bool = False  # its batched MatMuls read Q/DQ (calibrate --quantize-attention): left unfused on purpose


@dataclass
class FusionReport:
    route: str
    replaced: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    padding_allowed: bool = True
    mask_inputs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "replaced": self.replaced,
            "refused": self.refused,
            "padding_allowed": self.padding_allowed,
            "mask_inputs": self.mask_inputs,
        }


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        g = model.graph
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inits = {i.name: i for i in g.initializer}
        self.outputs = {o.name for o in g.output}

    def const(self, name: str) -> np.ndarray | None:
        """A constant's value, seen through Identity/Cast (the fp16 conversion casts Constant outputs)."""
        from trtforge.calibrate.placement import constant_value

        return constant_value(name, self.inits, self.producer)

    def scalar(self, name: str) -> float | None:
        value = self.const(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    def data_consumers(self, name: str) -> list[onnx.NodeProto]:
        return [c for c in self.consumers.get(name, []) if c.op_type != "Shape"]


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _reaches_matmul(g: _Graph, t: str, depth: int = 6) -> bool:
    """Whether t is a MatMul's output seen through Cast, Reshape, scalar Mul/Div and Add (the scores side of a mask Add
    or Where: DeBERTa adds its relative-position terms to Q·Kᵀ before the mask)."""
    node = g.producer.get(t)
    if node is None or depth == 0:
        return False
    if node.op_type == "MatMul":
        return True
    if node.op_type in ("Cast", "Reshape") or (node.op_type in ("Mul", "Div") and g.scalar(node.input[1]) is not None):
        return _reaches_matmul(g, node.input[0], depth - 1)
    if node.op_type == "Mul" and g.scalar(node.input[0]) is not None:
        return _reaches_matmul(g, node.input[1], depth - 1)
    if node.op_type == "Add":
        return any(_reaches_matmul(g, i, depth - 1) for i in node.input)
    return False


def _scores_path(g: _Graph, cand: Candidate, start: str) -> onnx.NodeProto | None:
    """Walk up from the softmax input to the scores MatMul, collecting mask terms and scalar scales (through Cast, and
    Reshape: DeBERTa's scores are [B*N, S, S] until they meet the mask)."""
    t = start
    for _ in range(12):
        node = g.producer.get(t)
        if node is None:
            return None
        if node.op_type == "MatMul":
            return node
        if node.op_type in ("Cast", "Reshape"):
            t = node.input[0]
        elif node.op_type in ("Mul", "Div") and g.scalar(node.input[1]) is not None:
            c = g.scalar(node.input[1])
            cand.scale *= c if node.op_type == "Mul" else 1.0 / c
            t = node.input[0]
        elif node.op_type == "Mul" and g.scalar(node.input[0]) is not None:
            cand.scale *= g.scalar(node.input[0])
            t = node.input[1]
        elif node.op_type in ("Add", "Where"):
            data = list(node.input[1:]) if node.op_type == "Where" else list(node.input)
            main = [i for i in data if _reaches_matmul(g, i)]
            if len(main) != 1:
                return None
            others = [i for i in data if i != main[0]]
            zero = all(g.const(i) is not None and not np.any(g.const(i)) for i in others) and node.op_type == "Add"
            cand.masked = cand.masked or not zero
            if node.op_type == "Add" and not zero:
                cand.terms += others
            t = main[0]
        else:
            return None
    return None


def _quantized_weight(g: _Graph, name: str, out_axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A constant weight behind DequantizeLinear (after QuantizeLinear of a float constant, or an int8 constant),
    zero point 0, scaled per tensor or along `out_axis` (the output channels): (dequantized weight, the scale per
    output channel). None for anything else (scales along the input channels cannot be packed per column)."""
    dq = g.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 3 or not dq.input[2]:
        return None  # no zero point means uint8; the packed weight is re-quantized as int8
    scale, zero = g.const(dq.input[1]), g.const(dq.input[2])
    if scale is None or zero is None or zero.dtype != np.int8 or np.any(zero != 0):
        return None
    q = g.const(dq.input[0])
    if q is None:
        quant = g.producer.get(dq.input[0])
        if (
            quant is None
            or quant.op_type != "QuantizeLinear"
            or list(quant.input[1:3]) != list(dq.input[1:3])
            or _attr(quant, "axis", 1) != _attr(dq, "axis", 1)
        ):
            return None
        w = g.const(quant.input[0])
        if w is None:
            return None
        q = np.clip(np.rint(w.astype(np.float64) / _broadcast(scale, _attr(dq, "axis", 1), w.ndim)), -128, 127)
    elif q.dtype != np.int8:
        return None
    if q.ndim != 2:
        return None
    axis = _attr(dq, "axis", 1) % 2
    if scale.size > 1 and axis != out_axis:
        return None
    per_column = np.broadcast_to(scale.reshape(-1), (q.shape[out_axis],)).copy()
    return (q.astype(np.float64) * _broadcast(scale, axis, 2)).astype(scale.dtype), per_column


def _broadcast(scale: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    if scale.size == 1:
        return scale.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = scale.size
    return scale.reshape(shape)


def _column_slice(g: _Graph, node: onnx.NodeProto, t: str) -> Callable[[int], tuple[int, int]] | None:
    """For output t of a Split or Slice along the last axis (GPT-2's packed c_attn: Q, K, V split from one projection),
    the columns [lo, hi) it keeps as a function of the input's width (a Split without sizes cuts equal parts); None when
    the bounds are not constants on that axis."""
    if node.op_type == "Split":
        sizes = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else _attr(node, "split")
        if _attr(node, "axis", 0) not in (-1, 2):
            return None
        k, parts = list(node.output).index(t), len(node.output)
        if sizes is None:  # no sizes (or opset 18's num_outputs): equal parts
            return lambda width: (k * width // parts, (k + 1) * width // parts) if width % parts == 0 else (0, 0)
        bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes, np.int64).reshape(-1))])
        return lambda width: (int(bounds[k]), int(bounds[k + 1]))
    if node.op_type == "Slice" and len(node.input) >= 4:
        starts, ends, axes = (g.const(i) for i in node.input[1:4])
        steps = g.const(node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(1, np.int64)
        if (
            any(v is None or v.size != 1 for v in (starts, ends, axes, steps))
            or int(axes.reshape(-1)[0]) not in (-1, 2)
            or int(steps.reshape(-1)[0]) != 1
            or int(starts.reshape(-1)[0]) < 0
            or int(ends.reshape(-1)[0]) < 0
        ):
            return None
        return lambda width: (int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0]))
    return None


def _sliced(p: Projection, cols: Callable[[int], tuple[int, int]] | None) -> Projection | None:
    """The projection restricted to the output columns `cols` keeps (a bias met above the slice is cut the same way)."""
    if cols is None:
        return p
    lo, hi = cols(p.weight.shape[1])
    if not 0 <= lo < hi <= p.weight.shape[1]:
        return None
    bias = p.bias
    if bias is not None and bias.shape[0] == p.weight.shape[1]:
        bias = bias[lo:hi]
    elif bias is not None and bias.shape[0] != hi - lo:
        return None
    return Projection(p.x, p.weight[:, lo:hi], bias, p.scale, None if p.wscale is None else p.wscale[lo:hi])


def _gemm_input(g: _Graph, x: str) -> str:
    """A GEMM's input seen through the Reshape [B, S, E] -> [B*S, E] the legacy exporter writes before a Gemm (the
    weight acts on the last axis either way; verify's recomputation refuses any other reading)."""
    node = g.producer.get(x)
    return node.input[0] if node is not None and node.op_type == "Reshape" else x


def _projection(g: _Graph, start: str) -> Projection | None:
    """Walk up from a Q/K/V operand to X @ W (+ b), through layout ops, scalar scales and one column split."""
    t, scale, bias, cols = start, 1.0, None, None
    for _ in range(20):
        node = g.producer.get(t)
        if node is None:
            return None
        op = node.op_type
        if op in ("Split", "Slice") and cols is None:
            cols = _column_slice(g, node, t)
            if cols is None:
                return None
            t = node.input[0]
        elif op in PASS_THROUGH:
            t = node.input[0]
        elif op in ("Mul", "Div") and g.scalar(node.input[1]) is not None:
            c = g.scalar(node.input[1])
            scale *= c if op == "Mul" else 1.0 / c
            t = node.input[0]
        elif op == "Mul" and g.scalar(node.input[0]) is not None:
            scale *= g.scalar(node.input[0])
            t = node.input[1]
        elif op == "Add" and bias is None:
            consts = [i for i in node.input if g.const(i) is not None]
            if len(consts) != 1 or g.const(consts[0]).ndim != 1:
                return None
            bias = g.const(consts[0])
            t = next(i for i in node.input if i != consts[0])
        elif op == "MatMul":
            w, wscale = g.const(node.input[1]), None
            if w is None:
                w, wscale = _quantized_weight(g, node.input[1], 1) or (None, None)
            if w is None or w.ndim != 2:
                return None
            return _sliced(Projection(node.input[0], w, bias, scale, wscale), cols)
        elif op == "Gemm":
            trans_b = _attr(node, "transB", 0)
            w, wscale = g.const(node.input[1]), None
            if w is None:
                w, wscale = _quantized_weight(g, node.input[1], 0 if trans_b else 1) or (None, None)
            if w is None or _attr(node, "transA", 0) or _attr(node, "alpha", 1.0) != 1.0:
                return None
            w = w.T if trans_b else w
            if len(node.input) > 2 and node.input[2]:
                c = g.const(node.input[2])
                if c is None or bias is not None:
                    return None
                bias = c * _attr(node, "beta", 1.0)
            return _sliced(Projection(_gemm_input(g, node.input[0]), w, bias, scale, wscale), cols)
        else:
            return None
    return None


def _pv_matmul(g: _Graph, probs: str) -> onnx.NodeProto | None:
    """Down from the softmax output to probs @ V, through Cast, Reshape (DeBERTa's [B*N, S, S]) and the NaN guard
    (Where(IsNaN(p), 0, p))."""
    t = probs
    for _ in range(6):
        users = g.data_consumers(t)
        mm = [u for u in users if u.op_type == "MatMul" and u.input[0] == t]
        if mm:
            return mm[0]
        where = [u for u in users if u.op_type == "Where" and u.input[2] == t]
        if where:
            t = where[0].output[0]
        elif len(users) == 1 and users[0].op_type in ("Cast", "Reshape"):
            t = users[0].output[0]
        else:
            return None
    return None


def _context(g: _Graph, pv: onnx.NodeProto) -> list[str]:
    """Tensors below probs @ V, through its head-merging Transpose/Reshape/Cast (single data consumer)."""
    out, t = [], pv.output[0]
    for _ in range(6):
        users = g.data_consumers(t)
        if len(users) != 1 or users[0].op_type not in ("Transpose", "Reshape", "Cast"):
            break
        t = users[0].output[0]
        out.append(t)
    return out


def _is_dequantized_activation(g: _Graph, t: str) -> bool:
    """Whether t comes out of DequantizeLinear(QuantizeLinear(activation)), seen through layout ops: neither the
    DequantizeLinear's input nor its QuantizeLinear's input is a constant."""
    for _ in range(4):
        node = g.producer.get(t)
        if node is None:
            return False
        if node.op_type == "DequantizeLinear":
            if g.const(node.input[0]) is not None:
                return False
            quant = g.producer.get(node.input[0])
            return not (quant is not None and quant.op_type == "QuantizeLinear" and g.const(quant.input[0]) is not None)
        if node.op_type not in PASS_THROUGH:
            return False
        t = node.input[0]
    return False


def find_candidates(model: onnx.ModelProto) -> list[Candidate]:
    """Every Softmax, matched structurally as far as it goes; a failed match carries its reason."""
    g = _Graph(model)
    found = []
    for i, node in enumerate(model.graph.node):
        if node.op_type != "Softmax":
            continue
        cand = Candidate(softmax=node.name or f"Softmax#{i}", probs=node.output[0])
        found.append(cand)
        axis = _attr(node, "axis", -1)
        if axis not in (-1, 3):
            cand.reason = f"softmax over axis {axis}, not the keys"
            continue
        scores = _scores_path(g, cand, node.input[0])
        if scores is None:
            cand.reason = "the softmax does not read MatMul(Q, Kᵀ) (through scale, mask and Cast only)"
            continue
        cand.scores = scores.output[0]
        pv = _pv_matmul(g, node.output[0])
        quantized = any(_is_dequantized_activation(g, t) for t in scores.input[:2]) or (
            pv is None and any(u.op_type == "QuantizeLinear" for u in g.data_consumers(node.output[0]))
        )
        cand.attention = pv is not None or quantized
        cand.quantized = quantized
        if quantized:
            cand.reason = (
                "the attention's batched MatMuls are quantized (calibrate --quantize-attention): the plugin "
                "runs them fp16 and would drop their Q/DQ; calibrate without it to fuse"
            )
            continue
        if pv is None:
            cand.reason = "the softmax output does not feed MatMul(probs, V)"
            continue
        cand.q, cand.k, cand.v = _projection(g, scores.input[0]), _projection(g, scores.input[1]), _projection(g, pv.input[1])
        ctx = _context(g, pv)
        cand.ctx = ",".join(ctx)  # resolved against observed shapes in verify()
        if not ctx:
            cand.reason = "probs @ V is not followed by a head-merging Transpose/Reshape"
    return found


def observe(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Values of the named tensors on ORT (graph outputs exposed untyped: ORT types them itself)."""
    from trtforge.backends.onnxruntime import OrtRunner
    from trtforge.graph.index import expose_tensors

    return OrtRunner(expose_tensors(model, names, typed=False).SerializeToString()).run(feeds, names)


def reference_attention(
    x: np.ndarray, q: Projection, k: Projection, v: Projection, heads: int, scale: float, causal: bool = False
) -> np.ndarray:
    """softmax(Q Kᵀ scale) V with Q, K, V = X W + b split into heads: [B, S, E_in] -> [B, S, E], fp64 math."""

    def split(p: Projection) -> np.ndarray:
        y = x.astype(np.float64) @ p.weight.astype(np.float64) + (0 if p.bias is None else p.bias.astype(np.float64))
        y = y * p.scale
        b, s, e = y.shape
        return y.reshape(b, s, heads, e // heads).transpose(0, 2, 1, 3)

    qh, kh, vh = split(q), split(k), split(v)
    scores = qh @ kh.transpose(0, 1, 3, 2) * scale
    if causal:
        s = scores.shape[-1]
        scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    out = p @ vh
    b, n, s, h = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _varies_across_keys(term: np.ndarray, causal: bool = False) -> bool:
    """Whether an added score term differs between the keys (the last axis) a query attends to: a padding mask on
    unpadded inputs is constant along it, a position bias or a window mask is not. A causal query attends to the keys
    up to itself only, so a term's entries above the diagonal (an additive causal mask) are not compared. Infinities
    count: a {0, -inf} window mask varies."""
    term = np.asarray(term, np.float64)
    if term.ndim == 0 or term.shape[-1] < 2:
        return False
    s = term.shape[-1]
    if causal and term.ndim >= 2 and term.shape[-2] == s:
        term = np.where(np.tril(np.ones((s, s), bool)), term, term[..., :1])  # column 0: every query attends to it
    finite = np.isfinite(term)
    magnitude = float(np.abs(term[finite]).max()) if finite.any() else 0.0
    term = np.where(finite, term, np.sign(term) * 1e300)
    return bool(np.abs(term - term[..., :1]).max() > 1e-6 * max(1.0, magnitude))


def verify(model: onnx.ModelProto, cands: list[Candidate], feeds: dict[str, np.ndarray]) -> None:
    """Numeric half of the match: heads, causality and the recomputed context against ORT's."""
    live = [c for c in cands if c.reason is None]
    if not live:
        return
    names = set()
    for c in live:
        names.update([c.scores, c.probs, *c.ctx.split(","), *c.terms])
        names.update(p.x for p in (c.q, c.k, c.v) if p is not None)
    values = observe(model, feeds, sorted(names))
    for c in live:
        scores, probs = values[c.scores], values[c.probs]
        if scores.ndim != 4:
            c.reason = f"scores are {list(scores.shape)}, not [batch, heads, seq, seq]"
            continue
        if probs.shape != scores.shape:
            c.reason = f"the softmax runs on a reshaped view of the scores ({list(probs.shape)}, scores {list(scores.shape)})"
            continue
        s = probs.shape[-1]
        c.causal = bool(
            s > 1 and probs.shape[-2] == s and not np.any(np.abs(probs[..., np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]]) > 0)
        )
        if c.causal and not c.masked:  # zeros without a mask term are underflow, not a mask the plugin may apply
            c.reason = "probabilities above the diagonal are zero but no mask term precedes the softmax"
            continue
        # Decided on the terms themselves, not on the recomputed context: a small bias stays within the tolerance
        # below and the plugin would drop it.
        if any(_varies_across_keys(values[t], c.causal) for t in c.terms):
            c.reason = (
                "a term that varies across the keys is added to the scores on unpadded inputs, so it is no padding "
                "mask (a relative-position bias or a window mask, as in T5 and Swin): the plugin adds none"
            )
            continue
        if None in (c.q, c.k, c.v):
            c.reason = "Q, K or V is not a projection X·W (+ b) by constant weights"
            continue
        quantized = [p.wscale is not None for p in (c.q, c.k, c.v)]
        if any(quantized) and not all(quantized):
            c.reason = "Q, K and V projections are not all INT8 or all float (one packed GEMM cannot mix them)"
            continue
        if all(quantized) and not (c.q.scale > 0 and c.k.scale > 0 and c.v.scale > 0 and c.scale > 0):
            c.reason = "a non-positive scale on an INT8 projection cannot be folded into its weight scales"
            continue
        if not (c.q.x == c.k.x == c.v.x):
            c.reason = "Q, K and V are projections of different tensors (cross-attention)"
            continue
        x = values[c.q.x]
        if x.ndim != 3:
            c.reason = f"the projected tensor is {list(x.shape)}, not [batch, seq, hidden]"
            continue
        c.heads = int(scores.shape[1])
        e = c.q.weight.shape[1]
        if not (c.k.weight.shape == c.q.weight.shape == c.v.weight.shape) or e % c.heads:
            c.reason = f"Q/K/V weights {c.q.weight.shape}, {c.k.weight.shape}, {c.v.weight.shape} do not split into {c.heads} heads"
            continue
        c.head_size = e // c.heads
        c.seq = int(x.shape[1])
        tokens = x.shape[0] * x.shape[1]
        # [B, S, E], or [B*S, E] where the exporter merged the tokens for the output projection's Gemm (GPT-2 dynamo)
        ctx = [
            t
            for t in c.ctx.split(",")
            if values[t].shape[-1] == e and (values[t].ndim == 3 or (values[t].ndim == 2 and values[t].shape[0] == tokens))
        ]
        if not ctx:
            c.reason = "no [batch, seq, hidden] context tensor below probs @ V"
            continue
        c.ctx = ctx[0]
        c.io_dtype = values[c.ctx].dtype
        ref = reference_attention(x, c.q, c.k, c.v, c.heads, c.scale, c.causal)
        fp16 = c.io_dtype == np.float16 or any(a is not None and a.dtype == np.float16 for p in (c.q, c.k, c.v) for a in (p.weight, p.bias))
        tol = 2e-2 if fp16 else 1e-4  # a misread layout is off by O(1)
        c.ctx_rank = values[c.ctx].ndim
        err = _rel(values[c.ctx], ref.reshape(values[c.ctx].shape))
        if not err <= tol:
            c.reason = f"recomputed attention differs from the graph's (rel-L2 {err:.1e} > {tol:g}): a layout this pass does not model"


def pack_qkv(q: Projection, k: Projection, v: Projection, heads: int, q_factor: float) -> tuple[np.ndarray, np.ndarray]:
    """Weights [E_in, 3E] and bias [3E] whose output columns are laid out [heads, 3, head] (each head's q, k, v
    adjacent, the plugin's layout), with every path's scalar scale and q_factor folded into Q."""
    e_in, e = q.weight.shape
    h = e // heads
    dtype = q.weight.dtype
    ws, bs = [], []
    for p, extra in ((q, q_factor), (k, 1.0), (v, 1.0)):
        f = p.scale * extra
        ws.append(p.weight.astype(np.float64) * f)
        bs.append((np.zeros(e) if p.bias is None else p.bias.astype(np.float64)) * f)
    w = np.stack(ws, 1).reshape(e_in, 3, heads, h).transpose(0, 2, 1, 3).reshape(e_in, 3 * e)
    b = np.stack(bs, 0).reshape(3, heads, h).transpose(1, 0, 2).reshape(3 * e)
    return w.astype(dtype), b.astype(dtype)


def pack_qkv_scales(q: Projection, k: Projection, v: Projection, heads: int, q_factor: float) -> np.ndarray:
    """INT8 weight scales [3E] in pack_qkv's column order, each path's factors folded in (exact: the int8
    values stay the same, only what one step of them is worth changes)."""
    e = q.weight.shape[1]
    h = e // heads
    s = np.stack([p.wscale.astype(np.float64) * p.scale * extra for p, extra in ((q, q_factor), (k, 1.0), (v, 1.0))], 0)
    return s.reshape(3, heads, h).transpose(1, 0, 2).reshape(3 * e).astype(q.wscale.dtype)


QKV_PROJECTIONS = ("matmul", "conv")


def activation_qdq(g: _Graph, x: str) -> tuple[str, str, str] | None:
    """(float input, scale, zero point) when x = DequantizeLinear(QuantizeLinear(float input)) with one scale for the
    whole tensor (so a reshape commutes with it); None otherwise."""
    dq = g.producer.get(x)
    if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 3:
        return None
    q = g.producer.get(dq.input[0])
    scale = g.const(dq.input[1])
    if q is None or q.op_type != "QuantizeLinear" or list(q.input[1:3]) != list(dq.input[1:3]) or scale is None or scale.size != 1:
        return None
    return q.input[0], dq.input[1], dq.input[2]


def _plugin_nodes(
    c: Candidate,
    route: Route,
    prefix: str,
    qkv_projection: str = "conv",
    x_qdq: tuple[str, str, str] | None = None,
    seq_tensor: str | None = None,
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """X -> packed QKV projection -> plugin -> [B, S, E] named c.ctx. The plugin is route.plugin: PLUGIN v2
    (var_seqlen: cu_seqlens = S·[0..B], every row full; it scales by 1/sqrt(padded head), so the model's own scale
    s is restored by folding s·sqrt(padded) into Q), or FLASH_PLUGIN (the packed QKV and a [S] tensor for the
    sequence length; it applies the model's scale itself, so Q's weights keep only their own path's factors).

    qkv_projection "matmul": MatMul [B, S, E_in] x [E_in, 3E], bias Add, Reshape to the plugin's [tokens, 3E, 1, 1].
    "conv": X reshaped to [tokens, E_in, 1, 1] first, then a 1x1 Conv (bias inside) writes [tokens, 3E, 1, 1] itself,
    as TensorRT's BERT demo feeds the plugin: on 8.6 a Reshape at the end of a Myelin region costs a copy kernel
    (52 us per layer on BERT-base at 16x512, H200), a reshape before a convolution costs nothing. With INT8
    projections, x_qdq (activation_qdq of X) lets the reshape go before X's own Q/DQ, so that DequantizeLinear
    feeds the Conv directly, the pattern TensorRT fuses into an int8 convolution.

    seq_tensor: an earlier flash node's [S] tensor, of the same sequence length (same_leading_dims), which this flash
    node then reads instead of writing its own: each is a fill kernel in the engine (cuFillLayer, ~2 us per layer at
    16x512 on the H200)."""
    flash = route.plugin == FLASH_PLUGIN
    seq_tensor = seq_tensor if flash else None
    q_factor = 1.0 if flash else c.scale * float(np.sqrt(route.padded_head or 64))
    w, b = pack_qkv(c.q, c.k, c.v, c.heads, q_factor)
    b = b.astype(c.io_dtype)  # the bias Add and the plugin run in the graph's type there (fp16 after conversion)
    e_in, e = w.shape[0], c.heads * c.head_size
    conv = qkv_projection == "conv"
    n = lambda s: f"{prefix}/{s}"  # noqa: E731
    inits = [
        numpy_helper.from_array(w.T.reshape(3 * e, e_in, 1, 1).copy() if conv else w, n("qkv_weight")),
        numpy_helper.from_array(np.array([e], np.int64), n("hidden")),
        numpy_helper.from_array(np.array([0, 1], np.int64), n("bs_index")),
        numpy_helper.from_array(np.array(0, np.int64), n("zero")),
        numpy_helper.from_array(np.array(1, np.int64), n("one")),
    ]
    x = c.q.x
    weight, nodes = n("qkv_weight"), []
    gemm_dtype = w.dtype
    if c.q.wscale is not None:  # INT8 projections: one INT8 GEMM, the packed weight behind its own Q/DQ
        scales = pack_qkv_scales(c.q, c.k, c.v, c.heads, q_factor)
        gemm_dtype = scales.dtype  # DequantizeLinear writes its scales' type
        inits += [
            numpy_helper.from_array(scales, n("qkv_wscale")),
            numpy_helper.from_array(np.zeros(scales.shape, np.int8), n("qkv_wzero_point")),
        ]
        weight = n("qkv_wdq")
        axis = 0 if conv else 1  # the output channels: Conv weight [3E, E_in, 1, 1], MatMul weight [E_in, 3E]
        nodes += [
            helper.make_node(
                "QuantizeLinear",
                [n("qkv_weight"), n("qkv_wscale"), n("qkv_wzero_point")],
                [n("qkv_wq")],
                name=n("qkv_wQuantizeLinear"),
                axis=axis,
            ),
            helper.make_node(
                "DequantizeLinear",
                [n("qkv_wq"), n("qkv_wscale"), n("qkv_wzero_point")],
                [weight],
                name=n("qkv_wDequantizeLinear"),
                axis=axis,
            ),
        ]
    if conv:
        # Conv's bias has the GEMM's type; a Cast after it (an fp32 INT8 or kept GEMM in an fp16 graph) gives the plugin's.
        inits += [
            numpy_helper.from_array(b.astype(gemm_dtype), n("qkv_bias")),
            numpy_helper.from_array(np.array([-1, e_in, 1, 1], np.int64), n("x_tokens_shape")),
        ]
        if c.q.wscale is not None and x_qdq is not None:
            source, x_scale, x_zero = x_qdq
            nodes += [
                helper.make_node("Reshape", [source, n("x_tokens_shape")], [n("x_tokens_float")], name=n("x_to_tokens")),
                helper.make_node(
                    "QuantizeLinear", [n("x_tokens_float"), x_scale, x_zero], [n("x_tokens_q")], name=n("x_tokens_QuantizeLinear")
                ),
                helper.make_node(
                    "DequantizeLinear", [n("x_tokens_q"), x_scale, x_zero], [n("x_tokens")], name=n("x_tokens_DequantizeLinear")
                ),
            ]
        else:
            nodes.append(helper.make_node("Reshape", [x, n("x_tokens_shape")], [n("x_tokens")], name=n("x_to_tokens")))
        nodes += [
            helper.make_node("Conv", [n("x_tokens"), weight, n("qkv_bias")], [n("qkv_conv")], name=n("qkv_conv"), kernel_shape=[1, 1])
        ]
        qkv_tokens = n("qkv_conv")
        if gemm_dtype != b.dtype:
            nodes.append(
                helper.make_node(
                    "Cast", [qkv_tokens], [n("qkv_tokens")], name=n("qkv_conv_cast"), to=helper.np_dtype_to_tensor_dtype(b.dtype)
                )
            )
            qkv_tokens = n("qkv_tokens")
    else:
        inits += [numpy_helper.from_array(b, n("qkv_bias")), numpy_helper.from_array(np.array([-1, 3 * e, 1, 1], np.int64), n("qkv_shape"))]
        mm = n("qkv_mm")
        nodes.append(helper.make_node("MatMul", [x, weight], [mm], name=n("qkv_matmul")))
        if gemm_dtype != b.dtype:  # e.g. an fp32 (INT8 or kept) GEMM in an fp16 graph
            nodes.append(
                helper.make_node("Cast", [mm], [n("qkv_mm_cast")], name=n("qkv_mm_cast"), to=helper.np_dtype_to_tensor_dtype(b.dtype))
            )
            mm = n("qkv_mm_cast")
        nodes += [
            helper.make_node("Add", [mm, n("qkv_bias")], [n("qkv")], name=n("qkv_bias_add")),
            helper.make_node("Reshape", [n("qkv"), n("qkv_shape")], [n("qkv_tokens")], name=n("qkv_to_tokens")),
        ]
        qkv_tokens = n("qkv_tokens")
    nodes += [
        helper.make_node("Shape", [x], [n("x_shape")], name=n("x_shape")),
        helper.make_node("Gather", [n("x_shape"), n("bs_index")], [n("bs")], name=n("batch_seq"), axis=0),
    ]
    if seq_tensor is None:
        nodes += [
            helper.make_node("Gather", [n("x_shape"), n("one")], [n("s")], name=n("seq"), axis=0),
            helper.make_node("Range", [n("zero"), n("s"), n("one")], [n("seq64")], name=n("max_seqlen64")),
            helper.make_node("Cast", [n("seq64")], [n("max_seqlen")], name=n("max_seqlen"), to=onnx.TensorProto.INT32),
        ]
    if flash:
        nodes.append(
            helper.make_node(
                FLASH_PLUGIN,
                [qkv_tokens, seq_tensor or n("max_seqlen")],
                [n("ctx_tokens")],
                name=n("qkv_to_context"),
                domain=PLUGIN_DOMAIN,
                plugin_version=FLASH_VERSION,
                plugin_namespace="",
                hidden_size=e,
                num_heads=c.heads,
                scale=float(c.scale),
                causal=int(c.causal),
            )
        )
    else:
        nodes += [
            helper.make_node("Gather", [n("x_shape"), n("zero")], [n("b")], name=n("batch"), axis=0),
            helper.make_node("Mul", [n("b"), n("s")], [n("tokens")], name=n("tokens")),
            helper.make_node("Add", [n("tokens"), n("one")], [n("limit")], name=n("limit")),
            helper.make_node("Range", [n("zero"), n("limit"), n("s")], [n("cu64")], name=n("cu_seqlens64")),
            helper.make_node("Cast", [n("cu64")], [n("cu_seqlens")], name=n("cu_seqlens"), to=onnx.TensorProto.INT32),
            helper.make_node(
                PLUGIN,
                [qkv_tokens, n("max_seqlen"), n("cu_seqlens"), n("max_seqlen")],
                [n("ctx_tokens")],
                name=n("qkv_to_context"),
                domain=PLUGIN_DOMAIN,
                plugin_version=PLUGIN_VERSION,
                plugin_namespace="",
                type_id=1,
                hidden_size=e,
                num_heads=c.heads,
                has_mask=1,
                var_seqlen=1,
            ),
        ]
    if c.ctx_rank == 2:  # the graph merged the tokens itself: [B*S, E]
        inits.append(numpy_helper.from_array(np.array([-1, e], np.int64), n("ctx_shape")))
    else:
        nodes.append(helper.make_node("Concat", [n("bs"), n("hidden")], [n("ctx_shape")], name=n("ctx_shape"), axis=0))
    nodes.append(helper.make_node("Reshape", [n("ctx_tokens"), n("ctx_shape")], [c.ctx], name=n("ctx")))
    return nodes, inits


@dataclass
class PassReport:
    """What an elementwise plugin pass (GELU, skip-LayerNorm) replaced and refused, as its sidecar record holds it."""

    replaced: list[dict[str, Any]]
    refused: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"replaced": self.replaced, "refused": self.refused}


def drop_producers(model: onnx.ModelProto, tensors: set[str]) -> onnx.ModelProto:
    """A copy of `model` without the nodes that write any of `tensors` (a pass's plugin nodes write them instead)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [n for n in out.graph.node if not (set(n.output) & tensors)]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def plugin_with_cast(
    op: str, version: str, inputs: list[str], y: str, plugin_dtype: Any, y_dtype: Any, name: str, prefix: str, **attrs: Any
) -> list[onnx.NodeProto]:
    """The plugin node that writes `y`, through a Cast to y's type where the plugin runs in another one."""
    plugin_out = y if np.dtype(y_dtype) == np.dtype(plugin_dtype) else f"{prefix}/out"
    nodes = [
        helper.make_node(op, inputs, [plugin_out], name=name, domain=PLUGIN_DOMAIN, plugin_version=version, plugin_namespace="", **attrs)
    ]
    if plugin_out != y:
        nodes.append(
            helper.make_node("Cast", [plugin_out], [y], name=f"{prefix}/cast", to=helper.np_dtype_to_tensor_dtype(np.dtype(y_dtype)))
        )
    return nodes


def finish_plugin_graph(out: onnx.ModelProto) -> onnx.ModelProto:
    """After a pass: drop what its plugin nodes orphaned, sort the nodes, declare the plugins' domain."""
    from trtforge.graph.index import toposorted

    prune(out)
    out = toposorted(out)
    if not any(o.domain == PLUGIN_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    return out


def prune(model: onnx.ModelProto) -> None:
    """Drop nodes and initializers no graph output depends on."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    needed, stack, keep = set(), [o.name for o in g.output], set()
    while stack:
        t = stack.pop()
        if t in needed:
            continue
        needed.add(t)
        node = producer.get(t)
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            stack.extend(i for i in node.input if i)
    nodes = [n for n in g.node if id(n) in keep]
    del g.node[:]
    g.node.extend(nodes)
    inits = [i for i in g.initializer if i.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)


def mask_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that look like a padding mask (what `run` must see all ones for an unmasked engine)."""
    return [i.name for i in model.graph.input if "mask" in i.name.lower()]


def fuse_attention(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    route_for: Callable[[Candidate], Route],
    route_name: str,
    apply: bool = True,
    qkv_projection: str = "conv",
    candidates: list[Candidate] | None = None,
) -> tuple[onnx.ModelProto, FusionReport]:
    """Match, verify, and (apply) replace every attention whose route is the plugin; report each one's fate.
    qkv_projection: how the packed QKV projection is written (QKV_PROJECTIONS; see _plugin_nodes); candidates: the
    model's find_candidates where the caller has them already (they are verified and given reasons here)."""
    cands = candidates if candidates is not None else find_candidates(model)
    verify(model, cands, feeds)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    routes = {}
    for c in cands:
        if c.reason is None:
            r = route_for(c)
            routes[c.softmax] = r
            if r.kind != "plugin":
                c.reason = r.reason
    accepted = [c for c in cands if c.reason is None]
    report = FusionReport(route=route_name)
    for c in cands:
        if c.reason is not None:
            report.refused.append({"softmax": c.softmax, "reason": c.reason})
    if not accepted or not apply:
        for c in accepted:
            report.refused.append({"softmax": c.softmax, "reason": "fusion not applied (--fuse-attention off)"})
        return (out if apply else model), report
    out = drop_producers(out, {c.ctx for c in accepted})
    graph = _Graph(model)
    # Flash nodes whose inputs provably share [B, S] read one [S] tensor: the first one's (same_leading_dims; each
    # rewritten context keeps its attention input's [B, S], so it joins the group too).
    seq_source, same_s = None, set()
    for i, c in enumerate(accepted):
        x_qdq = activation_qdq(graph, c.q.x) if qkv_projection == "conv" and c.q.wscale is not None else None
        route = routes[c.softmax]
        shared = None
        if route.plugin == FLASH_PLUGIN:
            if seq_source is not None and same_leading_dims(graph, c.q.x, same_s):
                shared = seq_source
            else:
                seq_source, same_s = f"fused_attention_{i}/max_seqlen", set()
            same_s |= leading_dims_group(graph, c.q.x) | ({c.ctx} if c.ctx_rank == 3 else set())
        nodes, inits = _plugin_nodes(c, route, f"fused_attention_{i}", qkv_projection, x_qdq, seq_tensor=shared)
        out.graph.node.extend(nodes)
        out.graph.initializer.extend(inits)
        version = FLASH_VERSION if route.plugin == FLASH_PLUGIN else PLUGIN_VERSION
        report.replaced.append(
            {
                "softmax": c.softmax,
                "plugin": f"{route.plugin} v{version}",
                "heads": c.heads,
                "head_size": c.head_size,
                "scale": c.scale * c.q.scale * c.k.scale,
                "masked": c.masked,
                "causal": c.causal,
                "node": f"fused_attention_{i}/qkv_to_context",
                "seq_input": (shared or f"fused_attention_{i}/max_seqlen") if route.plugin == FLASH_PLUGIN else None,
                "qkv_projection": qkv_projection,
            }
        )
    out = finish_plugin_graph(out)
    if any(c.masked for c in accepted):  # verified unmasked on unpadded rows: only a mask input can pad
        report.mask_inputs = mask_inputs(model)
        report.padding_allowed = not report.mask_inputs
    return out, report


# Ops whose output keeps every axis but the last of its data inputs (with constants of at most one axis beside them).
_KEEPS_LEADING = {
    "Cast",
    "Identity",
    "Erf",
    "Tanh",
    "Relu",
    "Sigmoid",
    "Sqrt",
    "Neg",
    "Gelu",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "LayerNormalization",
    "MatMul",
}


def _keeping_step(g: _Graph, node: onnx.NodeProto) -> list[str] | None:
    """The data inputs of `node` whose axes but the last its output keeps (see same_leading_dims), or None."""
    if node.op_type not in _KEEPS_LEADING or node.domain not in ("", "ai.onnx"):  # a custom op of that name: unknown
        return None
    inputs = [i for i in node.input if i]
    if node.op_type == "MatMul":
        w = g.const(inputs[1]) if len(inputs) == 2 else None
        return [inputs[0]] if w is not None and w.ndim == 2 and g.const(inputs[0]) is None else None
    if node.op_type == "LayerNormalization":
        if _attr(node, "axis", -1) != -1:
            return None
        inputs = inputs[:1]  # scale and bias are [E]
    data = [i for i in inputs if g.const(i) is None]
    if not data or any(g.const(i).ndim > 1 for i in inputs if i not in data):
        return None
    return data


def leading_dims_group(g: _Graph, t: str) -> set[str]:
    """t and the tensors it was computed from through single-input ops that keep every axis but the last (a pre-LN
    block's LayerNorm input, the residual stream): all share t's leading axes."""
    group, u = {t}, t
    while (node := g.producer.get(u)) is not None and (data := _keeping_step(g, node)) is not None and len(data) == 1:
        u = data[0]
        group.add(u)
    return group


def same_leading_dims(g: _Graph, t: str, known: set[str]) -> bool:
    """Whether t's axes before its last are those of the tensors in `known` (which share theirs): every path back
    from t reaches `known` through ops that keep them, i.e. elementwise ops whose constant operands have at most one
    axis, MatMul by a constant [K, N], LayerNormalization over the last axis. A Reshape, Transpose, Gather or
    anything else on the way is a no: then t's sequence length is not proven equal."""
    stack, seen = [t], set()
    while stack:
        u = stack.pop()
        if u in known or u in seen:
            continue
        seen.add(u)
        node = g.producer.get(u)
        data = _keeping_step(g, node) if node is not None else None
        if data is None:
            return False
        stack.extend(data)
    return True


def refuse_padding(sidecar: dict[str, Any] | None, name: str, arrays: dict[str, np.ndarray], engine: str) -> None:
    """`run`'s guard: an engine whose attention lost its mask must never see a padded row."""
    from trtforge.core.errors import UserError

    fusion = (sidecar or {}).get("attention_fusion") or {}
    if fusion.get("padding_allowed", True):
        return
    for mask in fusion.get("mask_inputs") or []:
        value = arrays.get(mask)
        if value is not None and not np.all(value != 0):
            raise UserError(
                f"input '{name}' has zeros in '{mask}' (padding), but {engine} was built with unmasked fused "
                "attention; give unpadded inputs or rebuild with --fuse-attention off."
            )
