"""The packed form's replacement nodes: X -> one packed QKV projection (MatMul or 1x1 Conv, float or INT8) -> the
plugin (CustomQKVToContextPluginDynamic v2 or TrtforgeFlashAttention v1) -> the merged-heads context."""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.fusion.attention_match import Candidate, Projection
from trtforge.fusion.index import GraphIndex
from trtforge.fusion.plugins import FLASH_PLUGIN, FLASH_VERSION, PLUGIN, PLUGIN_DOMAIN, PLUGIN_VERSION, Route


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


def activation_qdq(g: GraphIndex, x: str) -> tuple[str, str, str] | None:
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


def packed_plugin_nodes(
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
    per layer, a reshape before a convolution costs nothing. With INT8
    projections, x_qdq (activation_qdq of X) lets the reshape go before X's own Q/DQ, so that DequantizeLinear
    feeds the Conv directly, the pattern TensorRT fuses into an int8 convolution.

    seq_tensor: an earlier flash node's [S] tensor, of the same sequence length (same_leading_dims), which this flash
    node then reads instead of writing its own: each is a fill kernel in the engine (cuFillLayer) per layer."""
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
        weight, gemm_dtype = _quantized_weight(c, q_factor, conv, n, nodes, inits)
    if conv:
        qkv_tokens = _conv_projection(c, b, weight, gemm_dtype, e_in, x_qdq, n, nodes, inits)
    else:
        qkv_tokens = _matmul_projection(x, b, weight, gemm_dtype, e, n, nodes, inits)
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
    nodes += _plugin_call(c, flash, qkv_tokens, seq_tensor, e, n)
    if c.ctx_rank == 2:  # the graph merged the tokens itself: [B*S, E]
        inits.append(numpy_helper.from_array(np.array([-1, e], np.int64), n("ctx_shape")))
    else:
        nodes.append(helper.make_node("Concat", [n("bs"), n("hidden")], [n("ctx_shape")], name=n("ctx_shape"), axis=0))
    nodes.append(helper.make_node("Reshape", [n("ctx_tokens"), n("ctx_shape")], [c.ctx], name=n("ctx")))
    return nodes, inits


def _quantized_weight(
    c: Candidate,
    q_factor: float,
    conv: bool,
    n: Callable[[str], str],
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
) -> tuple[str, np.dtype]:
    """INT8 projections make one INT8 GEMM: the packed weight behind its own Q/DQ (appended to nodes and inits).
    Returns the dequantized weight's name and the GEMM's type, which DequantizeLinear takes from its scales."""
    scales = pack_qkv_scales(c.q, c.k, c.v, c.heads, q_factor)
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
    return weight, scales.dtype


def _conv_projection(
    c: Candidate,
    b: np.ndarray,
    weight: str,
    gemm_dtype: np.dtype,
    e_in: int,
    x_qdq: tuple[str, str, str] | None,
    n: Callable[[str], str],
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
) -> str:
    """The "conv" QKV projection (appended to nodes and inits): X as [tokens, E_in, 1, 1], a 1x1 Conv writing the
    plugin's [tokens, 3E, 1, 1]. Returns the name of the plugin's QKV input."""
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
            helper.make_node("DequantizeLinear", [n("x_tokens_q"), x_scale, x_zero], [n("x_tokens")], name=n("x_tokens_DequantizeLinear")),
        ]
    else:
        nodes.append(helper.make_node("Reshape", [c.q.x, n("x_tokens_shape")], [n("x_tokens")], name=n("x_to_tokens")))
    nodes += [helper.make_node("Conv", [n("x_tokens"), weight, n("qkv_bias")], [n("qkv_conv")], name=n("qkv_conv"), kernel_shape=[1, 1])]
    qkv_tokens = n("qkv_conv")
    if gemm_dtype != b.dtype:
        nodes.append(
            helper.make_node("Cast", [qkv_tokens], [n("qkv_tokens")], name=n("qkv_conv_cast"), to=helper.np_dtype_to_tensor_dtype(b.dtype))
        )
        qkv_tokens = n("qkv_tokens")
    return qkv_tokens


def _matmul_projection(
    x: str,
    b: np.ndarray,
    weight: str,
    gemm_dtype: np.dtype,
    e: int,
    n: Callable[[str], str],
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
) -> str:
    """The "matmul" QKV projection (appended to nodes and inits): MatMul, bias Add, Reshape to the plugin's
    [tokens, 3E, 1, 1]. Returns the name of the plugin's QKV input."""
    inits += [numpy_helper.from_array(b, n("qkv_bias")), numpy_helper.from_array(np.array([-1, 3 * e, 1, 1], np.int64), n("qkv_shape"))]
    mm = n("qkv_mm")
    nodes.append(helper.make_node("MatMul", [x, weight], [mm], name=n("qkv_matmul")))
    if gemm_dtype != b.dtype:  # e.g. an fp32 (INT8 or kept) GEMM in an fp16 graph
        nodes.append(helper.make_node("Cast", [mm], [n("qkv_mm_cast")], name=n("qkv_mm_cast"), to=helper.np_dtype_to_tensor_dtype(b.dtype)))
        mm = n("qkv_mm_cast")
    nodes += [
        helper.make_node("Add", [mm, n("qkv_bias")], [n("qkv")], name=n("qkv_bias_add")),
        helper.make_node("Reshape", [n("qkv"), n("qkv_shape")], [n("qkv_tokens")], name=n("qkv_to_tokens")),
    ]
    return n("qkv_tokens")


def _plugin_call(
    c: Candidate, flash: bool, qkv_tokens: str, seq_tensor: str | None, e: int, n: Callable[[str], str]
) -> list[onnx.NodeProto]:
    """The plugin node writing the context tokens: the flash plugin reads the [S] tensor, PLUGIN v2 the cu_seqlens
    made here (every row full)."""
    if flash:
        return [
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
        ]
    return [
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
