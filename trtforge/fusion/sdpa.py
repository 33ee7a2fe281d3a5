"""The attention pass's second form: the scaled-dot-product core alone, Q, K and V taken as the tensors the graph
feeds it, from wherever they come (after rotary positions, after a norm), for TrtforgeFlashAttention v2 (cuDNN's
SDPA with separate Q, K, V inputs).

Structure: from the Softmax up to MatMul(Q, Kᵀ) through Cast, scalar scales, additive terms (masks, position
biases) and Where masks; down to MatMul(probs, V). K is read through its Transpose; K and V through the
Unsqueeze -> Expand -> Reshape that repeats grouped-query heads (the repeat is dropped: the plugin reads the
unrepeated heads). Numbers: one ONNX Runtime run gives Q, K, V, the additive terms and the context; the added
terms are split into a pattern of blocked keys (read as cuDNN's diagonal band: causal, bottom-right causal,
sliding window) and the finite rest (dropped when constant across a query's keys, else fed as a bias input); the
pass keeps a candidate only if the plugin's computation, recomputed in numpy, equals the graph's context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.fusion.attention_match import pv_matmul
from trtforge.fusion.index import GraphIndex, attr

BLOCKED = -1e4  # an added score at or below this hides its key (masks write -inf, finfo.min or -1e4..-1e9)
NO_BOUND = -1


@dataclass
class CoreAttention:
    """One softmax(scale Q Kᵀ + terms) V as the graph writes it, and what the plugin makes of it."""

    softmax: str
    q: str = ""  # [B, H, Sq, D]
    k: str = ""  # [B, Hk, Skv, D], or Kᵀ [B, Hk, D, Skv] where k_transposed
    v: str = ""  # [B, Hk, Skv, D]
    k_transposed: bool = False
    k_repeated: str = ""  # the repeated K the scores read, where a grouped-query repeat was found
    v_repeated: str = ""
    scale: float = 1.0
    terms: list[tuple[str, float]] = field(default_factory=list)  # tensors added to the scores, with their factor
    where_masks: list[tuple[str, bool]] = field(default_factory=list)  # (condition, True: the condition hides the key)
    out: str = ""  # probs @ V: [B, H, Sq, D]
    heads: int = 0
    kv_heads: int = 0
    head_size: int = 0
    q_len: int = 0
    kv_len: int = 0
    alignment: int = 0  # 0: the band's diagonal starts top-left; 1: bottom-right (query i sits at key i + Skv - Sq)
    left_bound: int = NO_BOUND  # keys j with j > i' - left_bound are kept (i' the aligned query); -1: no bound
    right_bound: int = NO_BOUND  # keys j <= i' + right_bound are kept; 0: causal; -1: no bound
    bias: bool = False  # the terms are fed to the plugin as an additive bias input
    masked: bool = False  # something was added or masked between the scores and the softmax
    io_dtype: Any = np.float32
    reason: str | None = None

    @property
    def causal(self) -> bool:
        return self.right_bound == 0

    @property
    def seq(self) -> int:  # what a route reads as the sequence length
        return self.kv_len


def _reaches_matmul(g: GraphIndex, t: str, depth: int = 8) -> bool:
    node = g.producer.get(t)
    if node is None or depth == 0:
        return False
    if node.op_type == "MatMul":
        return True
    if node.op_type == "Cast" or (node.op_type in ("Mul", "Div") and g.scalar(node.input[1]) is not None):
        return _reaches_matmul(g, node.input[0], depth - 1)
    if node.op_type == "Mul" and g.scalar(node.input[0]) is not None:
        return _reaches_matmul(g, node.input[1], depth - 1)
    if node.op_type in ("Add", "Where"):
        return any(_reaches_matmul(g, i, depth - 1) for i in node.input[(1 if node.op_type == "Where" else 0) :])
    return False


def _scores_terms(g: GraphIndex, c: CoreAttention, start: str) -> onnx.NodeProto | None:
    """Up from the softmax input to the scores MatMul, collecting the scale, each added term with the factor the scales
    below it give it, and Where masks whose other branch is a large negative constant."""
    t, factor = start, 1.0
    for _ in range(16):
        node = g.producer.get(t)
        if node is None:
            return None
        op = node.op_type
        if op == "MatMul":
            c.scale = factor
            return node
        if op == "Cast":
            t = node.input[0]
        elif op in ("Mul", "Div") and g.scalar(node.input[1]) is not None:
            s = g.scalar(node.input[1])
            factor *= s if op == "Mul" else 1.0 / s
            t = node.input[0]
        elif op == "Mul" and g.scalar(node.input[0]) is not None:
            factor *= g.scalar(node.input[0])
            t = node.input[1]
        elif op == "Add":
            main = [i for i in node.input if _reaches_matmul(g, i)]
            if len(main) != 1:
                return None
            c.masked = True
            c.terms += [(i, factor) for i in node.input if i != main[0]]
            t = main[0]
        elif op == "Where":
            main = [i for i in node.input[1:] if _reaches_matmul(g, i)]
            other = [i for i in node.input[1:] if i not in main]
            if len(main) != 1 or len(other) != 1 or g.scalar(other[0]) is None or not g.scalar(other[0]) <= BLOCKED:
                return None
            c.masked = True
            c.where_masks.append((node.input[0], node.input[2] == main[0]))
            t = main[0]
        else:
            return None
    return None


def _scaled_operand(g: GraphIndex, t: str) -> tuple[str, float]:
    """An operand seen through scalar Mul/Div (the legacy exporter scales Q and Kᵀ by sqrt(scale) each)."""
    factor = 1.0
    while (node := g.producer.get(t)) is not None:
        if node.op_type in ("Mul", "Div") and g.scalar(node.input[1]) is not None:
            s = g.scalar(node.input[1])
            factor *= s if node.op_type == "Mul" else 1.0 / s
            t = node.input[0]
        elif node.op_type == "Mul" and g.scalar(node.input[0]) is not None:
            factor *= g.scalar(node.input[0])
            t = node.input[1]
        else:
            break
    return t, factor


def _unrepeated(g: GraphIndex, t: str) -> str | None:
    """The tensor before a grouped-query repeat Reshape(Expand(Unsqueeze(x, axis 2))), or None; verify() checks
    numerically that t is x with each head repeated in place."""
    reshape = g.producer.get(t)
    if reshape is None or reshape.op_type != "Reshape":
        return None
    expand = g.producer.get(reshape.input[0])
    if expand is None or expand.op_type != "Expand":
        return None
    unsq = g.producer.get(expand.input[0])
    if unsq is None or unsq.op_type != "Unsqueeze":
        return None
    axes = g.const(unsq.input[1]) if len(unsq.input) > 1 else attr(unsq, "axes")
    if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([2], [-3]):
        return None
    return unsq.input[0]


def match_core(g: GraphIndex, softmax: onnx.NodeProto, name: str, pv: onnx.NodeProto | None) -> CoreAttention:
    """The structural half for one Softmax (axis -1) whose output feeds MatMul(probs, V) `pv`."""
    c = CoreAttention(softmax=name)
    if pv is None:
        c.reason = "the softmax output does not feed MatMul(probs, V)"
        return c
    scores = _scores_terms(g, c, softmax.input[0])
    if scores is None:
        c.reason = "the softmax does not read MatMul(Q, Kᵀ) through Cast, scalar scales, added terms and Where masks only"
        return c
    c.q, q_factor = _scaled_operand(g, scores.input[0])
    kt, k_factor = _scaled_operand(g, scores.input[1])
    c.scale *= q_factor * k_factor
    node = g.producer.get(kt)
    if node is not None and node.op_type == "Transpose" and list(attr(node, "perm", [])) == [0, 1, 3, 2]:
        c.k = node.input[0]
    else:
        c.k, c.k_transposed = kt, True
    c.v = pv.input[1]
    c.out = pv.output[0]
    if not c.k_transposed:
        c.k_repeated = c.k
        c.k = _unrepeated(g, c.k) or c.k
    c.v_repeated = c.v
    c.v = _unrepeated(g, c.v) or c.v
    if c.k == c.k_repeated:
        c.k_repeated = ""
    if c.v == c.v_repeated:
        c.v_repeated = ""
    return c


def observed_names(c: CoreAttention) -> list[str]:
    return [t for t in [c.q, c.k, c.v, c.k_repeated, c.v_repeated, c.out, *(t for t, _ in c.terms), *(w for w, _ in c.where_masks)] if t]


def added_term(c: CoreAttention, values: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """What the graph adds to scale·Q Kᵀ before the softmax, broadcast to the scores' shape (-inf: a Where-hidden key)."""
    total = np.zeros(shape, np.float64)
    for t, factor in c.terms:
        total = total + factor * np.broadcast_to(values[t].astype(np.float64), shape)
    for cond, hides in c.where_masks:
        hidden = np.broadcast_to(values[cond].astype(bool), shape)
        total = np.where(hidden if hides else ~hidden, -np.inf, total)
    return total


