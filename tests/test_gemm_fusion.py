"""The GEMM pass (trtforge.fusion.gemm, issue 11): the fp16 MatMuls by constant weights that the other passes leave
become TrtforgeGemm nodes (trtforge/native/gemm_plugin.cpp, cuBLASLt), biases folded where only their Add reads the
product. ORT cannot run the plugin: each node is emulated by its contract (tests/attention_emulation.py) and the
graph compared with the fp32 ORIGINAL at a shape the pass never saw."""

import numpy as np
import onnx
import pytest
from attention_emulation import emulate_gemm_plugins, fp16_plugin_chain, rel_l2, reverse_weight_rows, with_random_vectors, zoo_sizes
from conftest import assert_user_error, export_zoo, run_cli
from onnx import TensorProto, helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.fusion.gemm import PLUGIN, fuse_gemm, gemm_candidates
from trtforge.graph.index import io_specs
from trtforge.runtime.feeds import random_feeds

EXPORTS = [("bert", "legacy"), ("bert", "dynamo"), ("vit", "legacy"), ("gpt2", "legacy"), ("gpt2", "dynamo")]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return export_zoo(tmp_path_factory.mktemp("gemm"), EXPORTS)


def _const_matmuls(model):
    """The projections: MatMuls and Gemms (GPT-2's Conv1D) by a constant weight."""
    consts = {i.name for i in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in consts]


@pytest.mark.parametrize("key", EXPORTS, ids=lambda k: ".".join(k))
def test_fp16_projections_become_trtforge_gemm_and_equal_the_original(zoo, key):
    """BERT's and ViT's Linear layers export as MatMul (+ Add), GPT-2's Conv1D as ONNX Gemm with its bias as C: each
    becomes one TrtforgeGemm with its bias folded."""
    from trtforge.build.precision import prepare_for_build

    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    before = _const_matmuls(converted)
    fused, report = fuse_gemm(converted)
    assert before and len(report.replaced) == len(before), report.to_json()
    assert not _const_matmuls(fused)
    nodes = [n for n in fused.graph.node if n.op_type == PLUGIN]
    assert len(nodes) == len(before)
    if key != ("gpt2", "dynamo"):  # the dynamo exporter drops random-init GPT-2's all-zero Conv1D biases: none to fold
        assert sum(r["bias_folded"] for r in report.replaced) >= len(before) // 2  # every Linear's bias, at least
    adds = lambda m: sum(n.op_type == "Add" for n in m.graph.node)  # noqa: E731
    from_gemm = sum(r["op"] == "Gemm" and r["bias_folded"] for r in report.replaced)  # a Gemm's bias is its C, no Add
    assert adds(fused) == adds(converted) - sum(r["bias_folded"] for r in report.replaced) + from_gemm
    assert key[0] != "gpt2" or all(r["op"] == "Gemm" for r in report.replaced)  # every GPT-2 projection is a Gemm
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=5)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulate_gemm_plugins(fused).SerializeToString()).run(feeds)
    assert all(rel_l2(got[k], v) < 1e-2 for k, v in want.items()), {k: rel_l2(got[k], v) for k, v in want.items()}
    # A plugin that read its weight in the other order would be wrong, and the emulation shows it.
    for n in nodes:
        reverse_weight_rows(n)
    bad = OrtRunner(emulate_gemm_plugins(fused).SerializeToString()).run(feeds)
    assert any(rel_l2(bad[k], v) > 1e-2 for k, v in want.items())


def test_after_the_gelu_and_skip_layernorm_passes_it_takes_only_what_they_left(zoo):
    """In build's order: FC1 went into TrtforgeGemmGelu and the dense biases into skip-LayerNorm; the GEMM pass takes
    the QKV, output and FC2 projections, now without a bias of their own."""
    from trtforge.fusion.gelu import GEMM_PLUGIN

    _, _, stages, _, _ = fp16_plugin_chain(zoo[("bert", "legacy")])
    assert stages["skip_layernorm"][1].replaced
    fused, report = stages["gemm"]
    kinds = [n.op_type for n in fused.graph.node]
    assert kinds.count(GEMM_PLUGIN) == 2 and kinds.count(PLUGIN) == len(report.replaced) > 0
    assert not _const_matmuls(fused)
    folded = {r["node"]: r["bias_folded"] for r in report.replaced}
    assert not all(folded.values())  # the skip-LayerNorm plugin kept the output and FC2 biases


