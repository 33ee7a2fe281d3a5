"""bias + GELU fusion (issue 11): each GELU of the zoo's exports (erf form: BERT, ViT; tanh form: GPT-2; both
exporters) becomes one CustomGeluPluginDynamic node, its bias folded in; the plugin is emulated on ORT
(tests/attention_emulation.py) and compared with the ORIGINAL graph at a sequence length the pass never saw."""

import math

import numpy as np
import onnx
import pytest
from attention_emulation import emulate_gelu_plugins, rel_l2, with_random_vectors, zoo_sizes
from conftest import export_zoo
from onnx import TensorProto, helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.fusion.gelu import PLUGIN, erf, fuse_gelu, gelu_erf, gelu_tanh
from trtforge.graph.index import io_specs
from trtforge.runtime.feeds import random_feeds

EXPORTS = [("bert", "legacy"), ("bert", "dynamo"), ("vit", "legacy"), ("gpt2", "legacy"), ("gpt2", "dynamo")]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return export_zoo(tmp_path_factory.mktemp("gelu"), EXPORTS)


@pytest.mark.parametrize("key", EXPORTS, ids=lambda k: ".".join(k))
def test_every_gelu_becomes_one_plugin_with_its_bias(zoo, key):
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    fused, report = fuse_gelu(model, random_feeds(specs, zoo_sizes(axes, 16)))
    layers = 2  # the small zoo models
    assert len(report.replaced) == layers, report.to_json()
    # BERT's pooler Tanh is refused with its reason; nothing else is left
    assert len(report.refused) == (1 if key[0] == "bert" else 0), report.refused
    assert all("not multiplied back" in r["reason"] for r in report.refused)
    assert all(r["form"] == ("tanh" if key[0] == "gpt2" else "erf") for r in report.replaced)
    assert all(r["bias_folded"] for r in report.replaced) == (key[0] != "gpt2")  # GPT-2's Conv1D bias feeds a Reshape first
    assert not any(n.op_type == "Erf" for n in fused.graph.node)
    assert sum(n.op_type == "Tanh" for n in fused.graph.node) == (1 if key[0] == "bert" else 0)
    plugins = [n for n in fused.graph.node if n.op_type == PLUGIN]
    assert len(plugins) == layers and all(n.domain == "trt.plugins" for n in plugins)
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=7)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulate_gelu_plugins(fused).SerializeToString()).run(feeds)
    for name, value in want.items():
        # the tanh formula replaces erf exactly for GPT-2; for erf GELUs it differs by <= ~5e-4 per activation
        assert rel_l2(got[name], value) < (1e-5 if key[0] == "gpt2" else 3e-3), name


def test_fp16_graph_gets_an_fp16_plugin_and_bias(zoo):
    from trtforge.build.precision import prepare_for_build

    key = ("bert", "legacy")
    model = onnx.load(zoo[key])
    specs, axes, _ = io_specs(zoo[key], model)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    fused, report = fuse_gelu(converted, random_feeds(specs, zoo_sizes(axes, 16)))
    assert len(report.replaced) == 2, report.to_json()
    plugin = next(n for n in fused.graph.node if n.op_type == PLUGIN)
    attrs = {a.name: helper.get_attribute_value(a) for a in plugin.attribute}
    assert attrs["type_id"] == 1 and attrs["bias"].data_type == TensorProto.FLOAT16
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=5)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulate_gelu_plugins(fused).SerializeToString()).run(feeds)
    assert all(rel_l2(got[k], v) < 1e-2 for k, v in want.items())