def band(allowed: np.ndarray) -> tuple[int, int, int] | None:
    """(alignment, left_bound, right_bound) of cuDNN's diagonal band that keeps exactly the `allowed` [Sq, Skv] keys,
    or None. Key j of query i is kept iff i' - left_bound < j <= i' + right_bound, with i' = i (top-left) or
    i + Skv - Sq (bottom-right); a bound of -1 is none. A query with no key left is no band."""
    sq, skv = allowed.shape
    if not allowed.any(axis=1).all():
        return None
    for alignment in (0, 1) if sq == skv else (1, 0):
        d = np.arange(skv)[None, :] - (np.arange(sq)[:, None] + (skv - sq if alignment else 0))
        lo, hi = int(d[allowed].min()), int(d[allowed].max())
        if not np.array_equal(allowed, (d >= lo) & (d <= hi)):
            continue
        right = NO_BOUND if hi >= int(d.max()) else hi
        left = NO_BOUND if lo <= int(d.min()) else 1 - lo
        if right < NO_BOUND or (right != NO_BOUND and right < 0) or (left != NO_BOUND and left < 1):
            continue
        return alignment, left, right
    return None


def band_mask(sq: int, skv: int, alignment: int, left: int, right: int) -> np.ndarray:
    """[Sq, Skv] True where the band keeps the key (band's inverse)."""
    d = np.arange(skv)[None, :] - (np.arange(sq)[:, None] + (skv - sq if alignment else 0))
    keep = np.ones((sq, skv), bool)
    if right != NO_BOUND:
        keep &= d <= right
    if left != NO_BOUND:
        keep &= d > -left
    return keep


