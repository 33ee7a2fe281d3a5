"""Pure parts of INT8: the cache format, Q/DQ placement and axes, SmoothQuant's equivalence."""

import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate.cache import format_cache, read_cache, write_cache
from trtforge.calibrate.collect import plan_quantization
from trtforge.calibrate.options import CalibrateOptions
from trtforge.calibrate.quantize import insert_qdq, int8_gemm_nodes, per_channel_scales, weight_axis
from trtforge.calibrate.reuse import cache_decision, expected_fingerprint
from trtforge.calibrate.smooth import apply_smoothing, smoothing_groups, smoothing_scales
from trtforge.core.errors import UserError


def independent_cache_reader(text: str) -> tuple[str, str, dict[str, float]]:
    """Written from the format description alone: 'TRT-<ver>-<algo>' then 'name: <hex float32 bits>'."""
    lines = text.strip().split("\n")
    _, version, algorithm = lines[0].split("-", 2)
    scales = {}
    for line in lines[1:]:
        name, hexbits = line.rsplit(": ", 1)
        scales[name] = struct.unpack("!f", int(hexbits, 16).to_bytes(4, "big"))[0]
    return version, algorithm, scales


def test_cache_text_parsed_by_independent_reader(tmp_path):
    amax = {"input_ids": 127.0, "/bert/encoder/layer.0/MatMul_output_0": 6.35, "x:0": 0.001}
    path = tmp_path / "m.calib.cache"
    write_cache(path, amax, "entropy", "8600")
    version, algorithm, scales = independent_cache_reader(path.read_text())
    assert version == "8600" and algorithm == "EntropyCalibration2"
    for name, value in amax.items():
        assert scales[name] == pytest.approx(np.float32(value / 127.0), rel=1e-7)
    assert path.read_text().splitlines()[1] == "input_ids: 3f800000"  # scale 1.0
    header, back = read_cache(path)
    assert header == "TRT-8600-EntropyCalibration2" and back["x:0"] == pytest.approx(0.001, rel=1e-6)


@pytest.mark.parametrize(
    "content,fragment",
    [
        ("", "header"),
        ("garbage\n", "header"),
        ("TRT-8600-EntropyCalibration2\nx: zzzzzzzz\n", "not hex"),
        ("TRT-8600-EntropyCalibration2\nx 3f800000\n", "line 2"),
        ("TRT-8600-MinMaxCalibration\nx: 3f80\n", "line 2"),
    ],
)
def test_corrupt_cache_is_a_user_error(tmp_path, content, fragment):
    path = tmp_path / "bad.cache"
    path.write_text(content)
    with pytest.raises(UserError, match=fragment):
        read_cache(path)


def test_algorithm_headers():
    assert format_cache({"a": 1.0}, "minmax").startswith("TRT-8600-MinMaxCalibration")
    assert format_cache({"a": 1.0}, "percentile").startswith("TRT-8600-LegacyCalibration")