def _elementwise_model(build):
    """y = build(x) over ops; x: [2, 8]."""
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    build(nodes, const)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_what_is_not_a_gelu_is_refused_with_its_reason():
    x = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
    lone = _elementwise_model(lambda n, c: n.append(helper.make_node("Erf", ["x"], ["y"])))
    _, report = fuse_gelu(lone, {"x": x})
    assert not report.replaced and "not multiplied back" in report.refused[0]["reason"]

    def wrong_scale(n, c):  # x * 0.5 * (1 + erf(x / 2)): GELU's shape, not its function
        n += [
            helper.make_node("Div", ["x", c("two", 2.0)], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", c("one", 1.0)], ["a"]),
            helper.make_node("Mul", ["x", "a"], ["m"]),
            helper.make_node("Mul", ["m", c("half", 0.5)], ["y"]),
        ]

    _, report = fuse_gelu(_elementwise_model(wrong_scale), {"x": x})
    assert not report.replaced and "numeric check" in report.refused[0]["reason"]


def test_the_numeric_check_reads_a_sample_of_large_tensors(monkeypatch):
    """Over SAMPLE elements the check reads every k-th one (the same positions of x and y): the wrong-scale chain is
    still refused, and a real GELU still fused, when only 4 of 16 elements are read."""
    import trtforge.fusion.gelu as gelu_module

    monkeypatch.setattr(gelu_module, "SAMPLE", 4)
    a = np.arange(16.0).reshape(2, 8)
    assert np.array_equal(gelu_module._sample(a), [0.0, 4.0, 8.0, 12.0]) and gelu_module._sample(a[:1, :4]).size == 4
    x = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)

    def chain(divisor):
        def write(n, c):
            n += [
                helper.make_node("Div", ["x", c("divisor", divisor)], ["q"]),
                helper.make_node("Erf", ["q"], ["e"]),
                helper.make_node("Add", ["e", c("one", 1.0)], ["a"]),
                helper.make_node("Mul", ["x", "a"], ["m"]),
                helper.make_node("Mul", ["m", c("half", 0.5)], ["y"]),
            ]

        return _elementwise_model(write)

    _, report = fuse_gelu(chain(2.0), {"x": x})
    assert not report.replaced and "numeric check" in report.refused[0]["reason"]
    _, report = fuse_gelu(chain(float(np.sqrt(2.0))), {"x": x})
    assert len(report.replaced) == 1


def test_reference_formulas():
    x = np.linspace(-6, 6, 1001)
    assert np.abs(gelu_tanh(x) - gelu_erf(x)).max() < 1e-3
    assert gelu_erf(np.array([0.0, 1.0]))[1] == pytest.approx(0.8413447460685429)


def test_vectorized_erf_matches_math_erf():
    """The verification's erf is an approximation: within 2e-7 of math.erf everywhere, odd, and saturating."""
    x = np.concatenate([np.linspace(-8, 8, 20001), [0.0, 1e-12, -1e-12, 30.0, -30.0]])
    want = np.array([math.erf(v) for v in x])
    assert np.abs(erf(x) - want).max() < 2e-7
    assert erf(np.array([0.0]))[0] == 0.0 and erf(np.array([50.0]))[0] == 1.0


def test_build_step_modes(zoo):
    """The build's decision: auto fuses fp16 builds on TensorRT 8.x (measured faster there) and leaves INT8 best
    builds and other TensorRTs alone, saying why; on fuses wherever the plugin is registered and says in one
    sentence why it cannot elsewhere; off never."""
    from trtforge.core.errors import UserError
    from trtforge.fusion.step import describe_gelu, gelu_fusion

    key = ("bert", "dynamo")
    model = onnx.load(zoo[key])
    specs, axes, _ = io_specs(zoo[key], model)
    feeds = random_feeds(specs, zoo_sizes(axes, 16))
    none, record = gelu_fusion(model, model, "off", "fp16", "tensorrt", "8.6.0", True, feeds, "m.onnx")
    assert none is None and record["route"] == "off" and describe_gelu(record) == []
    fused, record = gelu_fusion(model, model, "on", "fp16", "tensorrt", "8.6.0", True, feeds, "m.onnx")
    assert sum(n.op_type == PLUGIN for n in fused.graph.node) == 2 and len(record["replaced"]) == 2
    assert "replaced 2 GELU(s)" in describe_gelu(record)[0]
    fused, record = gelu_fusion(model, model, "auto", "fp16", "tensorrt", "8.6.0", True, feeds, "m.onnx")
    assert sum(n.op_type == PLUGIN for n in fused.graph.node) == 2 and record["route"] == "plugin"
    for args, fragment in [
        (("auto", "best", "tensorrt", "8.6.0", True), "measured faster only in fp16"),
        (("auto", "fp16", "tensorrt_rtx", "1.7.1", False), "fuses GELU itself"),
        (("auto", "fp16", "tensorrt", "8.6.0", False), "not in this TensorRT's plugin registry"),
    ]:
        none, record = gelu_fusion(model, model, *args, feeds, "m.onnx")
        assert none is None and record["route"] == "none" and fragment in record["why"], record
    for args, fragment in [
        (("on", "fp16", "tensorrt_rtx", "1.7.1", False), "fuses GELU itself"),
        (("on", "fp16", "tensorrt", "8.6.0", False), "not in this TensorRT's plugin registry"),
        (("maybe", "fp16", "tensorrt", "8.6.0", True), "config key build.fuse_gelu"),
    ]:
        with pytest.raises(UserError, match=fragment):
            gelu_fusion(model, model, *args, feeds, "m.onnx")


