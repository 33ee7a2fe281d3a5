"""Pure parts of INT8: the cache format, Q/DQ placement and axes, SmoothQuant's equivalence."""

import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate.cache import format_cache, read_cache, write_cache
from trtforge.calibrate.collect import plan_quantization
from trtforge.calibrate.smooth import apply_smoothing, smoothing_groups, smoothing_scales
from trtforge.calibrate.step import CalibrateOptions, cache_decision, expected_fingerprint
from trtforge.errors import UserError
from trtforge.quantize import insert_qdq, per_channel_scales, weight_axis


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


@pytest.mark.parametrize("content,fragment", [
    ("", "header"), ("garbage\n", "header"), ("TRT-8600-EntropyCalibration2\nx: zzzzzzzz\n", "not hex"),
    ("TRT-8600-EntropyCalibration2\nx 3f800000\n", "line 2"), ("TRT-8600-MinMaxCalibration\nx: 3f80\n", "line 2"),
])
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
        inits += [numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "g"), numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "b")]
        nodes.append(helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", axis=-1))
        x = "ln"
    nodes += [helper.make_node("MatMul", [x, "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
              helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_qdq_placement_and_axes():
    model = _mlp()
    plan = plan_quantization(model)
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
    convt = helper.make_node("ConvTranspose", ["x", "w"], ["y"])
    gemm_t = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"])
    assert [weight_axis(n) for n in (conv, convt, gemm_t, gemm)] == [0, 1, 0, 1]
    w = np.array([[1.0, -4.0], [-2.0, 3.0]], dtype=np.float32)
    assert per_channel_scales(w, 1) == pytest.approx([2 / 127, 4 / 127])
    assert per_channel_scales(w, 0) == pytest.approx([4 / 127, 3 / 127])


def test_residual_add_rule_for_conv():
    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    plan = plan_quantization(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert plan.residual_adds == {"add": "x"}


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
    write_cache(cache, {"a": 1.0}, "entropy")
    reuse, why = cache_decision(cache, fp, False)
    assert reuse is None and "no sidecar" in why
    import json
    (tmp_path / "m.calib.cache.json").write_text(json.dumps(fp))
    reuse, why = cache_decision(cache, fp, False)
    assert reuse is not None and why.startswith("reused")
    other = expected_fingerprint("g2", "d1", CalibrateOptions(data=tmp_path, method="minmax"))
    reuse, why = cache_decision(cache, other, False)
    assert reuse is None and "another model graph" in why and "another method" in why and "recalibrating" in why
    with pytest.raises(UserError, match="another model graph.*--strict-cache"):
        cache_decision(cache, other, True)