def _tiny(w_dtype=np.float16, reuse_product=False, bias_shape=(4,)):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16 if w_dtype == np.float16 else TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16 if w_dtype == np.float16 else TensorProto.FLOAT, None)
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(3, 4)).astype(w_dtype), "W"),
        numpy_helper.from_array(rng.normal(size=bias_shape).astype(w_dtype), "b"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm"), helper.make_node("Add", ["xw", "b"], ["y0"], name="add")]
    if reuse_product:  # the product is read twice: its bias cannot go into the plugin
        nodes.append(helper.make_node("Mul", ["xw", "y0"], ["y"], name="mul"))
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])


def test_the_bias_is_folded_only_where_the_add_alone_reads_the_product():
    taken, _ = gemm_candidates(_tiny())
    assert len(taken) == 1 and taken[0]["bias"] is not None and taken[0]["y"] == "y0"
    taken, _ = gemm_candidates(_tiny(reuse_product=True))
    assert len(taken) == 1 and taken[0]["bias"] is None and taken[0]["y"] == "xw"
    taken, _ = gemm_candidates(_tiny(bias_shape=(1, 4)))  # a broadcast [1, N] bias is not the epilogue's [N]
    assert taken[0]["bias"] is None
    x = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float16)
    for model in (_tiny(), _tiny(reuse_product=True)):
        fused, _ = fuse_gemm(model)
        want = OrtRunner(model.SerializeToString()).run({"x": x})["y"]
        got = OrtRunner(emulate_gemm_plugins(fused).SerializeToString()).run({"x": x})["y"]
        assert rel_l2(got.astype(np.float32), want.astype(np.float32)) < 2e-3