def _mlp(with_ln=False):
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(8, 16)).astype(np.float32)
    w2 = rng.normal(size=(16, 4)).astype(np.float32)
    nodes = []
    x = "x"
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    if with_ln:
        inits += [
            numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "g"),
            numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "b"),
        ]
        nodes.append(helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", axis=-1))
        x = "ln"
    nodes += [
        helper.make_node("MatMul", [x, "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_qdq_placement_and_axes():
    model = _mlp()
    plan = plan_quantization(model, rules=())
    assert [(t.node, t.activations, t.weight) for t in plan.targets] == [("mm1", ["x"], "w1"), ("mm2", ["r"], "w2")]
    qdq = insert_qdq(model, plan, {"x": 3.0, "r": 5.0})
    onnx.checker.check_model(qdq)
    ops = [n.op_type for n in qdq.graph.node]
    assert ops.count("QuantizeLinear") == 4 and ops.count("DequantizeLinear") == 4
    weight_q = [n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "w1"][0]
    assert [a.i for a in weight_q.attribute if a.name == "axis"] == [1]
    zero_points = [numpy_helper.to_array(i) for i in qdq.graph.initializer if i.name.endswith("zero_point")]
    assert all(z.dtype == np.int8 and not z.any() for z in zero_points)
    scale = [numpy_helper.to_array(i) for i in qdq.graph.initializer if i.name == "x_scale"][0]
    assert scale == pytest.approx(3.0 / 127)
    # A float fallback node gets no Q/DQ at all.
    partial = insert_qdq(model, plan, {"x": 3.0, "r": 5.0}, {"mm2"})
    assert [n.op_type for n in partial.graph.node].count("QuantizeLinear") == 2
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    ref, got = OrtRunner(model.SerializeToString()).run({"x": x})["y"], OrtRunner(qdq.SerializeToString()).run({"x": x})["y"]
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 0.05
    with pytest.raises(UserError, match="no scale for tensor 'r'"):
        insert_qdq(model, plan, {"x": 3.0})


def test_weight_axes_and_scales():
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    gemm_t = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"])
    assert weight_axis("Conv", 4, 1, conv) == 0 and weight_axis("ConvTranspose", 4, 1) == 1
    assert weight_axis("Gemm", 2, 1, gemm_t) == 0 and weight_axis("Gemm", 2, 1, gemm) == 1
    # MatMul: the output-channel axis is the last one at any rank (B = [..., K, N]), -2 for a weight as A.
    assert [weight_axis("MatMul", r, 1) for r in (2, 3, 4)] == [1, 2, 3]
    assert weight_axis("MatMul", 3, 0) == 1
    w = np.array([[1.0, -4.0], [-2.0, 3.0]], dtype=np.float32)
    assert per_channel_scales(w, 1) == pytest.approx([2 / 127, 4 / 127])
    assert per_channel_scales(w, 0) == pytest.approx([4 / 127, 3 / 127])


def _matmul_model(weight_shape, how="init", x_shape=None):
    """x @ W with W an initializer, a Constant node, or an fp16 initializer behind a Cast."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=weight_shape).astype(np.float32) * np.linspace(0.1, 4, weight_shape[-1]).astype(np.float32)
    nodes, inits = [], []
    if how == "init":
        inits.append(numpy_helper.from_array(w, "w"))
    elif how == "constant":
        nodes.append(helper.make_node("Constant", [], ["w"], name="wconst", value=numpy_helper.from_array(w, "wv")))
    else:
        inits.append(numpy_helper.from_array(w.astype(np.float16), "w16"))
        nodes.append(helper.make_node("Cast", ["w16"], ["w"], name="wcast", to=TensorProto.FLOAT))
    nodes.append(helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"))
    nodes.append(helper.make_node("Relu", ["h"], ["y"], name="relu"))
    x_shape = x_shape or ["n"] + list(weight_shape[:-2]) + ["s", weight_shape[-2]]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape[:-1] + [weight_shape[-1]])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@pytest.mark.parametrize("shape", [(8, 6), (3, 8, 6)])
def test_matmul_weight_scales_per_output_channel_at_any_rank(shape):
    """A rank-3 weight [G, K, N] gets N scales on axis 2, not K scales on axis 1."""
    model, w = _matmul_model(shape)
    plan = plan_quantization(model)
    qdq = insert_qdq(model, plan, {"x": 3.0})
    onnx.checker.check_model(qdq)
    wq = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "w")
    axis = next(a.i for a in wq.attribute if a.name == "axis")
    scales = numpy_helper.to_array(next(i for i in qdq.graph.initializer if i.name == wq.input[1]))
    assert axis == len(shape) - 1 and scales.shape == (shape[-1],)
    assert scales == pytest.approx(np.abs(w).max(axis=tuple(range(len(shape) - 1))) / 127)
    x = np.random.default_rng(1).normal(size=(2,) + shape[:-2] + (5, shape[-2])).astype(np.float32)
    import onnxruntime as ort

    # ORT's optimizer fuses DQ + MatMul into MatMulIntegerToFloat, which rejects a per-axis B of rank 3
    # (valid ONNX); the reference semantics are the unfused graph.
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = OrtRunner(model.SerializeToString()).run({"x": x})["y"]
    got = ort.InferenceSession(qdq.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 0.03


@pytest.mark.parametrize("how", ["cast", "constant"])
def test_cast_and_constant_weights_are_quantized_per_channel(how):
    """fp16 checkpoints (fp16 initializer -> Cast -> MatMul) and Constant weights: per-channel weight Q/DQ,
    never per-tensor activation Q/DQ, never a one-sided Q/DQ counted as INT8."""
    model, w = _matmul_model((8, 6), how)
    plan = plan_quantization(model)
    assert [(t.activations, t.weight, t.axis) for t in plan.targets] == [(["x"], "w", 1)]
    qdq = insert_qdq(model, plan, {"x": 3.0})
    onnx.checker.check_model(qdq)
    assert int8_gemm_nodes(qdq) == {"mm"}
    wq = [n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and any(a.name == "axis" for a in n.attribute)]
    assert len(wq) == 1 and numpy_helper.to_array(next(i for i in qdq.graph.initializer if i.name == wq[0].input[1])).shape == (6,)
    assert not any(n.op_type in ("Cast", "Constant") for n in qdq.graph.node)  # the replaced weight is gone
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype(np.float32)
    ref, got = OrtRunner(model.SerializeToString()).run({"x": x})["y"], OrtRunner(qdq.SerializeToString()).run({"x": x})["y"]
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 0.03


def test_int8_flops_count_only_gemms_with_both_inputs_quantized():
    model, _ = _matmul_model((8, 6))
    plan = plan_quantization(model)
    assert int8_gemm_nodes(insert_qdq(model, plan, {"x": 3.0}, {"mm"})) == set()
    one_sided = insert_qdq(model, plan, {"x": 3.0})
    mm = next(n for n in one_sided.graph.node if n.name == "mm")
    mm.input[1] = "w"  # weight Q/DQ bypassed: only the activation is quantized
    assert int8_gemm_nodes(one_sided) == set()


def _conv_residual():
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 16, 1, 1)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["x1"], name="pre"),
        helper.make_node("Conv", ["x1", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x1"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="post"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_residual_add_rule_follows_the_conv():
    """The residual input's Q/DQ exists to fuse the Add into an int8 Conv: none once the Conv is float."""
    model = _conv_residual()
    plan = plan_quantization(model)
    assert plan.residual_adds == {"add": "x1"} and plan.residual_convs == {"add": "conv"}
    quantized = insert_qdq(model, plan, {"x1": 3.0})
    add = next(n for n in quantized.graph.node if n.name == "add")
    assert add.input[1].endswith("_dq")
    fallback = insert_qdq(model, plan, {"x1": 3.0}, {"conv"})
    assert not any(n.op_type == "QuantizeLinear" for n in fallback.graph.node)
    add = next(n for n in fallback.graph.node if n.name == "add")
    assert list(add.input) == ["r", "x1"]


def _downsample_block():
    """ResNet's downsampling block: conv3's output plus the downsample conv's (`out += identity`), then ReLU."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(16, 16, 1, 1)).astype(np.float32), n) for n in ("w3", "wd")]
    nodes = [
        helper.make_node("Relu", ["x"], ["x1"], name="pre"),
        helper.make_node("Conv", ["x1", "w3"], ["c3"], name="conv3"),
        helper.make_node("Conv", ["x1", "wd"], ["d"], name="down"),
        helper.make_node("Add", ["c3", "d"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="post"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_residual_add_of_two_convolutions_quantizes_the_skip_branch():
    """Both Add inputs are convolutions: the skip branch (input 1) gets the Q/DQ so TensorRT can fuse the Add into
    conv3 with int8 in and out, as its implicit INT8 does; the rule still follows conv3's fallback."""
    model = _downsample_block()
    plan = plan_quantization(model)
    assert plan.residual_adds == {"add": "d"} and plan.residual_convs == {"add": "conv3"}
    assert {"x1", "d"} <= set(plan.activation_tensors())
    quantized = insert_qdq(model, plan, {"x1": 3.0, "d": 5.0})
    add = next(n for n in quantized.graph.node if n.name == "add")
    assert add.input[0] == "c3" and add.input[1].endswith("_dq")
    fallback = insert_qdq(model, plan, {"x1": 3.0, "d": 5.0}, {"conv3"})
    add = next(n for n in fallback.graph.node if n.name == "add")
    assert list(add.input) == ["c3", "d"]
    # The downsample conv kept float must not have its output rounded to int8 for the Add either.
    assert plan.residual_skip_convs == {"add": "down"}
    skip_float = insert_qdq(model, plan, {"x1": 3.0, "d": 5.0}, {"down"})
    add = next(n for n in skip_float.graph.node if n.name == "add")
    assert list(add.input) == ["c3", "d"]


def test_two_conv_residual_quantizes_the_branch_read_elsewhere():
    """MobileNetV2-like: x (a projection conv's output, also read by the next expand conv) + p (this block's
    projection). x is quantized for the expand conv already, so it takes the Add's Q/DQ (no new rounding) and
    TensorRT can fuse the Add into p's conv; input 1 would round p and fuse nothing."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(16, 16, 1, 1)).astype(np.float32), n) for n in ("wp0", "we", "wp")]
    nodes = [
        helper.make_node("Conv", ["x0", "wp0"], ["x"], name="proj_prev"),
        helper.make_node("Conv", ["x", "we"], ["e"], name="expand"),
        helper.make_node("Relu", ["e"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "wp"], ["p"], name="proj"),
        helper.make_node("Add", ["p", "x"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = plan_quantization(model)
    assert plan.residual_adds == {"add": "x"} and plan.residual_convs == {"add": "proj"}
    assert plan.residual_skip_convs == {"add": "proj_prev"}
    flipped = plan_quantization(
        helper.make_model(
            helper.make_graph(
                nodes[:4] + [helper.make_node("Add", ["x", "p"], ["y"], name="add")], "g", list(graph.input), list(graph.output), inits
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
    )
    assert flipped.residual_adds == {"add": "x"}  # whatever the operand order


def _bmm_model():
    """Attention-like: q = x Wq, k = x Wk, s = q k^T (two activations), y = s x; plus a Conv-free tail."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), n) for n in ("wq", "wk", "wo")]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("Transpose", ["k"], ["kt"], name="t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
        helper.make_node("Softmax", ["s"], ["p"], name="sm", axis=-1),
        helper.make_node("MatMul", ["p", "x"], ["ctx"], name="pv"),
        helper.make_node("MatMul", ["ctx", "wo"], ["o"], name="out"),
        helper.make_node("Relu", ["o"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_modelopt_rules_keep_attention_bmms_and_gemvs_float():
    model = _bmm_model()
    plan = plan_quantization(model)
    assert plan.excluded == {"qk": "attention_bmm", "pv": "attention_bmm"}
    assert [t.node for t in plan.targets] == ["q", "k", "out"]
    opted = plan_quantization(model, quantize_attention=True)
    assert {t.node for t in opted.targets} == {"q", "k", "qk", "pv", "out"} and not opted.excluded
    # At a single query position (s = 1) every product is a matrix-vector product: ModelOpt's GEMV rule.
    shapes = {"q": (1, 1, 8), "k": (1, 1, 8), "s": (1, 1, 1), "ctx": (1, 1, 8), "o": (1, 8)}
    plan = plan_quantization(model, shapes)
    assert plan.excluded["out"] == "gemv" and plan.excluded["qk"] == "attention_bmm" and "q" not in plan.excluded


def _conv(c_in, c_out, name, src, kernel=3, group=1):
    w = numpy_helper.from_array(np.ones((c_out, c_in // group, kernel, kernel), np.float32), f"{name}_w")
    return helper.make_node("Conv", [src, w.name], [f"{name}_y"], name=name, group=group, pads=[kernel // 2] * 4), w


def test_modelopt_conv_channel_and_output_layer_rules():
    """12 -> 6 (channels < 16, neither a multiple of 8) stays float; the 3 -> 64 stem reading the image is
    quantized as ModelOpt does; a GEMM writing the graph output (through its bias Add) stays float."""
    nodes, inits = [], []
    for args in [(3, 64, "stem", "x"), (64, 12, "body", "stem_y"), (12, 6, "thin", "body_y"), (6, 64, "wide", "thin_y")]:
        node, w = _conv(*args)
        nodes.append(node)
        inits.append(w)
    flat = helper.make_node("Flatten", ["wide_y"], ["f"], name="flat")
    inits += [numpy_helper.from_array(np.ones((64 * 4, 10), np.float32), "fc_w"), numpy_helper.from_array(np.ones(10, np.float32), "fc_b")]
    nodes += [
        flat,
        helper.make_node("MatMul", ["f", "fc_w"], ["fc"], name="fc"),
        helper.make_node("Add", ["fc", "fc_b"], ["logits"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        inits,
    )
    plan = plan_quantization(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert plan.excluded == {"thin": "conv_channels", "fc": "output_layer"}
    assert [t.node for t in plan.targets] == ["stem", "body", "wide"]


@pytest.mark.parametrize("with_ln", [False, True])
def test_smoothing_preserves_outputs(with_ln):
    model = _mlp(with_ln)
    groups = smoothing_groups(model)
    first = "ln" if with_ln else "x"
    assert groups == {first: ["mm1"], "r": ["mm2"]}
    weights = {t: [numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == w))] for t, w in ((first, "w1"), ("r", "w2"))}
    amax = {first: np.linspace(0.1, 30, 8), "r": np.linspace(0.5, 3, 16)}
    scales = {t: smoothing_scales(amax[t], weights[t], 0.8) for t in groups}
    smoothed = apply_smoothing(model, scales)
    ops = [n.op_type for n in smoothed.graph.node]
    # With a LayerNorm read only by the MatMul, 1/s is folded into it; otherwise a Mul is inserted.
    assert ops.count("Mul") == (1 if with_ln else 2)
    x = np.random.default_rng(2).normal(size=(6, 8)).astype(np.float32) * 5
    ref, got = OrtRunner(model.SerializeToString()).run({"x": x})["y"], OrtRunner(smoothed.SerializeToString()).run({"x": x})["y"]
    assert np.abs(ref - got).max() / np.abs(ref).max() < 1e-5


def test_smoothing_scale_formula():
    s = smoothing_scales(np.array([4.0, 1.0]), [np.array([[1.0, 1.0], [4.0, 0.0]])], 0.5)
    assert s == pytest.approx([np.sqrt(4) / np.sqrt(1), np.sqrt(1) / np.sqrt(4)])


def test_cache_decision(tmp_path):
    cache = tmp_path / "m.calib.cache"
    opts = CalibrateOptions(data=tmp_path)
    fp = expected_fingerprint("g1", "d1", opts)
    assert cache_decision(cache, fp, False) == (None, "no cache yet")
    sha = write_cache(cache, {"a": 1.0}, "entropy")
    reuse, why = cache_decision(cache, fp, False)
    assert reuse is None and "no sidecar" in why
    import json

    (tmp_path / "m.calib.cache.json").write_text(json.dumps(fp))  # a sidecar that names no cache hash: not verified
    reuse, why = cache_decision(cache, fp, False)
    assert reuse is None and "records no content hash" in why
    (tmp_path / "m.calib.cache.json").write_text(json.dumps({**fp, "cache_sha256": sha}))
    reuse, why = cache_decision(cache, fp, False)
    assert reuse is not None and why.startswith("reused")
    other = expected_fingerprint("g2", "d1", CalibrateOptions(data=tmp_path, method="minmax"))
    reuse, why = cache_decision(cache, other, False)
    assert reuse is None and "another model graph" in why and "another method" in why and "recalibrating" in why
    with pytest.raises(UserError, match="another model graph.*--strict-cache"):
        cache_decision(cache, other, True)
    # A cache made under an older Q/DQ placement (no "placement" in its parameters) is recalibrated, not reused.
    old_placement = json.loads(json.dumps(fp))
    del old_placement["params"]["placement"]
    (tmp_path / "m.calib.cache.json").write_text(json.dumps(old_placement))
    reuse, why = cache_decision(cache, fp, False)
    assert reuse is None and "other parameters" in why and fp["params"]["placement"] >= 2


def _tied_model():
    """ALBERT-like: two LayerNorm -> MatMul blocks sharing one weight and one LayerNorm's gamma/beta."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "g"),
        numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln1"], name="ln1", axis=-1),
        helper.make_node("MatMul", ["ln1", "w"], ["h1"], name="mm1"),
        helper.make_node("LayerNormalization", ["h1", "g", "b"], ["ln2"], name="ln2", axis=-1),
        helper.make_node("MatMul", ["ln2", "w"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_smoothing_never_rescales_a_shared_tensor_twice():
    model = _tied_model()
    groups = smoothing_groups(model)
    assert groups == {"ln1": ["mm1"], "ln2": ["mm2"]}
    w = numpy_helper.to_array(model.graph.initializer[0])
    scales = {"ln1": smoothing_scales(np.linspace(0.1, 30, 8), [w], 0.8), "ln2": smoothing_scales(np.linspace(20, 0.5, 8), [w], 0.8)}
    smoothed = apply_smoothing(model, scales)
    x = np.random.default_rng(2).normal(size=(6, 8)).astype(np.float32) * 5
    ref, got = OrtRunner(model.SerializeToString()).run({"x": x})["y"], OrtRunner(smoothed.SerializeToString()).run({"x": x})["y"]
    assert np.abs(ref - got).max() / np.abs(ref).max() < 1e-5
    # The input model is untouched and each consumer got its own copy.
    assert np.array_equal(numpy_helper.to_array(model.graph.initializer[0]), w)
    weights = [n.input[1] for n in smoothed.graph.node if n.op_type == "MatMul"]
    assert len(set(weights)) == 2
