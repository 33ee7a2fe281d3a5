"""Skip-LayerNorm fusion (issue 11): each post-LN residual block of the zoo's exports (BERT, both exporters) becomes one
CustomSkipLayerNormPluginDynamic node with the dense bias folded in; the plugin is emulated on ORT
(tests/attention_emulation.py) and compared with the ORIGINAL graph at a sequence length the pass never saw.
Pre-LN blocks (GPT-2, ViT), whose residual sum is read again, must be refused."""

import numpy as np
import onnx
import pytest
from attention_emulation import emulate_skip_layernorm_plugins, rel_l2, with_random_vectors, zoo_sizes
from conftest import export_zoo
from onnx import TensorProto, helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.fusion.skip_layernorm import PLUGIN, fuse_skip_layernorm, plugin_layernorm
from trtforge.graph.index import io_specs
from trtforge.runtime.feeds import random_feeds

EXPORTS = [("bert", "legacy"), ("bert", "dynamo"), ("vit", "legacy"), ("gpt2", "legacy")]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return export_zoo(tmp_path_factory.mktemp("skipln"), EXPORTS)


@pytest.mark.parametrize("key", EXPORTS, ids=lambda k: ".".join(k))
def test_post_ln_residuals_become_plugins_and_pre_ln_ones_are_refused(zoo, key):
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    fused, report = fuse_skip_layernorm(model, random_feeds(specs, zoo_sizes(axes, 16)))
    plugins = [n for n in fused.graph.node if n.op_type == PLUGIN]
    if key[0] != "bert":  # pre-LN: each residual sum also feeds the next residual Add, except the last one's
        assert len(report.replaced) == 1, report.to_json()
        assert report.replaced[0]["node"].startswith(("/vit/layernorm/", "/ln_f/")), report.replaced  # the final LayerNorm
        assert len(plugins) == 1 and len(report.refused) == 4, report.to_json()  # 2 layers x 2 pre-LNs
        # the sums before the other LayerNorms are read again (ViT's first one reads the embeddings, no residual Add)
        assert all("read elsewhere" in r["reason"] or "not a residual Add" in r["reason"] for r in report.refused), report.refused
        assert sum("read elsewhere" in r["reason"] for r in report.refused) >= 3
        return
    # 2 layers x (attention output, FFN output), each with its dense bias; the embeddings' LayerNorm adds position
    # embeddings broadcast over the batch ([1, S, E]): refused, the plugin adds same-shaped tensors
    assert len(report.replaced) == 4 and all(r["bias_folded"] for r in report.replaced), report.to_json()
    assert len(report.refused) == 1 and "differ in shape" in report.refused[0]["reason"], report.refused
    assert len(plugins) == 4 and sum(n.op_type == "LayerNormalization" for n in fused.graph.node) == 1
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=7)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulate_skip_layernorm_plugins(fused).SerializeToString()).run(feeds)
    for name, value in want.items():
        assert rel_l2(got[name], value) < 1e-3, name


def test_fp16_graph_absorbs_the_casts_around_the_fp32_layernorm(zoo):
    from trtforge.build.precision import prepare_for_build

    key = ("bert", "legacy")
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    assert sum(n.op_type == "LayerNormalization" for n in converted.graph.node) == 5  # kept fp32, behind Casts
    casts = sum(n.op_type == "Cast" for n in converted.graph.node)
    fused, report = fuse_skip_layernorm(converted, random_feeds(specs, zoo_sizes(axes, 16)))
    assert len(report.replaced) == 4 and all(r["type"] == "float16" for r in report.replaced), report.to_json()
    # three blocks lose both Casts; the last one's LayerNorm writes the fp32 graph output, so the plugin's fp16
    # result goes through one Cast there (in place of the Cast before its LayerNorm)
    assert sum(n.op_type == "Cast" for n in fused.graph.node) == casts - 2 * 3
    plugin = next(n for n in fused.graph.node if n.op_type == PLUGIN)
    attrs = {a.name: helper.get_attribute_value(a) for a in plugin.attribute}
    assert attrs["type_id"] == 1 and attrs["gamma"].data_type == TensorProto.FLOAT16
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=5)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulate_skip_layernorm_plugins(fused).SerializeToString()).run(feeds)
    assert all(rel_l2(got[k], v) < 1e-2 for k, v in want.items())