def _tiny_gemm(c_shape=(4,), trans_b=0, c_is_input=False, **attrs):
    """y = Gemm(x [2, 3], W, C) in fp16, W constant ([3, 4], or [4, 3] with transB)."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 3) if trans_b else (3, 4)).astype(np.float16)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])]
    inits = [numpy_helper.from_array(w, "W")]
    if c_is_input:
        inputs.append(helper.make_tensor_value_info("C", TensorProto.FLOAT16, [4]))
    elif c_shape is not None:
        inits.append(numpy_helper.from_array(rng.normal(size=c_shape).astype(np.float16), "C"))
    gemm_inputs = ["x", "W"] + (["C"] if c_is_input or c_shape is not None else [])
    node = helper.make_node("Gemm", gemm_inputs, ["y"], name="gemm", transB=trans_b, **attrs)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
    return helper.make_model(helper.make_graph([node], "g", inputs, [y], inits), opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"trans_b": 1}, {"c_shape": (1, 4)}, {"c_shape": None}, {"alpha": 1.0, "beta": 1.0}],
    ids=["bias", "transB", "bias-1xN", "no-bias", "explicit-1"],
)
def test_a_plain_gemm_becomes_trtforge_gemm_with_its_bias(kwargs):
    model = _tiny_gemm(**kwargs)
    fused, report = fuse_gemm(model)
    assert [n.op_type for n in fused.graph.node] == [PLUGIN] and report.replaced[0]["op"] == "Gemm"
    assert report.replaced[0]["bias_folded"] == (kwargs.get("c_shape", (4,)) is not None)
    x = np.random.default_rng(3).normal(size=(2, 3)).astype(np.float16)
    want = OrtRunner(model.SerializeToString()).run({"x": x})["y"].astype(np.float32)
    got = OrtRunner(emulate_gemm_plugins(fused).SerializeToString()).run({"x": x})["y"].astype(np.float32)
    assert rel_l2(got, want) < 2e-3
    if kwargs.get("trans_b"):  # a weight taken as it is stored would be [4, 3]: the wrong product, or none
        assert (report.replaced[0]["k"], report.replaced[0]["n"]) == (3, 4)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"transA": 1}, "transposes its input (transA)"),
        ({"alpha": 0.5}, "scales the product (alpha 0.5)"),
        ({"beta": 2.0}, "scales its bias (beta 2)"),
        ({"c_shape": (2, 4)}, "bias C is float16 [2, 4]"),
        ({"c_is_input": True}, "bias C is not a constant"),
    ],
)
def test_a_gemm_that_is_not_x_at_w_plus_bias_is_refused_with_the_reason(kwargs, says):
    fused, report = fuse_gemm(_tiny_gemm(**kwargs))
    assert not report.replaced and [n.op_type for n in fused.graph.node] == ["Gemm"]
    assert says in report.refused[0]["reason"], report.refused


def test_fp32_weights_are_refused_with_the_reason():
    fused, report = fuse_gemm(_tiny(np.float32))
    assert not report.replaced and fused.graph.node[0].op_type == "MatMul"
    assert report.refused == [{"node": "mm", "reason": report.refused[0]["reason"]}]
    assert "float32; the plugin is fp16" in report.refused[0]["reason"]


def test_auto_fuses_fp16_builds_only_and_on_needs_the_plugin():
    from trtforge.core.errors import UserError
    from trtforge.fusion.step import GEMM_PASS, elementwise_fusion

    model = _tiny()
    fused, record = elementwise_fusion(GEMM_PASS, model, model, "auto", "fp16", "tensorrt", "8.6.0", True, {}, "m.onnx")
    assert fused is not None and record["plugins"] == [f"{PLUGIN} v1"]
    fused, record = elementwise_fusion(GEMM_PASS, model, model, "auto", "best", "tensorrt", "8.6.0", True, {}, "m.onnx")
    assert fused is None and record["route"] == "none" and "measured faster only in fp16" in record["why"]
    fused, record = elementwise_fusion(GEMM_PASS, model, model, "auto", "fp16", "tensorrt", "8.6.0", False, {}, "m.onnx")
    assert fused is None and "not in this TensorRT's plugin registry" in record["why"]
    with pytest.raises(UserError, match="TrtforgeGemm v1 is not in this TensorRT's plugin registry"):
        elementwise_fusion(GEMM_PASS, model, model, "on", "fp16", "tensorrt", "8.6.0", False, {}, "m.onnx")
    with pytest.raises(
        UserError,
        match="build libtrtforge_plugins once with `trtforge plugins build`.*--plugin-library PATH \\(config key build.plugin_libraries\\)",
    ):
        elementwise_fusion(GEMM_PASS, model, model, "on", "fp16", "tensorrt", "8.6.0", False, {}, "m.onnx")
    with pytest.raises(UserError, match="found no GEMM in m.onnx it can fuse: the weight is float32"):
        elementwise_fusion(GEMM_PASS, _tiny(np.float32), model, "on", "best", "tensorrt", "8.6.0", True, {}, "m.onnx")
    with pytest.raises(UserError, match="precision fp32 has no GEMM plugin route; build with fp16 or best"):
        elementwise_fusion(GEMM_PASS, model, model, "on", "fp32", "tensorrt", "8.6.0", True, {}, "m.onnx")
    with pytest.raises(UserError, match="TrtforgeGemm is written for TensorRT 8.x .*tensorrt-rtx 1.2 gets no GEMM pass"):
        elementwise_fusion(GEMM_PASS, model, model, "on", "fp16", "tensorrt-rtx", "1.2", True, {}, "m.onnx")


def test_cli_fuse_gemm_rejects_an_unknown_mode(zoo, tmp_path):
    proc = run_cli("build", str(zoo[("bert", "legacy")]), "--precision", "fp16", "--fuse-gemm", "maybe", "-o", str(tmp_path / "g.engine"))
    assert_user_error(proc, "--fuse-gemm must be 'auto', 'on' or 'off', got 'maybe'")


def test_a_shared_weight_and_one_past_the_attribute_budget_are_refused():
    """The weight is copied into the plugin's fields: never once per node (ALBERT's shared layers), never past what
    an .onnx file can hold inline (attributes cannot go to external data)."""
    model = _tiny()
    model.graph.node.append(helper.make_node("MatMul", ["x", "W"], ["xw2"], name="mm2"))
    model.graph.output.append(helper.make_tensor_value_info("xw2", TensorProto.FLOAT16, None))
    taken, refused = gemm_candidates(model)
    assert not taken and {r["node"] for r in refused} == {"mm", "mm2"}
    assert "its weight is read by 2 nodes" in refused[0]["reason"]
    taken, refused = gemm_candidates(_tiny(), budget=10)  # W is 3 x 4 fp16: 24 bytes
    assert not taken and "2 GB protobuf limit" in refused[0]["reason"]
    from trtforge.fusion.gemm import attribute_bytes

    fused, _ = fuse_gemm(_tiny())  # holds W and b as plugin fields now: 24 + 8 bytes
    assert attribute_bytes(fused) == 24 + 8 and attribute_bytes(_tiny()) == 0
    fused.graph.initializer.append(numpy_helper.from_array(np.ones((3, 4), np.float16), "W2"))
    fused.graph.node.append(helper.make_node("MatMul", ["x", "W2"], ["xw3"], name="mm3"))
    fused.graph.output.append(helper.make_tensor_value_info("xw3", TensorProto.FLOAT16, None))
    assert len(gemm_candidates(fused, budget=32 + 24)[0]) == 1
    taken, refused = gemm_candidates(fused, budget=32 + 23)  # what the graph already holds counts
    assert not taken and "2 GB protobuf limit" in refused[0]["reason"]


def test_qkv_projection_auto_is_matmul_only_where_trtforge_gemm_takes_it():
    from trtforge.core.config import BuildSection
    from trtforge.fusion.step import QKV_CHOICES, qkv_gemm_applies, resolve_qkv_projection

    assert BuildSection().qkv_projection == "auto" and QKV_CHOICES == ("auto", "matmul", "conv")
    assert qkv_gemm_applies("auto", "fp16", "tensorrt", "8.6.0", True)
    assert qkv_gemm_applies("on", "fp16", "tensorrt", "8.6.0", True)
    assert not qkv_gemm_applies("on", "best", "tensorrt", "8.6.0", True)  # INT8 projections: conv keeps their INT8 conv
    assert not qkv_gemm_applies("off", "fp16", "tensorrt", "8.6.0", True)
    assert not qkv_gemm_applies("auto", "fp16", "tensorrt", "8.6.0", False)
    assert not qkv_gemm_applies("auto", "fp16", "tensorrt-rtx", "1.2", True)
    assert resolve_qkv_projection("auto", True) == "matmul" and resolve_qkv_projection("auto", False) == "conv"
    assert resolve_qkv_projection("conv", True) == "conv" and resolve_qkv_projection("matmul", False) == "matmul"


def test_cli_rejects_an_unknown_qkv_projection_naming_auto(zoo, tmp_path):
    proc = run_cli(
        "build", str(zoo[("bert", "legacy")]), "--precision", "fp16", "--qkv-projection", "gemm", "-o", str(tmp_path / "g.engine")
    )
    assert_user_error(proc, "--qkv-projection must be 'auto', 'matmul' or 'conv', got 'gemm'")


def test_the_build_line_names_the_kinds_of_projection_taken():
    from trtforge.fusion.step import describe_gemm

    line = describe_gemm({"replaced": [{"op": "MatMul", "bias_folded": True}] * 2 + [{"op": "Gemm", "bias_folded": False}]})[0]
    assert "replaced 3 fp16 projection(s) (2 MatMul and 1 Gemm)" in line and "(2 with their bias;" in line
