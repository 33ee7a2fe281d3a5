"""The attention pass's numeric half for the packed form: one ONNX Runtime run of the original graph on unpadded
inputs gives X, the heads (the scores' shape), the softmax probabilities (zero above the diagonal: causal) and the
context; a candidate is kept only if softmax(Q Kᵀ s) V recomputed in numpy from X and the weights equals that
context, so a layout the matcher misreads is refused, never fused wrong."""

from __future__ import annotations

import numpy as np
import onnx

from trtforge.fusion.attention_match import Candidate, Projection
from trtforge.fusion.index import observe


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


def varies_across_keys(term: np.ndarray, causal: bool = False) -> bool:
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


def verify_names(cands: list[Candidate]) -> set[str]:
    """The tensors verify() reads for the candidates still standing."""
    names: set[str] = set()
    for c in cands:
        if c.reason is None:
            names.update([c.scores, c.probs, *c.ctx.split(","), *c.terms])
            names.update(p.x for p in (c.q, c.k, c.v) if p is not None)
    return names


def verify(
    model: onnx.ModelProto, cands: list[Candidate], feeds: dict[str, np.ndarray], values: dict[str, np.ndarray] | None = None
) -> None:
    """Numeric half of the match: heads, causality and the recomputed context against ORT's. values: verify_names'
    tensors observed already (one ORT run shared with the SDPA-core form), else observed here."""
    live = [c for c in cands if c.reason is None]
    if not live:
        return
    if values is None:
        values = observe(model, feeds, sorted(verify_names(live)))
    for c in live:
        c.reason = _scores_mismatch(c, values) or _projections_mismatch(c) or _context_mismatch(c, values)


def _scores_mismatch(c: Candidate, values: dict[str, np.ndarray]) -> str | None:
    """Why the observed scores and probabilities are no attention the plugin runs (None: they are); sets c.causal."""
    scores, probs = values[c.scores], values[c.probs]
    if scores.ndim != 4:
        return f"scores are {list(scores.shape)}, not [batch, heads, seq, seq]"
    if probs.shape != scores.shape:
        return f"the softmax runs on a reshaped view of the scores ({list(probs.shape)}, scores {list(scores.shape)})"
    s = probs.shape[-1]
    c.causal = bool(
        s > 1 and probs.shape[-2] == s and not np.any(np.abs(probs[..., np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]]) > 0)
    )
    if c.causal and not c.masked:  # zeros without a mask term are underflow, not a mask the plugin may apply
        return "probabilities above the diagonal are zero but no mask term precedes the softmax"
    # Decided on the terms themselves, not on the recomputed context: a small bias stays within the tolerance
    # below and the plugin would drop it.
    if any(varies_across_keys(values[t], c.causal) for t in c.terms):
        return (
            "a term that varies across the keys is added to the scores on unpadded inputs, so it is no padding "
            "mask (a relative-position bias or a window mask, as in T5 and Swin): the plugin adds none"
        )
    return None


def _projections_mismatch(c: Candidate) -> str | None:
    """Why Q, K and V cannot be packed into one projection of one tensor (None: they can)."""
    if None in (c.q, c.k, c.v):
        return "Q, K or V is not a projection X·W (+ b) by constant weights"
    quantized = [p.wscale is not None for p in (c.q, c.k, c.v)]
    if any(quantized) and not all(quantized):
        return "Q, K and V projections are not all INT8 or all float (one packed GEMM cannot mix them)"
    if all(quantized) and not (c.q.scale > 0 and c.k.scale > 0 and c.v.scale > 0 and c.scale > 0):
        return "a non-positive scale on an INT8 projection cannot be folded into its weight scales"
    if not (c.q.x == c.k.x == c.v.x):
        return "Q, K and V are projections of different tensors (cross-attention)"
    return None


def _context_mismatch(c: Candidate, values: dict[str, np.ndarray]) -> str | None:
    """Why the context recomputed from X and the weights is not the graph's (None: it is); sets the heads, the head
    size, the sequence, the context tensor with its type and rank."""
    x = values[c.q.x]
    if x.ndim != 3:
        return f"the projected tensor is {list(x.shape)}, not [batch, seq, hidden]"
    c.heads = int(values[c.scores].shape[1])
    e = c.q.weight.shape[1]
    if not (c.k.weight.shape == c.q.weight.shape == c.v.weight.shape) or e % c.heads:
        return f"Q/K/V weights {c.q.weight.shape}, {c.k.weight.shape}, {c.v.weight.shape} do not split into {c.heads} heads"
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
        return "no [batch, seq, hidden] context tensor below probs @ V"
    c.ctx = ctx[0]
    c.io_dtype = values[c.ctx].dtype
    ref = reference_attention(x, c.q, c.k, c.v, c.heads, c.scale, c.causal)
    fp16 = c.io_dtype == np.float16 or any(a is not None and a.dtype == np.float16 for p in (c.q, c.k, c.v) for a in (p.weight, p.bias))
    tol = 2e-2 if fp16 else 1e-4  # a misread layout is off by O(1)
    c.ctx_rank = values[c.ctx].ndim
    err = _rel(values[c.ctx], ref.reshape(values[c.ctx].shape))
    if not err <= tol:
        return f"recomputed attention differs from the graph's (rel-L2 {err:.1e} > {tol:g}): a layout this pass does not model"
    return None