def test_gelu_after_attention_fusion_observes_the_unfused_graph(zoo):
    """build fuses attention first: the GELU pass then reads its numbers from the graph before that pass
    (ORT cannot run the attention plugin) and applies to the fused one."""
    from attention_emulation import emulate_plugins

    from trtforge.fusion.attention import fuse_attention
    from trtforge.fusion.plugins import attention_route

    key = ("bert", "legacy")
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    feeds = random_feeds(specs, zoo_sizes(axes, 16))
    attn, _ = fuse_attention(model, feeds, lambda c: attention_route("tensorrt", "8.6.1", 80, c.head_size, c.seq, False), "x")
    both, report = fuse_gelu(attn, feeds, observe_model=model)
    assert len(report.replaced) == 2
    emulated = emulate_gelu_plugins(emulate_plugins(both, padded_head=32))
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=7)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulated.SerializeToString()).run(feeds)
    assert all(rel_l2(got[k], v) < 3e-3 for k, v in want.items())


def test_cli_build_fuse_gelu_needs_tensorrt_8(zoo, tmp_path):
    from conftest import assert_user_error, require, run_cli

    require("tensorrt_rtx")
    onnx_path = zoo[("gpt2", "legacy")]
    proc = run_cli("build", str(onnx_path), "--precision", "fp16", "--fuse-gelu", "on", "-o", str(tmp_path / "g.engine"))
    assert_user_error(proc, "--fuse-gelu on cannot fuse", "fuses GELU itself")
    proc = run_cli("build", str(onnx_path), "--precision", "fp16", "--fuse-gelu", "maybe", "-o", str(tmp_path / "g.engine"))
    assert_user_error(proc, "--fuse-gelu must be 'auto', 'on' or 'off', got 'maybe'")


def test_int8_best_graph_gelus_are_fused(zoo):
    """What `build --precision best --fuse-gelu on` hands the pass: Casts around the INT8 GEMMs' fp32 islands,
    a Cast to fp32 before the next layer's QuantizeLinear, and the rest of a deep network below each GELU (the
    first layer's was once refused because the search for its descendants stopped early)."""
    from test_attention_fusion import _quantized

    from trtforge.build.precision import prepare_for_build

    key = ("bert", "legacy")
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    sizes = zoo_sizes(axes, 16)
    best, _ = prepare_for_build(_quantized(model, specs, sizes), zoo[key], specs, axes)
    fused, report = fuse_gelu(best, random_feeds(specs, sizes))
    assert len(report.replaced) == 2 and all(r["bias_folded"] for r in report.replaced), report.to_json()
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=5)
    ref, unfused, got = (OrtRunner(m.SerializeToString()).run(feeds) for m in (model, best, emulate_gelu_plugins(fused)))
    for name, value in ref.items():
        assert rel_l2(got[name], value) <= 1.5 * rel_l2(unfused[name], value) + 0.01, name


