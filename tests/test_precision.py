"""fp16 conversion written in trtforge (no onnxruntime converter), its keep-list from calibration data,
and `best` Q/DQ models whose DequantizeLinear feeds its GEMM directly."""

import json
import sys

import numpy as np
import onnx
import pytest
from conftest import require, run_cli
from onnx import TensorProto, helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.build.precision import convert_fp16, prepare_for_build
from trtforge.calibrate.collect import plan_quantization
from trtforge.calibrate.quantize import insert_qdq
from trtforge.core.onnxio import load_onnx
from trtforge.graph.index import io_specs
from trtforge.runtime.feeds import random_feeds


def _topologically_sorted(model):
    known = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    for node in model.graph.node:
        if not all(t in known for t in node.input):
            return False
        known.update(node.output)
    return True


@pytest.mark.parametrize("fixture", ["minilm_clean", "tiny_fcn_clean"])
def test_fp16_conversion_without_onnxruntime_converter(fixture, request, monkeypatch):
    path = request.getfixturevalue(fixture)
    monkeypatch.setitem(sys.modules, "onnxruntime.transformers", None)  # importing it would now fail
    monkeypatch.setitem(sys.modules, "onnxruntime.transformers.float16", None)
    model = load_onnx(path)
    specs, axes, _ = io_specs(path, model)
    converted, report = prepare_for_build(model, path, specs, axes)
    onnx.checker.check_model(converted)
    assert _topologically_sorted(converted)
    assert [i.type.tensor_type.elem_type for i in converted.graph.input] == [i.type.tensor_type.elem_type for i in model.graph.input]
    assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in converted.graph.output)
    fp16_inits = sum(i.data_type == TensorProto.FLOAT16 for i in converted.graph.initializer)
    assert fp16_inits >= 4 and report["fp16_nodes"] > report["fp32_nodes"]
    feeds = random_feeds(specs, {k: v.opt for k, v in axes.items()}, 7)
    ref, got = OrtRunner(model.SerializeToString()).run(feeds), OrtRunner(converted.SerializeToString()).run(feeds)
    for name in ref:
        assert got[name].dtype == np.float32
        assert np.linalg.norm(ref[name] - got[name]) / np.linalg.norm(ref[name]) < 5e-3


