"""An ONNX Runtime stand-in for TensorRT's CustomQKVToContextPluginDynamic v2 (var_seqlen, full rows), for tests:
ORT cannot run the plugin, so the fused graph is proven on CPU by replacing each plugin node with the attention
the plugin computes (each head's q, k, v adjacent in [tokens, 3E, 1, 1], scale 1/sqrt(padded head))."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.fusion.plugins import PLUGIN


def _expand(model: onnx.ModelProto, op_type: str, expand) -> onnx.ModelProto:
    """A copy of `model` with every `op_type` node replaced by expand(node, attrs, prefix, const) -> nodes, where
    const(name, value) adds an initializer under the node's own prefix and returns its name."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        if node.op_type != op_type:
            nodes.append(node)
            continue
        p = node.name + "/emu"

        def const(name, value, p=p):
            out.graph.initializer.append(numpy_helper.from_array(np.asarray(value), p + name))
            return p + name

        nodes += expand(node, {x.name: helper.get_attribute_value(x) for x in node.attribute}, p, const)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _packed_attention(qkv, seq, out, e, n, scale, causal, dtype, p, c):
    """The attention both plugins compute: [tokens, 3E, 1, 1] with each head's q, k, v adjacent, the sequence length
    from `seq`'s length, softmax(scale q kᵀ [+ causal mask]) v in fp32, heads merged to [tokens, E, 1, 1] in `dtype`."""
    h = e // n
    nodes = [
        helper.make_node("Shape", [seq], [p + "S"]),
        helper.make_node(
            "Concat", [c("m1", np.array([-1], np.int64)), p + "S", c("n3h", np.array([n, 3, h], np.int64))], [p + "shape"], axis=0
        ),
        helper.make_node("Cast", [qkv], [p + "qkv32"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Reshape", [p + "qkv32", p + "shape"], [p + "bsn3h"]),
        helper.make_node("Transpose", [p + "bsn3h"], [p + "3bnsh"], perm=[3, 0, 2, 1, 4]),
        helper.make_node("Gather", [p + "3bnsh", c("i0", np.array(0, np.int64))], [p + "q"], axis=0),
        helper.make_node("Gather", [p + "3bnsh", c("i1", np.array(1, np.int64))], [p + "k"], axis=0),
        helper.make_node("Gather", [p + "3bnsh", c("i2", np.array(2, np.int64))], [p + "v"], axis=0),
        helper.make_node("Transpose", [p + "k"], [p + "kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", [p + "q", p + "kt"], [p + "qk"]),
        helper.make_node("Mul", [p + "qk", c("scale", np.array(scale, np.float32))], [p + "scores"]),
    ]
    scores = p + "scores"
    if causal:
        nodes += [
            helper.make_node("Concat", [p + "S", p + "S"], [p + "SS"], axis=0),
            helper.make_node("ConstantOfShape", [p + "SS"], [p + "neg"], value=numpy_helper.from_array(np.array([-np.inf], np.float32))),
            helper.make_node("Trilu", [p + "neg", c("k1", np.array(1, np.int64))], [p + "mask"], upper=1),
            helper.make_node("Add", [scores, p + "mask"], [p + "masked"]),
        ]
        scores = p + "masked"
    return nodes + [
        helper.make_node("Softmax", [scores], [p + "probs"], axis=-1),
        helper.make_node("MatMul", [p + "probs", p + "v"], [p + "bnsh"]),
        helper.make_node("Transpose", [p + "bnsh"], [p + "bsnh"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [p + "bsnh", c("outshape", np.array([-1, e, 1, 1], np.int64))], [p + "out32"]),
        helper.make_node("Cast", [p + "out32"], [out], to=dtype),
    ]


def emulate_plugins(model: onnx.ModelProto, padded_head: int, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """dtype: the plugin's I/O type in the graph (fp16 after trtforge's fp16 conversion); the math runs fp32."""

    def expand(node, a, p, c):
        return _packed_attention(
            node.input[0], node.input[3], node.output[0], a["hidden_size"], a["num_heads"], 1 / np.sqrt(padded_head), False, dtype, p, c
        )

    return _expand(model, PLUGIN, expand)


def emulate_flash_plugins(model: onnx.ModelProto, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """TrtforgeFlashAttention (trtforge/native/sdpa_plugin.cpp) as the ops its contract says cuDNN computes: input 0
    [tokens, 3E, 1, 1] with each head's q, k, v adjacent, input 1 [S] (its length is the sequence), the node's own
    `scale`, and with causal=1 a mask that hides every key after the query."""
    from trtforge.fusion.plugins import FLASH_PLUGIN

    def expand(node, a, p, c):
        if a["plugin_version"] != b"1":
            return [node]
        assert len(node.input) == 2 and set(a) >= {"scale", "causal"}, node.name
        return _packed_attention(
            node.input[0], node.input[1], node.output[0], a["hidden_size"], a["num_heads"], a["scale"], a["causal"], dtype, p, c
        )

    return _expand(model, FLASH_PLUGIN, expand)


def emulate_flash_core_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """TrtforgeFlashAttention v2 (separate Q, K, V) as the ops its contract says cuDNN computes, in fp32: inputs q
    [B, H, Sq, D], k and v [B, Hk, Skv, D] (head h reads kv head h // (H / Hk)), optional bias [1|B, 1|H, Sq, Skv];
    softmax(scale q kᵀ + bias) v with key j of query i hidden outside i' - left_bound < j <= i' + right_bound
    (i' = i, or i + Skv - Sq with alignment 1; a bound of -1 is none); output [B, H, Sq, D] in q's type."""
    from trtforge.fusion.plugins import FLASH_CORE_VERSION, FLASH_PLUGIN

    def expand(node, a, p, c):
        if a["plugin_version"] != FLASH_CORE_VERSION.encode():
            return [node]
        assert len(node.input) == 3 + a["has_bias"], node.name
        rep = a["num_heads"] // a["kv_heads"]
        i64 = lambda v: np.array(v, np.int64)  # noqa: E731
        nodes = [helper.make_node("Cast", [t], [p + n], to=onnx.TensorProto.FLOAT) for t, n in zip(node.input[:3], ("q", "k", "v"))]
        for t in ("k", "v"):  # [B, Hk, S, D] -> [B, Hk, rep, S, D] -> [B, H, S, D]
            nodes += [
                helper.make_node("Unsqueeze", [p + t, c(t + "ax", i64([2]))], [p + t + "5"]),
                helper.make_node("Shape", [p + t + "5"], [p + t + "s5"]),
                helper.make_node("Mul", [p + t + "s5", c(t + "rep", i64([1, 1, rep, 1, 1]))], [p + t + "s5r"]),
                helper.make_node("Expand", [p + t + "5", p + t + "s5r"], [p + t + "x"]),
                helper.make_node("Reshape", [p + t + "x", c(t + "heads", i64([0, a["num_heads"], -1, a["head_size"]]))], [p + t + "h"]),
            ]
        nodes += [
            helper.make_node("Transpose", [p + "kh"], [p + "kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [p + "q", p + "kt"], [p + "qk"]),
            helper.make_node("Mul", [p + "qk", c("scale", np.array(a["scale"], np.float32))], [p + "scores"]),
        ]
        scores = p + "scores"
        if a["has_bias"]:
            nodes += [
                helper.make_node("Cast", [node.input[3]], [p + "bias"], to=onnx.TensorProto.FLOAT),
                helper.make_node("Add", [scores, p + "bias"], [p + "biased"]),
            ]
            scores = p + "biased"
        if a["left_bound"] != -1 or a["right_bound"] != -1:
            # d[i, j] = j - i - (Skv - Sq if bottom-right else 0), from the score's shape
            nodes += [
                helper.make_node("Shape", [scores], [p + "sshape"]),
                helper.make_node("Gather", [p + "sshape", c("i2", i64(2))], [p + "sq"]),
                helper.make_node("Gather", [p + "sshape", c("i3", i64(3))], [p + "skv"]),
                helper.make_node("Range", [c("z", i64(0)), p + "sq", c("o", i64(1))], [p + "qi"]),
                helper.make_node("Range", [c("z2", i64(0)), p + "skv", c("o2", i64(1))], [p + "kj"]),
                helper.make_node("Unsqueeze", [p + "qi", c("ax1", i64([1]))], [p + "qcol"]),
                helper.make_node("Sub", [p + "kj", p + "qcol"], [p + "d0"]),
                helper.make_node("Sub", [p + "skv", p + "sq"], [p + "shift"]),
                helper.make_node("Mul", [p + "shift", c("align", i64(a["alignment"]))], [p + "ashift"]),
                helper.make_node("Sub", [p + "d0", p + "ashift"], [p + "d"]),
            ]
            kept = []
            if a["right_bound"] != -1:
                nodes.append(helper.make_node("LessOrEqual", [p + "d", c("right", i64(a["right_bound"]))], [p + "in_r"]))
                kept.append(p + "in_r")
            if a["left_bound"] != -1:
                nodes.append(helper.make_node("Greater", [p + "d", c("left", i64(-a["left_bound"]))], [p + "in_l"]))
                kept.append(p + "in_l")
            keep = kept[0]
            if len(kept) == 2:
                nodes.append(helper.make_node("And", kept, [p + "keep"]))
                keep = p + "keep"
            nodes.append(helper.make_node("Where", [keep, scores, c("ninf", np.array(-np.inf, np.float32))], [p + "masked"]))
            scores = p + "masked"
        dtype = onnx.TensorProto.FLOAT16  # the plugin's type
        return nodes + [
            helper.make_node("Softmax", [scores], [p + "probs"], axis=-1),
            helper.make_node("MatMul", [p + "probs", p + "vh"], [p + "out32"]),
            helper.make_node("Cast", [p + "out32"], [node.output[0]], to=dtype),
        ]

    return _expand(model, FLASH_PLUGIN, expand)


def gelu_tanh_nodes(t: str, p: str, c) -> tuple[list[onnx.NodeProto], str]:
    """ONNX nodes for 0.5t(1 + tanh(sqrt(2/pi)(t + 0.044715t^3))) on fp32 t (TensorRT's geluKernel.cu and cuBLASLt's
    GELU epilogue), constants made with c under the node's prefix p. Returns (nodes, output)."""
    f = lambda v: np.asarray(v, np.float32)  # noqa: E731
    return [
        helper.make_node("Mul", [t, t], [p + "t2"]),
        helper.make_node("Mul", [p + "t2", t], [p + "t3"]),
        helper.make_node("Mul", [p + "t3", c("k", f(0.044715))], [p + "kt3"]),
        helper.make_node("Add", [t, p + "kt3"], [p + "in"]),
        helper.make_node("Mul", [p + "in", c("s", f(np.sqrt(2.0 / np.pi)))], [p + "arg"]),
        helper.make_node("Tanh", [p + "arg"], [p + "th"]),
        helper.make_node("Add", [p + "th", c("one", f(1.0))], [p + "cdf2"]),
        helper.make_node("Mul", [p + "cdf2", c("half", f(0.5))], [p + "cdf"]),
        helper.make_node("Mul", [t, p + "cdf"], [p + "gelu"]),
    ], p + "gelu"


def emulate_gelu_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each CustomGeluPluginDynamic node as the ops it computes: (x + bias), then 0.5x(1 + tanh(sqrt(2/pi)(x +
    0.044715x^3))) (TensorRT's geluKernel.cu), in fp32, cast back to the plugin's type."""
    from trtforge.fusion.gelu import PLUGIN as GELU

    def expand(node, a, p, c):
        f = lambda v: np.asarray(v, np.float32)  # noqa: E731
        nodes = [helper.make_node("Cast", [node.input[0]], [p + "x32"], to=onnx.TensorProto.FLOAT)]
        t = p + "x32"
        if "bias" in a:
            # the plugin copies count x sizeof(its type) raw bytes: a bias of another type would be garbage there
            assert a["bias"].data_type == (onnx.TensorProto.FLOAT16 if a["type_id"] == 1 else onnx.TensorProto.FLOAT), node.name
            nodes.append(helper.make_node("Add", [t, c("b", f(numpy_helper.to_array(a["bias"])))], [p + "xb"]))
            t = p + "xb"
        gelu, y = gelu_tanh_nodes(t, p, c)
        return (
            nodes
            + gelu
            + [
                helper.make_node(
                    "Cast", [y], [node.output[0]], to=onnx.TensorProto.FLOAT16 if a["type_id"] == 1 else onnx.TensorProto.FLOAT
                )
            ]
        )

    return _expand(model, GELU, expand)


def emulate_gemm_gelu_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each TrtforgeGemmGelu node (trtforge/native/gemm_plugin.cpp) as what cuBLASLt's GELU_BIAS epilogue
    computes: x @ W + bias, then the tanh GELU, in fp32, written as fp16 (the plugin's type)."""
    from trtforge.fusion.gelu import GEMM_PLUGIN

    def expand(node, a, p, c):
        w = numpy_helper.to_array(a["weight"]).astype(np.float32).reshape(a["k"], a["n"])
        b = numpy_helper.to_array(a["bias"]).astype(np.float32)
        assert a["weight"].data_type == a["bias"].data_type == onnx.TensorProto.FLOAT16, node.name
        gelu, y = gelu_tanh_nodes(p + "t", p, c)
        return [
            helper.make_node("Cast", [node.input[0]], [p + "x32"], to=onnx.TensorProto.FLOAT),
            helper.make_node("MatMul", [p + "x32", c("w", w)], [p + "xw"]),
            helper.make_node("Add", [p + "xw", c("b", b)], [p + "t"]),
            *gelu,
            helper.make_node("Cast", [y], [node.output[0]], to=onnx.TensorProto.FLOAT16),
        ]

    return _expand(model, GEMM_PLUGIN, expand)


def reverse_weight_rows(node: onnx.NodeProto) -> None:
    """A GEMM plugin node's [K, N] weight field with its rows reversed, in place: what a plugin reading the weight in
    the other order would compute with, for tests that show the emulated graph then differs."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    for a in node.attribute:
        if a.name == "weight":
            w = numpy_helper.to_array(a.t).reshape(attrs["k"], attrs["n"])
            a.t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w[::-1]).reshape(-1), a.t.name))


def emulate_gemm_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each TrtforgeGemm node (trtforge/native/gemm_plugin.cpp) as what its cuBLASLt matmul computes: x @ W (+ bias,
    the BIAS epilogue) in fp32, written as fp16 (the plugin's type)."""
    from trtforge.fusion.gemm import PLUGIN as GEMM

    def expand(node, a, p, c):
        w = numpy_helper.to_array(a["weight"]).astype(np.float32).reshape(a["k"], a["n"])
        assert a["weight"].data_type == onnx.TensorProto.FLOAT16, node.name
        nodes = [
            helper.make_node("Cast", [node.input[0]], [p + "x32"], to=onnx.TensorProto.FLOAT),
            helper.make_node("MatMul", [p + "x32", c("w", w)], [p + "y32"]),
        ]
        if "bias" in a:
            assert a["bias"].data_type == onnx.TensorProto.FLOAT16, node.name
            nodes.append(helper.make_node("Add", [p + "y32", c("b", numpy_helper.to_array(a["bias"]).astype(np.float32))], [p + "yb"]))
        return nodes + [helper.make_node("Cast", [nodes[-1].output[0]], [node.output[0]], to=onnx.TensorProto.FLOAT16)]

    return _expand(model, GEMM, expand)


def emulate_skip_layernorm_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each CustomSkipLayerNormPluginDynamic node as the ops it computes: x = a + b (+ bias), then
    (x - mean) / sqrt(E[x^2] - mean^2 + eps) * gamma + beta (TensorRT's skipLayerNormKernel.cu; eps = the type's
    machine epsilon at hidden 768/1024, else none), in fp32, cast back to the plugin's type. The plugin's own fp16
    sums are modelled by fusion.skip_layernorm.plugin_layernorm, not here."""
    from trtforge.fusion.skip_layernorm import PLUGIN as SKIP_LN

    def expand(node, a, p, c):
        fp16 = a["type_id"] == 1
        dtype = onnx.TensorProto.FLOAT16 if fp16 else onnx.TensorProto.FLOAT
        f = lambda v: np.asarray(v, np.float32)  # noqa: E731
        weights = {k: numpy_helper.to_array(a[k]) for k in ("gamma", "beta", "bias") if k in a}
        # the plugin copies count x sizeof(its type) raw bytes: weights of another type would be garbage there
        assert all(a[k].data_type == dtype for k in weights), node.name
        nodes = [
            helper.make_node("Cast", [node.input[0]], [p + "a"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Cast", [node.input[1]], [p + "b"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Add", [p + "a", p + "b"], [p + "x0"]),
        ]
        x = p + "x0"
        if "bias" in weights:
            nodes.append(helper.make_node("Add", [x, c("bias", f(weights["bias"]))], [p + "xb"]))
            x = p + "xb"
        width = weights["gamma"].size
        eps = float(np.finfo(np.float16 if fp16 else np.float32).eps) if width in (768, 1024) else 0.0
        return nodes + [
            helper.make_node("ReduceMean", [x], [p + "mean"], axes=[-1], keepdims=1),
            helper.make_node("Mul", [x, x], [p + "x2"]),
            helper.make_node("ReduceMean", [p + "x2"], [p + "ex2"], axes=[-1], keepdims=1),
            helper.make_node("Mul", [p + "mean", p + "mean"], [p + "mean2"]),
            helper.make_node("Sub", [p + "ex2", p + "mean2"], [p + "var"]),
            helper.make_node("Add", [p + "var", c("eps", f(eps))], [p + "var_eps"]),
            helper.make_node("Sqrt", [p + "var_eps"], [p + "std"]),
            helper.make_node("Sub", [x, p + "mean"], [p + "centred"]),
            helper.make_node("Div", [p + "centred", p + "std"], [p + "norm"]),
            helper.make_node("Mul", [p + "norm", c("gamma", f(weights["gamma"]))], [p + "scaled"]),
            helper.make_node("Add", [p + "scaled", c("beta", f(weights["beta"]))], [p + "y32"]),
            helper.make_node("Cast", [p + "y32"], [node.output[0]], to=dtype),
        ]

    return _expand(model, SKIP_LN, expand)


# -- helpers the fusion-pass tests share ---------------------------------------------------------------------------


def load_zoo(zoo, key, seq=16):
    """(model, specs, axes, observation sizes) of one zoo export, as `trtforge build` would receive it."""
    from trtforge.graph.index import io_specs

    path = zoo[key]
    model = onnx.load(path)
    specs, axes, _ = io_specs(path, model)
    return model, specs, axes, zoo_sizes(axes, seq)


def zoo_sizes(axes, seq):
    """Observation sizes for a zoo export: batch 2, `seq` clamped to the axis, every other axis at its opt."""
    return {a: (2 if a == "batch" else min(max(r.min, seq), r.max) if a == "seq" else r.opt) for a, r in axes.items()}


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def with_random_vectors(model):
    """Every 1-D float initializer (biases, norms) redrawn: random-init transformers start biases at 0 and norms at
    1/0, which would let a fused graph that dropped a bias, gamma or beta pass."""
    rng = np.random.default_rng(3)
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 1 and init.dims[0] > 1:
            init.CopyFrom(numpy_helper.from_array(rng.normal(0, 0.5, init.dims[0]).astype(np.float32), init.name))
    return model


def fp16_plugin_chain(path):
    """A zoo export (biases and norms redrawn) as `build` fuses it for fp16 with libtrtforge_plugins, pass by pass: the
    fp16 conversion, bias+GELU with its GEMM (TrtforgeGemmGelu), skip-LayerNorm, then the GEMM pass.
    Returns (model, converted, {"gelu" | "skip_layernorm" | "gemm": (graph after it, its report)}, specs, axes)."""
    from trtforge.build.precision import prepare_for_build
    from trtforge.fusion.gelu import fuse_gelu
    from trtforge.fusion.gemm import fuse_gemm
    from trtforge.fusion.skip_layernorm import fuse_skip_layernorm
    from trtforge.graph.index import io_specs
    from trtforge.runtime.feeds import random_feeds

    model = with_random_vectors(onnx.load(path))
    specs, axes, _ = io_specs(path, model)
    converted, _ = prepare_for_build(model, path, specs, axes)
    feeds = random_feeds(specs, zoo_sizes(axes, 16))
    stages = {"gelu": fuse_gelu(converted, feeds, gemm_plugin=True)}
    stages["skip_layernorm"] = fuse_skip_layernorm(stages["gelu"][0], feeds, observe_model=converted)
    stages["gemm"] = fuse_gemm(stages["skip_layernorm"][0])
    return model, converted, stages, specs, axes


def e4m3_nodes(x: str, inv_scale: float, p: str, c) -> tuple[list[onnx.NodeProto], str]:
    """ONNX nodes (opset 11+) for x * inv_scale rounded to e4m3 as the plugin does (round to nearest even, saturating at
    +-448), as float32: step = 2^(floor(log2(max(|v|, 2^-6))) - 3) (3 mantissa bits; the subnormals' step 2^-9 below
    2^-6), v rounded to it (ONNX Round is half-to-even), clipped. Returns (nodes, output). Constants are named under p too,
    so two roundings in one emulated node keep their own."""
    f = lambda v: np.asarray(v, np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Mul", [x, c(p + "inv", f(inv_scale))], [p + "v"]),
        helper.make_node("Clip", [p + "v", c(p + "lo", f(-448.0)), c(p + "hi", f(448.0))], [p + "vc"]),
        helper.make_node("Abs", [p + "vc"], [p + "a"]),
        helper.make_node("Max", [p + "a", c(p + "tiny", f(2.0**-6))], [p + "am"]),
        helper.make_node("Log", [p + "am"], [p + "ln"]),
        helper.make_node("Div", [p + "ln", c(p + "ln2", f(np.log(2.0)))], [p + "l2"]),
        helper.make_node("Floor", [p + "l2"], [p + "e"]),
        helper.make_node("Sub", [p + "e", c(p + "three", f(3.0))], [p + "e3"]),
        helper.make_node("Pow", [c(p + "two", f(2.0)), p + "e3"], [p + "step"]),
        helper.make_node("Div", [p + "vc", p + "step"], [p + "m"]),
        helper.make_node("Round", [p + "m"], [p + "mr"]),
        helper.make_node("Mul", [p + "mr", p + "step"], [p + "r"]),
        helper.make_node("Clip", [p + "r", c(p + "lo2", f(-448.0)), c(p + "hi2", f(448.0))], [p + "q"]),
    ]
    return nodes, p + "q"


def emulate_fp8_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each TrtforgeGemmFp8 node as what the plugin computes (fp8_quantize.cu, then cuBLASLt's FP8 matmul): x * (1 /
    x_scale) rounded to e4m3 (e4m3_nodes), times the e4m3 weight (trtforge.fusion.fp8.quantize_e4m3, ml_dtypes), times
    x_scale * w_scale, + bias, [tanh GELU], written as fp16. Chained pairs: FC1 with out_scale writes the e4m3 values
    of y / out_scale (exact in fp16) where the plugin writes their bytes; FC2 with in_fp8 reads them as they are."""
    from trtforge.fusion.fp8 import PLUGIN, quantize_e4m3

    def expand(node, a, p, c):
        f = lambda v: np.asarray(v, np.float32)  # noqa: E731
        w = numpy_helper.to_array(a["weight"]).astype(np.float32).reshape(a["k"], a["n"])
        # x as e4m3 values; a chained FC2 (in_fp8) receives them so
        quantize, xq = (
            ([], p + "x32") if a.get("in_fp8") else e4m3_nodes(p + "x32", np.float32(1.0 / np.float32(a["x_scale"])), p + "q_", c)
        )
        nodes = [
            helper.make_node("Cast", [node.input[0]], [p + "x32"], to=onnx.TensorProto.FLOAT),
            *quantize,
            helper.make_node("MatMul", [xq, c("w", quantize_e4m3(w, a["w_scale"]))], [p + "acc"]),
            helper.make_node("Mul", [p + "acc", c("ab", f(np.float32(a["x_scale"]) * np.float32(a["w_scale"])))], [p + "t"]),
        ]
        t = p + "t"
        if "bias" in a:
            nodes.append(helper.make_node("Add", [t, c("b", numpy_helper.to_array(a["bias"]).astype(np.float32))], [p + "tb"]))
            t = p + "tb"
        if a["gelu"]:
            gelu, t = gelu_tanh_nodes(t, p, c)
            nodes += gelu
        if a.get("out_scale", 0.0) > 0:  # y / out_scale as e4m3 values
            rounded, t = e4m3_nodes(t, np.float32(1.0 / np.float32(a["out_scale"])), p + "o_", c)
            nodes += rounded
        return nodes + [helper.make_node("Cast", [t], [node.output[0]], to=onnx.TensorProto.FLOAT16)]

    return _expand(model, PLUGIN, expand)