def _residual_ln_model(scale: float, offset: float = 0.0):
    """y = LayerNorm(x * scale + offset + r * scale) over [2, 8]."""
    inits = [
        numpy_helper.from_array(np.full(8, 1.5, np.float32), "gamma"),
        numpy_helper.from_array(np.full(8, 0.25, np.float32), "beta"),
        numpy_helper.from_array(np.float32(scale), "scale"),
        numpy_helper.from_array(np.float32(offset), "offset"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["xs0"]),
        helper.make_node("Add", ["xs0", "offset"], ["xs"]),
        helper.make_node("Mul", ["r", "scale"], ["rs"]),
        helper.make_node("Add", ["xs", "rs"], ["sum"]),
        helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12, name="ln"),
    ]
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8])  # noqa: E731
    graph = helper.make_graph(nodes, "g", [io("x"), io("r")], [io("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_layernorm_the_plugins_arithmetic_would_change_is_refused():
    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(2, 8)).astype(np.float32), "r": rng.normal(size=(2, 8)).astype(np.float32)}
    _, report = fuse_skip_layernorm(_residual_ln_model(1.0), feeds)
    assert len(report.replaced) == 1 and report.replaced[0]["rel_l2"] < 1e-5
    # mean 1000, spread 0.01: E[x^2] - mean^2 cancels in fp32 (the graph's LayerNorm subtracts the mean first)
    _, report = fuse_skip_layernorm(_residual_ln_model(0.01, offset=1000.0), feeds)
    assert not report.replaced and "differs from the graph's" in report.refused[0]["reason"], report.to_json()


def test_the_plugin_arithmetic_replay():
    """plugin_layernorm against a float64 LayerNorm: exact up to rounding in fp32; in fp16 its fp16 sums cost ~6e-4
    (rel-L2) and at hidden 768 the fp16 epsilon (9.8e-4) shows on small variances; the block sum is the warp tree."""
    from trtforge.fusion.skip_layernorm import _block_sum

    rng = np.random.default_rng(1)
    for ld, scale, dtype, low, high in [
        (384, 1.0, np.float32, 0, 1e-6),
        (768, 1.0, np.float32, 0, 1e-6),
        (384, 1.0, np.float16, 2e-4, 2e-3),
        (768, 0.3, np.float16, 1.5e-3, 4e-3),
    ]:
        a, b = (rng.normal(size=(64, ld)) * scale).astype(dtype), (rng.normal(size=(64, ld)) * scale).astype(dtype)
        x = a.astype(np.float64) + b
        ref = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
        got = plugin_layernorm(a, b, None, np.ones(ld), np.zeros(ld), dtype)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert low <= err <= high, (ld, scale, dtype, err)
    v = np.arange(40, dtype=np.float32)[None]
    assert _block_sum(v, np.float32)[0] == v.sum()


def test_a_layernorm_whose_statistics_are_read_is_refused():
    model = _residual_ln_model(1.0)
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    ln.output.extend(["mean"])
    model.graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(2, 8)).astype(np.float32), "r": rng.normal(size=(2, 8)).astype(np.float32)}
    fused, report = fuse_skip_layernorm(model, feeds)
    assert not report.replaced and "mean or inverse deviation" in report.refused[0]["reason"] and fused is model


def test_build_step_modes_and_all_three_passes_together(zoo):
    """auto fuses the precisions the H200 measured it faster in (fp16, best) and leaves others alone, saying why; on fuses where the plugin is
    registered and says in one sentence why it cannot elsewhere; off never. After attention and GELU fusion the
    pass still finds every block (it reads its numbers from the unfused graph) and the emulated engine matches."""
    from attention_emulation import emulate_gelu_plugins, emulate_plugins

    from trtforge.core.errors import UserError
    from trtforge.fusion.attention import fuse_attention
    from trtforge.fusion.gelu import fuse_gelu
    from trtforge.fusion.plugins import attention_route
    from trtforge.fusion.step import SKIP_LN_PASS, describe_skip_layernorm, elementwise_fusion

    key = ("bert", "legacy")
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    feeds = random_feeds(specs, zoo_sizes(axes, 16))
    run = lambda m, *args: elementwise_fusion(SKIP_LN_PASS, m, model, *args, feeds, "m.onnx")  # noqa: E731
    none, record = run(model, "off", "fp16", "tensorrt", "8.6.0", True)
    assert none is None and record["route"] == "off" and describe_skip_layernorm(record) == []
    none, record = run(model, "auto", "int8", "tensorrt", "8.6.0", True)
    assert none is None and "measured faster only in fp16 and INT8 best" in record["why"], record
    fused, record = run(model, "auto", "fp16", "tensorrt", "8.6.0", True)
    assert record["route"] == "plugin" and sum(n.op_type == PLUGIN for n in fused.graph.node) == 4
    for args, fragment in [
        (("on", "fp16", "tensorrt_rtx", "1.7.1", False), "fuses skip-LayerNorm itself"),
        (("on", "fp16", "tensorrt", "8.6.0", False), "not in this TensorRT's plugin registry"),
        (("maybe", "fp16", "tensorrt", "8.6.0", True), "config key build.fuse_skip_layernorm"),
    ]:
        with pytest.raises(UserError, match=fragment):
            run(model, *args)
    attn, _ = fuse_attention(model, feeds, lambda c: attention_route("tensorrt", "8.6.1", 80, c.head_size, c.seq, c.causal), "x")
    gelu, _ = fuse_gelu(attn, feeds, observe_model=model)
    both, record = run(gelu, "on", "fp32", "tensorrt", "8.6.0", True)
    assert len(record["replaced"]) == 4 and record["route"] == "plugin"
    assert "replaced 4 residual LayerNorm(s)" in describe_skip_layernorm(record)[0]
    emulated = emulate_skip_layernorm_plugins(emulate_gelu_plugins(emulate_plugins(both, padded_head=32)))
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=7)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulated.SerializeToString()).run(feeds)
    assert all(rel_l2(got[k], v) < 3e-3 for k, v in want.items())