@pytest.mark.parametrize("key", [("bert", "legacy"), ("bert", "dynamo"), ("vit", "legacy")], ids=lambda k: ".".join(k))
def test_fp16_gelu_takes_its_gemm_into_trtforge_gemm_gelu(zoo, key):
    """With libtrtforge_plugins loaded, FC1's MatMul + bias + GELU of an fp16 graph become one TrtforgeGemmGelu node
    (cuBLASLt GELU_BIAS); emulated, the graph stays within the fp16 gate of the fp32 original."""
    from attention_emulation import emulate_gemm_gelu_plugins, reverse_weight_rows

    from trtforge.build.precision import prepare_for_build
    from trtforge.fusion.gelu import GEMM_PLUGIN

    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    fused, report = fuse_gelu(converted, random_feeds(specs, zoo_sizes(axes, 16)), gemm_plugin=True)
    assert len(report.replaced) == 2 and all(r["gemm_folded"] for r in report.replaced), report.to_json()
    nodes = [n for n in fused.graph.node if n.op_type == GEMM_PLUGIN]
    assert len(nodes) == 2 and not any(n.op_type == PLUGIN for n in fused.graph.node)
    matmuls = lambda m: sum(n.op_type == "MatMul" for n in m.graph.node)  # noqa: E731
    assert matmuls(fused) == matmuls(converted) - 2  # each FC1 MatMul went into its plugin
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attrs["weight"].data_type == attrs["bias"].data_type == TensorProto.FLOAT16
    assert len(attrs["weight"].dims) == 1 and attrs["weight"].dims[0] == attrs["k"] * attrs["n"]
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=5)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulate_gemm_gelu_plugins(fused).SerializeToString()).run(feeds)
    assert all(rel_l2(got[k], v) < 1e-2 for k, v in want.items()), {k: rel_l2(got[k], v) for k, v in want.items()}
    # A plugin that read the weight transposed would be wrong: the emulation of such a node differs.
    for n in nodes:
        reverse_weight_rows(n)
    bad = OrtRunner(emulate_gemm_gelu_plugins(fused).SerializeToString()).run(feeds)
    assert any(rel_l2(bad[k], v) > 1e-2 for k, v in want.items())


def test_fp32_and_gemm_less_gelus_keep_the_gelu_plugin(zoo):
    """fp32 graphs (the plugin is fp16) and GPT-2 (its Conv1D bias feeds a Reshape) keep CustomGeluPluginDynamic."""
    for key in (("bert", "legacy"), ("gpt2", "legacy")):
        model = onnx.load(zoo[key])
        specs, axes, _ = io_specs(zoo[key], model)
        _, report = fuse_gelu(model, random_feeds(specs, zoo_sizes(axes, 16)), gemm_plugin=True)
        assert report.replaced and not any(r["gemm_folded"] for r in report.replaced)


def test_gemm_gelu_weights_stop_short_of_the_inline_attribute_budget(zoo, monkeypatch):
    """TrtforgeGemmGelu's weight is a node attribute, which ONNX keeps inside the .onnx file: past the budget the
    GELU keeps the plain GELU plugin and its GEMM stays TensorRT's."""
    import trtforge.fusion.gemm as gemm
    from trtforge.build.precision import prepare_for_build

    key = ("bert", "legacy")
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    feeds = random_feeds(specs, zoo_sizes(axes, 16))
    fused, report = fuse_gelu(converted, feeds, gemm_plugin=True)
    assert [r["gemm_folded"] for r in report.replaced] == [True, True]
    w_bytes = gemm.attribute_bytes(fused) // 2  # each plugin's weight and bias
    monkeypatch.setattr(gemm, "ATTRIBUTE_BUDGET", w_bytes + w_bytes // 2)
    _, report = fuse_gelu(converted, feeds, gemm_plugin=True)
    assert [r["gemm_folded"] for r in report.replaced] == [True, False]
