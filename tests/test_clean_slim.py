"""`trtforge clean` with onnxslim: as few nodes as onnxslim on the zoo's exports, with parity proven; the parser
rewrites only for a target that needs them; onnxslim's failure falls back to onnx-graphsurgeon folding."""

import json
import os

import numpy as np
import onnx
import pytest
from conftest import ROOT, require, run_cli
from onnx import TensorProto, helper, numpy_helper

import trtforge.graph.slim as slim
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.errors import UserError
from trtforge.graph.index import clean_file, clean_model


def _shape_slice_model(path):
    """y = relu(x reshaped to [x.shape[0] * x.shape[1], x.shape[2]]), the shape read with Shape(start, end)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["ab"], name="shape_ab", start=0, end=2),
        helper.make_node("Shape", ["x"], ["c"], name="shape_c", start=-1),
        helper.make_node("ReduceProd", ["ab"], ["n"], keepdims=1),
        helper.make_node("Concat", ["n", "c"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return model


def _attributed_shapes(model):
    return [n.name for n in model.graph.node if n.op_type == "Shape" and n.attribute]


# -- the zoo: node counts against onnxslim, parity proven -----------------------------------------------------------

# The legacy exporter (the zoo configs' default) for all five; GPT-2's dynamo graph too, which holds Shape(start, end):
# the trt8 target's rewrite adds a Slice per such node and stays within the bar.
ZOO = [(name, "legacy") for name in ("swin", "bert", "gpt2", "vit", "t5-encoder")] + [("gpt2", "dynamo")]


@pytest.fixture(scope="module")
def zoo_exports(tmp_path_factory):
    return tmp_path_factory.mktemp("slim_zoo")


@pytest.mark.parametrize("name,exporter", ZOO, ids=[f"{n}-{e}" for n, e in ZOO])
def test_clean_leaves_at_most_onnxslims_node_count_on_the_zoo(name, exporter, zoo_exports):
    """The issue's bar: <= 1.15x onnxslim's nodes (before onnxslim, clean left Swin 1448 -> 824 against onnxslim's
    270). The parity proof ran (clean_file raises GateFailed otherwise) and its rel-L2 is recorded per output."""
    onnxslim = require("onnxslim")
    from trtforge.core.config import apply_overrides, load_config
    from trtforge.export.step import export_model

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        cfg = apply_overrides(load_config(ROOT / "zoo" / "configs" / f"{name}.yaml"), {"export.exporter": exporter})
        raw = zoo_exports / f"{name}.{exporter}.onnx"
        export_model(cfg, raw, check=False)
    finally:
        os.chdir(before)
    result = clean_file(raw, zoo_exports / f"{name}.{exporter}.clean.onnx", tolerance=cfg.clean.tolerance, parser="trt8")
    reference = len(onnxslim.slim(onnx.load(str(raw))).graph.node)
    assert result.after.nodes <= 1.15 * reference, (result.after.nodes, reference)
    assert "note" not in result.sidecar["slim"], result.sidecar["slim"]
    assert bool(result.sidecar["rewritten"]["shape_start_end"]) == (exporter == "dynamo")
    assert set(result.rel_l2) == {o.name for o in cfg.outputs}
    assert max(result.rel_l2.values()) <= cfg.clean.tolerance
    assert result.sidecar["slim"]["nodes_after"] < result.sidecar["slim"]["nodes_before"]


# -- parser targets --------------------------------------------------------------------------------------------------


def test_shape_rewrite_only_for_the_trt8_parser(tmp_path):
    model = _shape_slice_model(tmp_path / "s.onnx")
    for parser in ("rtx", "none"):
        cleaned, counts = clean_model(model, parser=parser)
        assert counts["parser"] == parser and counts["rewritten"] == {"shape_start_end": []}
        assert _attributed_shapes(cleaned) == ["shape_ab", "shape_c"]
    cleaned, counts = clean_model(model, parser="trt8")
    assert counts["rewritten"] == {"shape_start_end": ["shape_ab", "shape_c"]} and not _attributed_shapes(cleaned)
    assert "split_shape_slices" in counts["passes"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    assert np.array_equal(
        OrtRunner(model.SerializeToString()).run({"x": x})["y"], OrtRunner(cleaned.SerializeToString()).run({"x": x})["y"]
    )


def test_tensorrt_rtx_parses_the_unrewritten_shape_start_end(tmp_path):
    """What `rtx` rests on: TensorRT-RTX's parser takes Shape(start, end) as the exporters write it."""
    trt = require("tensorrt_rtx")
    cleaned, _ = clean_model(_shape_slice_model(tmp_path / "s.onnx"), parser="rtx")
    assert _attributed_shapes(cleaned)
    logger = trt.Logger(trt.Logger.ERROR)
    network = trt.Builder(logger).create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(cleaned.SerializeToString()), [str(parser.get_error(i)) for i in range(parser.num_errors)]


@pytest.mark.parametrize(
    "installed,expected",
    [("tensorrt_rtx", "rtx"), ("tensorrt", "trt8"), (None, "trt8")],
)
def test_auto_parser_follows_the_tensorrt_the_build_would_load(installed, expected, monkeypatch):
    import trtforge.backends.tensorrt as backend

    def load_trt(name="auto"):
        if installed is None:
            raise UserError("tensorrt or tensorrt_rtx is not installed.")
        return backend.TrtModule(None, installed, "8.6.1" if installed == "tensorrt" else "1.7.1")

    monkeypatch.setattr(backend, "load_trt", load_trt)
    assert slim.resolve_parser("auto") == expected
    assert slim.resolve_parser("none") == "none"