def test_cli_build_fuse_skip_layernorm_needs_tensorrt_8(zoo, tmp_path):
    from conftest import assert_user_error, require, run_cli

    require("tensorrt_rtx")
    onnx_path = zoo[("bert", "legacy")]
    proc = run_cli("build", str(onnx_path), "--precision", "fp16", "--fuse-skip-layernorm", "on", "-o", str(tmp_path / "b.engine"))
    assert_user_error(proc, "--fuse-skip-layernorm on cannot fuse", "fuses skip-LayerNorm itself")


def test_the_real_minilm_fp16_graph_has_every_residual_block_fused(minilm_clean):
    """All-MiniLM-L6-v2's real weights (hidden 384: the plugin's 256-thread kernel, fp16 sums, no epsilon): every block
    within the fp16 tolerance."""
    from trtforge.build.precision import prepare_for_build

    model = onnx.load(minilm_clean)
    specs, axes, _ = io_specs(minilm_clean, model)
    converted, _ = prepare_for_build(model, minilm_clean, specs, axes)
    _, report = fuse_skip_layernorm(converted, random_feeds(specs, {"batch": 2, "seq": 256}))
    assert len(report.replaced) == 12 and all(r["bias_folded"] and r["rel_l2"] < 3e-3 for r in report.replaced), report.to_json()
    assert [r["reason"] for r in report.refused] == [report.refused[0]["reason"]] and "differ in shape" in report.refused[0]["reason"]


def test_one_observation_serves_the_attention_gelu_and_skip_layernorm_passes(zoo, monkeypatch):
    """build observes the graph before fusion once for every pass (one ONNX Runtime session and run): the passes fed
    from it give the graph byte for byte that each observing on its own gives, and ask for nothing it lacks."""
    from types import SimpleNamespace

    from trtforge.backends.tensorrt import BuildOptions
    from trtforge.build.passes import shared_observation
    from trtforge.build.profiles import plan_profiles
    from trtforge.build.step import parse_tiers
    from trtforge.fusion.attention import fuse_attention
    from trtforge.fusion.gelu import fuse_gelu
    from trtforge.fusion.plugins import attention_route

    key = ("bert", "legacy")
    model = with_random_vectors(onnx.load(zoo[key]))
    specs, axes, _ = io_specs(zoo[key], model)
    route = lambda c: attention_route("tensorrt", "8.6.1", 80, c.head_size, c.seq, c.causal)  # noqa: E731
    monkeypatch.setattr("trtforge.backends.plugin_libraries.plugin_registered", lambda mod, name, version: True)
    profiles = plan_profiles(specs, axes, parse_tiers("seq=32", {}, axes, None, 3))
    observation = shared_observation(
        SimpleNamespace(flavour="tensorrt", version="8.6.0"), model, "fp16", BuildOptions(), specs, axes, profiles
    )
    feeds = observation.feeds
    assert all((v == 1).all() for k, v in feeds.items() if "mask" in k)
    alone = fuse_skip_layernorm(fuse_gelu(fuse_attention(model, feeds, route, "x")[0], feeds, observe_model=model)[0], feeds, model)[0]
    attn, _ = fuse_attention(model, {}, route, "x", observation=observation)
    gelu, _ = fuse_gelu(attn, {}, observe_model=model, observation=observation)
    shared, report = fuse_skip_layernorm(gelu, {}, model, observation=observation)
    assert observation.runs == 1 and len(report.replaced) == 4
    assert shared.SerializeToString() == alone.SerializeToString()
    # the build's off switches leave their passes' tensors out of the observation
    quiet = BuildOptions(fuse_attention="off", fuse_gelu="off", fuse_skip_layernorm="off")
    assert shared_observation(SimpleNamespace(flavour="tensorrt", version="8.6.0"), model, "fp16", quiet, specs, axes, profiles) is None
