"""The attention pass's structural match of the packed form: from each Softmax up to the scores MatMul (through
mask Add/Where, scalar Mul/Div, Cast), down to probs @ V (through the NaN guard and Cast), and from the two
MatMuls up to Q, K, V projections of one tensor X by constant weights (MatMul or Gemm, optional bias, through
Reshape/Transpose/scalar scale/Cast, whatever order the exporter chose). A failed match carries its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx

from trtforge.fusion.index import GraphIndex, attr

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


def _reaches_matmul(g: GraphIndex, t: str, depth: int = 6) -> bool:
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


def _scores_path(g: GraphIndex, cand: Candidate, start: str) -> onnx.NodeProto | None:
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


def _quantized_weight(g: GraphIndex, name: str, out_axis: int) -> tuple[np.ndarray, np.ndarray] | None:
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
            or attr(quant, "axis", 1) != attr(dq, "axis", 1)
        ):
            return None
        w = g.const(quant.input[0])
        if w is None:
            return None
        q = np.clip(np.rint(w.astype(np.float64) / _broadcast(scale, attr(dq, "axis", 1), w.ndim)), -128, 127)
    elif q.dtype != np.int8:
        return None
    if q.ndim != 2:
        return None
    axis = attr(dq, "axis", 1) % 2
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


def _column_slice(g: GraphIndex, node: onnx.NodeProto, t: str) -> Callable[[int], tuple[int, int]] | None:
    """For output t of a Split or Slice along the last axis (GPT-2's packed c_attn: Q, K, V split from one projection),
    the columns [lo, hi) it keeps as a function of the input's width (a Split without sizes cuts equal parts); None when
    the bounds are not constants on that axis."""
    if node.op_type == "Split":
        sizes = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else attr(node, "split")
        if attr(node, "axis", 0) not in (-1, 2):
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


def _gemm_input(g: GraphIndex, x: str) -> str:
    """A GEMM's input seen through the Reshape [B, S, E] -> [B*S, E] the legacy exporter writes before a Gemm (the
    weight acts on the last axis either way; verify's recomputation refuses any other reading)."""
    node = g.producer.get(x)
    return node.input[0] if node is not None and node.op_type == "Reshape" else x


def _projection(g: GraphIndex, start: str) -> Projection | None:
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
            return _matmul_weights(g, node, bias, scale, cols)
        elif op == "Gemm":
            return _gemm_weights(g, node, bias, scale, cols)
        else:
            return None
    return None


def _matmul_weights(
    g: GraphIndex, node: onnx.NodeProto, bias: np.ndarray | None, scale: float, cols: Callable[[int], tuple[int, int]] | None
) -> Projection | None:
    """The end of _projection's walk at X @ W: W constant or dequantized, 2-D (None otherwise)."""
    w, wscale = g.const(node.input[1]), None
    if w is None:
        w, wscale = _quantized_weight(g, node.input[1], 1) or (None, None)
    if w is None or w.ndim != 2:
        return None
    return _sliced(Projection(node.input[0], w, bias, scale, wscale), cols)


def _gemm_weights(
    g: GraphIndex, node: onnx.NodeProto, bias: np.ndarray | None, scale: float, cols: Callable[[int], tuple[int, int]] | None
) -> Projection | None:
    """The end of _projection's walk at Gemm(X, W, C): W constant or dequantized, no transA or alpha, and C a constant
    bias where no bias was met above it (None otherwise)."""
    trans_b = attr(node, "transB", 0)
    w, wscale = g.const(node.input[1]), None
    if w is None:
        w, wscale = _quantized_weight(g, node.input[1], 0 if trans_b else 1) or (None, None)
    if w is None or attr(node, "transA", 0) or attr(node, "alpha", 1.0) != 1.0:
        return None
    w = w.T if trans_b else w
    if len(node.input) > 2 and node.input[2]:
        c = g.const(node.input[2])
        if c is None or bias is not None:
            return None
        bias = c * attr(node, "beta", 1.0)
    return _sliced(Projection(_gemm_input(g, node.input[0]), w, bias, scale, wscale), cols)


def pv_matmul(g: GraphIndex, probs: str) -> onnx.NodeProto | None:
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


def _context(g: GraphIndex, pv: onnx.NodeProto) -> list[str]:
    """Tensors below probs @ V, through its head-merging Transpose/Reshape/Cast (single data consumer)."""
    out, t = [], pv.output[0]
    for _ in range(6):
        users = g.data_consumers(t)
        if len(users) != 1 or users[0].op_type not in ("Transpose", "Reshape", "Cast"):
            break
        t = users[0].output[0]
        out.append(t)
    return out


def _is_dequantized_activation(g: GraphIndex, t: str) -> bool:
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
    g = GraphIndex(model)
    found = []
    for i, node in enumerate(model.graph.node):
        if node.op_type != "Softmax":
            continue
        cand = Candidate(softmax=node.name or f"Softmax#{i}", probs=node.output[0])
        found.append(cand)
        axis = attr(node, "axis", -1)
        if axis not in (-1, 3):
            cand.reason = f"softmax over axis {axis}, not the keys"
            continue
        scores = _scores_path(g, cand, node.input[0])
        if scores is None:
            cand.reason = "the softmax does not read MatMul(Q, Kᵀ) (through scale, mask and Cast only)"
            continue
        cand.scores = scores.output[0]
        pv = pv_matmul(g, node.output[0])
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