def test_cli_parser_option_and_its_report(tmp_path):
    path = tmp_path / "s.onnx"
    _shape_slice_model(path)
    proc = run_cli("clean", str(path), "--parser", "rtx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["parser"] == "rtx" and report["rewritten"] == {"shape_start_end": []}
    assert report["slim"]["tool"] == "onnxslim" and "note" not in report["slim"]
    assert _attributed_shapes(onnx.load(str(tmp_path / "s.clean.onnx"))) == ["shape_ab", "shape_c"]
    proc = run_cli("clean", str(path), "-o", str(tmp_path / "t.onnx"), "--parser", "none")
    assert proc.returncode == 0, proc.stderr
    assert "parser target none: no rewrites needed" in proc.stdout and "onnxslim " in proc.stdout


# -- onnxslim's part -------------------------------------------------------------------------------------------------


def _mlp_with_unused_input():
    """Constant subgraph (Transpose of a weight), a shape subgraph (Shape -> Gather -> Reshape), and an input `mask`
    that nothing reads."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    axis = numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")
    minus = numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus")
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["h"]),
        helper.make_node("Shape", ["h"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"]),
        helper.make_node("Unsqueeze", ["n", "minus"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["y"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
        helper.make_tensor_value_info("mask", TensorProto.INT64, ["n", 4]),
    ]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, axis, minus])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_clean_keeps_inputs_that_onnxslim_drops(tmp_path):
    """The sidecar's inputs are the model's interface: an unused one stays, so every later step can still feed it."""
    path = tmp_path / "m.onnx"
    onnx.save(_mlp_with_unused_input(), str(path))
    result = clean_file(path)
    cleaned = onnx.load(str(result.path))
    assert [i.name for i in cleaned.graph.input] == ["x", "mask"]
    assert "Transpose" not in result.after.ops and result.after.nodes < result.before.nodes


def test_onnxslim_failure_falls_back_with_a_note(tmp_path, monkeypatch):
    onnxslim = require("onnxslim")

    def broken(*args, **kwargs):
        raise RuntimeError("cannot slim\nthis graph")

    monkeypatch.setattr(onnxslim, "slim", broken)
    path = tmp_path / "m.onnx"
    onnx.save(_mlp_with_unused_input(), str(path))
    result = clean_file(path)
    note = result.sidecar["slim"]["note"]
    assert note == "onnxslim failed (RuntimeError: cannot slim this graph); folded constants with onnx-graphsurgeon instead"
    assert "fold_constants" in result.sidecar["passes"] and "onnxslim" not in result.sidecar["passes"]
    assert "Transpose" not in result.after.ops  # onnx-graphsurgeon folded the constant subgraph
    assert max(result.rel_l2.values()) == 0.0

    from typer.testing import CliRunner

    from trtforge.cli.app import app

    shown = CliRunner().invoke(app, ["clean", str(path), "-o", str(tmp_path / "c2.onnx")])
    assert shown.exit_code == 0, shown.output
    assert f"note: {note}" in " ".join(shown.output.split())


def test_pipeline_cleans_for_its_build_backend(tmp_path):
    """clean.parser auto follows the pipeline's --backend, and another target re-runs the clean step."""
    require("tensorrt_rtx")
    from trtforge.core.config import apply_overrides, load_config
    from trtforge.pipeline import Pipeline

    cfg = load_config(ROOT / "configs" / "tiny-fcn.yaml")
    rtx, elsewhere = Pipeline(cfg, tmp_path, "tensorrt_rtx"), Pipeline(cfg, tmp_path, "tensorrt")
    rtx.paths["onnx"].write_bytes(b"stands in for the export")
    assert rtx._clean_parser() == "rtx"
    assert elsewhere._clean_parser() == "trt8"  # TensorRT 8.6 where installed; without it, the rewrite that parses anywhere
    assert elsewhere._fp("clean") != rtx._fp("clean")  # same config and ONNX, another target: clean runs again
    pinned = Pipeline(apply_overrides(cfg, {"clean.parser": "trt8"}), tmp_path, "tensorrt_rtx")
    assert pinned._clean_parser() == "trt8"


def test_weights_equal_to_an_identity_keep_their_nodes(tmp_path):
    """A fresh model's zero bias and unit scale stay nodes (onnxslim alone deletes x + 0 and x * 1): the cleaned graph
    has the trained model's structure, and the bias is still there for the build's fusion passes to fold."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "bias")
    scale = numpy_helper.from_array(np.ones(4, np.float32), "scale")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "bias"], ["hb"]),
        helper.make_node("Mul", ["hb", "scale"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w, bias, scale]), opset_imports=[helper.make_opsetid("", 17)])
    cleaned, counts = clean_model(model)
    assert [n.op_type for n in cleaned.graph.node] == ["MatMul", "Add", "Mul"] and "note" not in counts["slim"]
    assert [i.name for i in cleaned.graph.input] == ["x"] and {t.name for t in cleaned.graph.initializer} == {"w", "bias", "scale"}