def _scaled_model(tmp_path):
    """y = (x * 100) @ w: the Mul exceeds the fp16 guard (512) only on the real data (x from 6 to 8)."""
    inits = [numpy_helper.from_array(np.array(100.0, np.float32), "k"), numpy_helper.from_array(np.eye(4, dtype=np.float32) * 1e-3, "w")]
    nodes = [helper.make_node("Mul", ["x", "k"], ["big"], name="scale"), helper.make_node("MatMul", ["big", "w"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        inits,
    )
    path = tmp_path / "scaled.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        np.savez(data / f"s{i}.npz", x=np.full((1, 4), 6.0 + i, np.float32))
    return path, data


def test_keep_list_observes_calibration_data(tmp_path):
    path, data = _scaled_model(tmp_path)
    model = load_onnx(path)
    specs, axes, _ = io_specs(path, model)
    _, blind = prepare_for_build(model, path, specs, axes)
    assert "scale" not in blind["kept_fp32"] and blind["magnitudes_from"].startswith("random feeds")
    _, seen = prepare_for_build(model, path, specs, axes, data=data)
    assert "reached" in seen["kept_fp32"]["scale"] and str(data) in seen["magnitudes_from"]


def _mlp_qdq(opset):
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(8, 16)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
        helper.make_node("Relu", ["m"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return insert_qdq(model, plan_quantization(model), {"x": 3.0, "r": 8.0})


@pytest.mark.parametrize("opset", [17, 19])
def test_best_dq_feeds_its_gemm_directly(opset, tmp_path):
    """No Cast between a DequantizeLinear and its MatMul: fp16 DQ outputs from opset 19 (fp16 scales), the
    Q/DQ + GEMM left fp32 before it (DQ outputs fp32 by definition; TensorRT 8.6 parses opset <= 17)."""
    qdq = _mlp_qdq(opset)
    feeds = [{"x": np.random.default_rng(s).normal(size=(3, 8)).astype(np.float32)} for s in range(2)]
    converted, report = convert_fp16(qdq, feeds)
    onnx.checker.check_model(converted, full_check=True)
    producers = {o: n for n in converted.graph.node for o in n.output}
    gemms = [n for n in converted.graph.node if n.op_type == "MatMul"]
    assert len(gemms) == 2
    for gemm in gemms:
        assert [producers[t].op_type for t in gemm.input] == ["DequantizeLinear", "DequantizeLinear"]
    scales = [i for i in converted.graph.initializer if "scale" in i.name]
    expected = TensorProto.FLOAT16 if opset >= 19 else TensorProto.FLOAT
    assert scales and all(s.data_type == expected for s in scales)
    if opset < 19:
        assert "reads an fp32 DequantizeLinear" in report.kept_fp32["mm1"]
    ref = OrtRunner(qdq.SerializeToString()).run(feeds[0])["y"]
    got = OrtRunner(converted.SerializeToString()).run(feeds[0])["y"]
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 1e-2
    require("tensorrt_rtx")
    path = tmp_path / f"mlp{opset}.int8.onnx"
    onnx.save(qdq, path)
    proc = run_cli("build", str(path), "--precision", "best", "--tiers", "n=4", "-o", str(tmp_path / "e.engine"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["precision"] == "best"


def _residual_block_qdq():
    """x -> Conv -> Relu -> Conv -> Add(x) -> Relu -> Conv -> y: a ResNet basic block and a head, through
    calibrate's placement (its residual rule gives the Add's skip input a Q/DQ) and Q/DQ insertion."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.normal(size=(16, 16, 3, 3)) * 0.1).astype(np.float32), f"w{i}") for i in range(3)]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "x"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16, 6, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = plan_quantization(model)
    return insert_qdq(model, plan, {t: 4.0 for t in plan.activation_tensors()})


def test_best_keeps_no_cast_inside_an_int8_convolutions_epilogue():
    """TensorRT fuses Conv -> ReLU -> Q and Conv -> Add(DQ residual) -> ReLU -> Q into one int8 kernel only
    when no Cast splits the chain (on the H200 the Casts left ResNet-50's INT8 engine at 2x fp16's time)."""
    qdq = _residual_block_qdq()
    feeds = [{"x": np.random.default_rng(s).normal(size=(2, 16, 6, 6)).astype(np.float32)} for s in range(2)]
    converted, report = convert_fp16(qdq, feeds)
    producers = {o: n for n in converted.graph.node for o in n.output}
    consumers = {}
    for n in converted.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for name in ("relu0", "add", "relu1"):
        assert "epilogue of an fp32 INT8 convolution" in report.kept_fp32[name], report.kept_fp32
    for node in converted.graph.node:
        if node.op_type in ("Relu", "Add"):
            assert all(producers[i].op_type in ("Conv", "Relu", "Add", "DequantizeLinear") for i in node.input), node
            if node.name != "relu1":  # relu1 feeds the float head conv2 (output-layer rule): its Cast is right
                assert all(c.op_type != "Cast" for c in consumers.get(node.output[0], [])), node
    ref = OrtRunner(qdq.SerializeToString()).run(feeds[0])["y"]
    got = OrtRunner(converted.SerializeToString()).run(feeds[0])["y"]
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 1e-3


def test_an_epilogue_node_kept_fp32_for_another_reason_does_not_break_the_chain():
    """The residual Add kept fp32 because its output is large: the ReLU after it still joins conv1's epilogue."""
    from trtforge.build.precision import nodes_to_keep_fp32

    keep = nodes_to_keep_fp32(_residual_block_qdq(), {"s": 1000.0})
    assert keep["add"].startswith("output 's' reached") and "epilogue" in keep["relu1"]


def _bucket_model():
    """MPNet's/T5's relative-position bucket: distance (int) -> float -> log, scale -> int bucket -> Gather of a bias
    table, added to a float signal. Distances near a bucket edge round across it in fp16."""
    table = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(32, 1) * 0.5, "table")
    scale = numpy_helper.from_array(np.array(31.0 / np.log(1025.0), np.float32), "scale")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [
        helper.make_node("Cast", ["dist"], ["dist_f"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("Add", ["dist_f", "one"], ["d1"], name="plus_one"),
        helper.make_node("Log", ["d1"], ["logd"], name="log"),
        helper.make_node("Mul", ["logd", "scale"], ["scaled"], name="scale_mul"),
        helper.make_node("Cast", ["scaled"], ["bucket"], name="to_int", to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "bucket"], ["bias"], name="bias_gather"),
        helper.make_node("Squeeze", ["bias"], ["bias_flat"], name="squeeze"),
        helper.make_node("Add", ["x", "bias_flat"], ["y"], name="add_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "bucket",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]), helper.make_tensor_value_info("dist", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        [table, scale, one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_integer_arithmetic_stays_fp32():
    """MPNet-small's fp16 build missed its gate (rel-L2 0.03): `compare --layerwise` named the relative-position bias
    Gather, whose bucket indices fp16 had moved. The float nodes that only compute an integer stay fp32."""
    from trtforge.build.precision import integer_math_nodes

    model = _bucket_model()
    assert integer_math_nodes(model) == {"to_float", "plus_one", "log", "scale_mul", "to_int"}
    dist = np.arange(500, dtype=np.int64)  # below the overflow guard's 512, so only this rule keeps them
    feeds = [{"x": np.zeros(500, np.float32), "dist": dist}]
    converted, report = convert_fp16(model, feeds)
    assert "integer" in report.kept_fp32["scale_mul"] and "integer" in report.kept_fp32["plus_one"]
    reference = OrtRunner(model.SerializeToString()).run(feeds[0])["y"]
    got = OrtRunner(converted.SerializeToString()).run(feeds[0])["y"]
    assert np.array_equal(reference, got)  # every bucket the same


def test_integer_arithmetic_in_fp16_moves_buckets(monkeypatch):
    """Without the rule the same model's buckets move: the check above can fail."""
    import trtforge.build.precision as precision

    monkeypatch.setattr(precision, "integer_math_nodes", lambda model: set())
    feeds = [{"x": np.zeros(500, np.float32), "dist": np.arange(500, dtype=np.int64)}]
    converted, _ = convert_fp16(_bucket_model(), feeds)
    reference = OrtRunner(_bucket_model().SerializeToString()).run(feeds[0])["y"]
    got = OrtRunner(converted.SerializeToString()).run(feeds[0])["y"]
    assert not np.array_equal(reference, got)


@pytest.mark.parametrize(
    "values",
    [[1.0, -3.0, 2.0], [np.inf, -2.0, 1.0], [np.nan, 5.0], [np.nan], [], [-np.inf, np.inf, -7.0], [-65504.0, 3.0]],
)
def test_finite_peak_is_the_largest_finite_magnitude(values):
    """The fp16 guard's peak: max |x| over the finite values only, 0 where there is none (an inf or NaN elsewhere in
    the tensor must neither hide the finite peak nor become it)."""
    from trtforge.build.precision import finite_peak

    for dtype in (np.float32, np.float16):
        value = np.asarray(values, dtype)
        finite = np.abs(value[np.isfinite(value)]).astype(np.float64)
        assert finite_peak(value) == (float(finite.max()) if finite.size else 0.0)