def plugin_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, keep: np.ndarray | None, bias: np.ndarray | None
) -> np.ndarray:
    """What TrtforgeFlashAttention v2 computes, in fp32 (1e-6 from fp64 at 512 keys, against the check's 1e-4; fp64
    matmuls cost seconds per layer on a full-size model): K/V heads repeated to Q's (head h reads kv head h // (H / Hk)),
    softmax(scale Q Kᵀ + bias, keys outside `keep` hidden) V."""
    rep = q.shape[1] // k.shape[1]
    k32, v32 = (np.repeat(a.astype(np.float32), rep, axis=1) for a in (k, v))
    scores = q.astype(np.float32) @ k32.swapaxes(-1, -2)
    scores *= np.float32(scale)
    if bias is not None:
        scores += bias.astype(np.float32)
    if keep is not None:
        scores = np.where(keep, scores, np.float32(-np.inf))
    scores -= scores.max(-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(-1, keepdims=True)
    return scores @ v32


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def verify_core(c: CoreAttention, values: dict[str, np.ndarray]) -> None:
    """The numeric half: shapes, the grouped-query repeat, the added terms as band and bias, and the plugin's
    recomputed context against ORT's. Sets c.reason where the plugin cannot take it."""
    q, out = values[c.q], values[c.out]
    k = values[c.k]
    if c.k_transposed and k.ndim == 4:
        k = k.swapaxes(-1, -2)
    v = values[c.v]
    if any(a.ndim != 4 for a in (q, k, v, out)):
        c.reason = f"Q, K, V or the context is not [batch, heads, seq, head] ({[list(a.shape) for a in (q, k, v, out)]})"
        return
    reason = _repeat_mismatch(c, k, v, values)
    if reason is not None:
        c.reason = reason
        return
    b, h, sq, d = q.shape
    if k.shape[0] != b or v.shape != k.shape or k.shape[3] != d or h % k.shape[1] or out.shape != (b, h, sq, d):
        c.reason = f"Q {list(q.shape)}, K {list(k.shape)}, V {list(v.shape)} and context {list(out.shape)} are no SDPA shapes"
        return
    c.heads, c.kv_heads, c.head_size, c.q_len, c.kv_len = h, k.shape[1], d, sq, k.shape[2]
    c.io_dtype = out.dtype
    reason, bias = _band_and_bias(c, added_term(c, values, (b, h, sq, c.kv_len)))
    if reason is not None:
        c.reason = reason
        return
    want = plugin_attention(q, k, v, c.scale, band_mask(sq, c.kv_len, c.alignment, c.left_bound, c.right_bound), bias)
    fp16 = any(a.dtype == np.float16 for a in (q, k, v, out)) or (c.bias and any(values[t].dtype == np.float16 for t, _ in c.terms))
    tol = 2e-2 if fp16 else 1e-4
    err = _rel(out, want)
    if not err <= tol:
        c.reason = f"recomputed attention differs from the graph's (rel-L2 {err:.1e} > {tol:g}): a layout this pass does not model"


def _repeat_mismatch(c: CoreAttention, k: np.ndarray, v: np.ndarray, values: dict[str, np.ndarray]) -> str | None:
    """Why a grouped-query repeat of K or V is not the plain repeat of heads the plugin does itself (None: it is)."""
    for name, un in (("K", c.k_repeated), ("V", c.v_repeated)):
        if not un:
            continue
        small, full = (k if name == "K" else v), values[un]
        rep = full.shape[1] // max(small.shape[1], 1)
        if rep < 1 or full.shape[1] % small.shape[1] or not np.array_equal(np.repeat(small, rep, axis=1), full):
            return f"{name}'s heads are not repeated in place from {list(small.shape)} (a grouped-query layout this pass does not model)"
    return None


def _band_and_bias(c: CoreAttention, term: np.ndarray) -> tuple[str | None, np.ndarray | None]:
    """The added terms as the plugin takes them: a causal or window band (c.alignment and bounds) and, where the band
    cannot carry them, a bias (c.bias). Returns why the plugin cannot take them (else None) and the bias to apply."""
    blocked = term <= BLOCKED
    keep = ~blocked
    if not np.array_equal(keep.all(axis=(0, 1)), keep.any(axis=(0, 1))):
        return (
            "the keys a mask hides differ between rows or heads on unpadded inputs (a padding or per-head mask cuDNN's band cannot take)"
        ), None
    found = band(keep[0, 0])
    finite = np.where(blocked, np.nan, term)
    with np.errstate(invalid="ignore"):
        spread = np.nanmax(finite, -1) - np.nanmin(finite, -1)
        magnitude = np.nanmax(np.abs(finite)) if np.isfinite(finite).any() else 0.0
    needs_bias = bool(np.nanmax(spread, initial=0.0) > 1e-6 * max(1.0, magnitude))
    if found is None and not needs_bias and blocked.any():
        needs_bias = True  # the pattern is no band: the terms themselves carry it
    if needs_bias:
        if c.where_masks:
            return "a Where mask that is no causal or window band sits beside an added bias (no one bias tensor carries both)", None
        if not c.terms:
            return "the masked keys form no causal or window band", None
    c.bias = needs_bias
    if found is not None:
        c.alignment, c.left_bound, c.right_bound = found
        if needs_bias:  # the bias carries the window itself: cuDNN before 9.10.2 takes no left bound beside a bias
            c.left_bound = NO_BOUND
        if c.left_bound == NO_BOUND and c.right_bound == NO_BOUND:
            c.alignment = 0
    return None, (np.where(blocked, -np.inf, term) if needs_bias else None)


def core_plugin_nodes(
    c: CoreAttention, prefix: str, plugin: str, version: str, domain: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Q, K, V (and the summed terms as bias [1|B, 1|H, Sq, Skv]) -> TrtforgeFlashAttention v2 -> c.out, in fp16 (the
    plugin's type; Casts around it where the graph runs another)."""
    n = lambda s: f"{prefix}/{s}"  # noqa: E731
    half = onnx.TensorProto.FLOAT16
    cast_in = np.dtype(c.io_dtype) != np.float16
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def to_half(t: str, tag: str) -> str:
        if not cast_in:
            return t
        nodes.append(helper.make_node("Cast", [t], [n(f"{tag}_fp16")], name=n(f"{tag}_cast"), to=half))
        return n(f"{tag}_fp16")

    q, v = to_half(c.q, "q"), to_half(c.v, "v")
    k = to_half(c.k, "k")
    if c.k_transposed:
        nodes.append(helper.make_node("Transpose", [k], [n("k_heads")], name=n("k_transpose"), perm=[0, 1, 3, 2]))
        k = n("k_heads")
    inputs = [q, k, v]
    if c.bias:
        total = ""
        for i, (t, factor) in enumerate(c.terms):
            term = t
            if factor != 1.0:
                inits.append(numpy_helper.from_array(np.array(factor, np.float32), n(f"bias{i}_factor")))
                nodes += [
                    helper.make_node("Cast", [t], [n(f"bias{i}_fp32")], name=n(f"bias{i}_cast"), to=onnx.TensorProto.FLOAT),
                    helper.make_node("Mul", [n(f"bias{i}_fp32"), n(f"bias{i}_factor")], [n(f"bias{i}_scaled")], name=n(f"bias{i}_scale")),
                ]
                term = n(f"bias{i}_scaled")
            nodes.append(helper.make_node("Cast", [term], [n(f"bias{i}_fp16")], name=n(f"bias{i}_to_fp16"), to=half))
            term = n(f"bias{i}_fp16")
            if total:
                nodes.append(helper.make_node("Add", [total, term], [n(f"bias_sum{i}")], name=n(f"bias_sum{i}")))
                term = n(f"bias_sum{i}")
            total = term
        # [1|B, 1|H, Sq, Skv]: leading axes added where the terms had fewer, the query and key axes made full
        inits += [
            numpy_helper.from_array(np.array([2], np.int64), n("axis2")),
            numpy_helper.from_array(np.array([1, 1], np.int64), n("ones")),
        ]
        nodes += [
            helper.make_node("Shape", [q], [n("q_shape")], name=n("q_shape")),
            helper.make_node("Shape", [c.v], [n("v_shape")], name=n("v_shape")),
            helper.make_node("Gather", [n("q_shape"), n("axis2")], [n("sq")], name=n("sq"), axis=0),
            helper.make_node("Gather", [n("v_shape"), n("axis2")], [n("skv")], name=n("skv"), axis=0),
            helper.make_node("Concat", [n("ones"), n("sq"), n("skv")], [n("bias_shape")], name=n("bias_shape"), axis=0),
            helper.make_node("Expand", [total, n("bias_shape")], [n("bias")], name=n("bias_expand")),
        ]
        inputs.append(n("bias"))
    out = c.out if not cast_in else n("out_fp16")
    nodes.append(
        helper.make_node(
            plugin,
            inputs,
            [out],
            name=n("sdpa"),
            domain=domain,
            plugin_version=version,
            plugin_namespace="",
            num_heads=c.heads,
            kv_heads=c.kv_heads,
            head_size=c.head_size,
            scale=float(c.scale),
            alignment=c.alignment,
            left_bound=c.left_bound,
            right_bound=c.right_bound,
            has_bias=int(c.bias),
        )
    )
    if cast_in:
        nodes.append(helper.make_node("Cast", [out], [c.out], name=n("out_cast"), to=helper.np_dtype_to_tensor_dtype(np.dtype(c.io_dtype))))
    return nodes, inits


def match_cores(model: onnx.ModelProto, cands: list[Any]) -> dict[str, CoreAttention]:
    """The structural SDPA core of each candidate (by softmax name)."""
    g = GraphIndex(model)
    by_output = {n.output[0]: n for n in model.graph.node if n.op_type == "Softmax"}
    return {c.softmax: match_core(g, by_output[c.probs], c.softmax, pv_matmul(g, c.probs)) for c in cands if c.probs in by_output}


def core_names(cores: dict[str, CoreAttention]) -> set[str]:
    """The tensors verify_core reads for the cores still standing."""
    return {t for c in cores.values() if c.reason is None for t in observed_names(c)}


def verify_cores(cores: dict[str, CoreAttention], values: dict[str, np.ndarray]) -> None:
    for c in cores.values():
        if c.reason is None:
            verify_core(c, values)


def core_mask_words(c: CoreAttention) -> str:
    """The band in words, for the report: "none", "causal", "causal (bottom-right)", "window -L..+R"."""
    if c.left_bound == NO_BOUND and c.right_bound == NO_BOUND:
        return "none"
    where = " (bottom-right)" if c.alignment else ""
    if c.left_bound == NO_BOUND and c.right_bound == 0:
        return "causal" + where
    left = "" if c.left_bound == NO_BOUND else f"-{c.left_bound - 1}"
    right = "" if c.right_bound == NO_BOUND else f"+{c.right_bound}"
    return f"window {left}..{right}{where}"
