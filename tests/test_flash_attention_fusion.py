"""The attention pass's TrtforgeFlashAttention route (trtforge/native/sdpa_plugin.cpp: cuDNN flash attention in a
TensorRT 8.6 plugin) on the zoo's real exports: which attentions it takes (encoders, GPT-2's causal attention, head
sizes TensorRT's own sm_90 kernels lack), and the plugin-library loading a build and a run depend on.

ORT cannot run the plugin: each plugin node is swapped for the attention its contract says it computes
(tests/attention_emulation.emulate_flash_plugins) and the result compared with the ORIGINAL graph on ORT, at a
batch and sequence length the pass never saw. The plugin itself runs on the H200 (benchmarks/gpu/session_w22.sh)."""

import numpy as np
import onnx
import pytest
from attention_emulation import emulate_flash_plugins, emulate_plugins, load_zoo
from conftest import export_zoo
from onnx import helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.errors import UserError
from trtforge.fusion.attention import fuse_attention
from trtforge.fusion.plugins import FLASH_PLUGIN, PLUGIN, attention_route
from trtforge.fusion.step import attention_fusion, describe
from trtforge.runtime.feeds import random_feeds

EXPORTS = [("bert", "legacy"), ("bert", "dynamo"), ("roberta", "legacy"), ("vit", "dynamo"), ("gpt2", "legacy"), ("gpt2", "dynamo")]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return export_zoo(tmp_path_factory.mktemp("flash"), EXPORTS)


def _load(zoo, key, seq=16):
    return load_zoo(zoo, key, seq)


def _flash_route(sm=90):
    return lambda c: attention_route("tensorrt", "8.6.1", sm, c.head_size, c.seq, c.causal, flash=True)


def _fuse(model, specs, sizes, sm=90, qkv_projection="conv"):
    return fuse_attention(model, random_feeds(specs, sizes), _flash_route(sm), "flash", qkv_projection=qkv_projection)


def _unseen_feeds(specs, sizes, axes, seed=7):
    if "seq" in sizes:
        sizes = dict(sizes, seq=min(23, axes["seq"].max))
    return random_feeds(specs, dict(sizes, batch=3), seed=seed)


def _assert_equal_on_ort(model, emulated, feeds, tol):
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulated.SerializeToString()).run(feeds)
    for name, value in want.items():
        rel = float(np.linalg.norm(got[name] - value) / np.linalg.norm(value))
        assert rel < tol, (name, rel)


def _flash_nodes(model):
    return [n for n in model.graph.node if n.op_type == FLASH_PLUGIN]


@pytest.mark.parametrize("qkv_projection", ["conv", "matmul"])
@pytest.mark.parametrize(
    "key", [("bert", "legacy"), ("bert", "dynamo"), ("roberta", "legacy"), ("vit", "dynamo")], ids=lambda k: ".".join(k)
)
def test_encoders_take_the_flash_plugin_on_sm90_and_equal_the_original(zoo, key, qkv_projection):
    """Head size 16, for which TensorRT 8.6 ships no sm_90 kernel, is fused by the flash plugin; the graph with the
    plugin's computation in its place equals the original at an unseen batch and length."""
    model, specs, axes, sizes = _load(zoo, key)
    fused, report = _fuse(model, specs, sizes, qkv_projection=qkv_projection)
    assert len(report.replaced) == 2 and not report.refused, report.to_json()
    assert {r["plugin"] for r in report.replaced} == {f"{FLASH_PLUGIN} v1"}
    nodes = _flash_nodes(fused)
    assert len(nodes) == 2 and not any(n.op_type in (PLUGIN, "Softmax") for n in fused.graph.node)
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attrs["plugin_version"] == b"1" and attrs["num_heads"] == 4 and attrs["hidden_size"] == 64
    assert attrs["causal"] == 0 and report.replaced[0]["scale"] == pytest.approx(0.25, rel=1e-6)  # the model's 1/sqrt(16)
    assert report.padding_allowed == (key[0] == "vit")
    _assert_equal_on_ort(model, emulate_flash_plugins(fused), _unseen_feeds(specs, sizes, axes), 1e-5)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_gpt2_causal_attention_takes_the_flash_plugin_with_its_causal_mask(zoo, exporter):
    """GPT-2's causal attention (refused without the plugin) becomes the causal flash plugin; its padding mask is
    gone, so the engine refuses padded rows."""
    model, specs, axes, sizes = _load(zoo, ("gpt2", exporter))
    fused, report = _fuse(model, specs, sizes)
    assert len(report.replaced) == 2 and not report.refused, report.to_json()
    assert all(r["causal"] for r in report.replaced)
    assert all({a.name: helper.get_attribute_value(a) for a in n.attribute}["causal"] == 1 for n in _flash_nodes(fused))
    assert not report.padding_allowed and report.mask_inputs == ["attention_mask"]
    feeds = _unseen_feeds(specs, sizes, axes)
    _assert_equal_on_ort(model, emulate_flash_plugins(fused), feeds, 1e-5)
    # A mutant plugin that ignores the causal mask is caught: the same graph with causal=0 differs.
    for node in _flash_nodes(fused):
        for a in node.attribute:
            if a.name == "causal":
                a.i = 0
    with pytest.raises(AssertionError):
        _assert_equal_on_ort(model, emulate_flash_plugins(fused), feeds, 1e-2)


def test_without_the_flash_plugin_gpt2_stays_refused_as_causal(zoo):
    model, specs, _, sizes = _load(zoo, ("gpt2", "legacy"))
    route = lambda c: attention_route("tensorrt", "8.6.1", 90, c.head_size, c.seq, c.causal)  # noqa: E731
    fused, report = fuse_attention(model, random_feeds(specs, sizes), route, "v2")
    assert not report.replaced and all("causal" in r["reason"] and FLASH_PLUGIN in r["reason"] for r in report.refused)
    assert fused.graph.node == model.graph.node


def test_fp16_converted_graph_takes_the_flash_plugin(zoo):
    """What build hands the pass on 8.6 for --precision fp16: within the fp16 gate of the fp32 original."""
    from trtforge.build.precision import prepare_for_build

    key = ("bert", "dynamo")
    model, specs, axes, sizes = _load(zoo, key)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    fused, report = _fuse(converted, specs, sizes)
    assert len(report.replaced) == 2 and not report.refused, report.to_json()
    emulated = emulate_flash_plugins(fused, dtype=onnx.TensorProto.FLOAT16)
    feeds = _unseen_feeds(specs, sizes, axes, seed=5)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulated.SerializeToString()).run(feeds)
    for name, value in want.items():
        cos = float(np.sum(got[name] * value) / (np.linalg.norm(got[name]) * np.linalg.norm(value)))
        assert cos > 0.999, (name, cos)


def test_the_v2_emulation_of_a_flash_graph_is_wrong_so_the_contracts_differ(zoo):
    """The flash graph keeps Q's weights unscaled (the plugin applies the model's scale): read with v2's contract
    (scale 1/sqrt(padded head) and nothing else), it no longer equals the original. Guards the q_factor choice."""
    model, specs, axes, sizes = _load(zoo, ("bert", "legacy"))
    fused, _ = _fuse(model, specs, sizes)
    for node in _flash_nodes(fused):  # rename to the v2 op and give it v2's four inputs
        node.op_type = PLUGIN
        node.input.extend([node.input[1], node.input[1]])
    with pytest.raises(AssertionError):
        _assert_equal_on_ort(model, emulate_plugins(fused, padded_head=32), _unseen_feeds(specs, sizes, axes), 1e-2)


def test_flash_route_table():
    flash = lambda sm, head, seq=512, causal=False: attention_route("tensorrt", "8.6.1", sm, head, seq, causal, flash=True)  # noqa: E731
    r = flash(90, 64)
    assert (r.kind, r.plugin, r.padded_head) == ("plugin", FLASH_PLUGIN, 64)
    assert flash(90, 32).plugin == FLASH_PLUGIN  # MiniLM: v2 has no head-32 sm_90 kernel
    assert flash(90, 64, seq=4096).plugin == FLASH_PLUGIN  # no 512 limit
    assert flash(90, 64, causal=True).plugin == FLASH_PLUGIN
    assert flash(80, 128).plugin == FLASH_PLUGIN
    # Where the flash plugin cannot go, v2's own rules decide.
    assert flash(75, 64).plugin == PLUGIN and flash(75, 64).kind == "plugin"  # Turing: v2's kernel
    assert flash(90, 12).kind == "none" and "head size 12" in flash(90, 12).reason
    assert flash(90, 160).kind == "none"
    assert flash(75, 64, causal=True).kind == "none" and "sm_80" in flash(75, 64, causal=True).reason
    assert attention_route("tensorrt_rtx", "1.7.0", 90, 64, 512, False, flash=True).kind == "native"


def test_build_step_with_only_the_flash_plugin_registered(zoo):
    model, specs, _, sizes = _load(zoo, ("bert", "legacy"))
    feeds = random_feeds(specs, sizes)
    fused, rec = attention_fusion(model, "auto", "fp16", "tensorrt", "8.6.1", "9.0", False, feeds, "m.onnx", flash_registered=True)
    assert fused is not None and len(rec["replaced"]) == 2 and rec["plugins"] == [f"{FLASH_PLUGIN} v1"]
    assert FLASH_PLUGIN in rec["why"] and f"by {FLASH_PLUGIN} v1" in "\n".join(describe(rec))
    # Without either plugin, `on` fails loudly and names both.
    with pytest.raises(UserError, match=f"{PLUGIN}.*{FLASH_PLUGIN}"):
        attention_fusion(model, "on", "fp16", "tensorrt", "8.6.1", "9.0", False, feeds, "m.onnx")
    # v2 alone on sm_90 with head 16: refused with both plugins' reasons.
    _, rec = attention_fusion(model, "auto", "fp16", "tensorrt", "8.6.1", "9.0", True, feeds, "m.onnx")
    assert not rec["replaced"] and all("sm_90" in r["reason"] for r in rec["refused"])


def test_v2_route_kept_when_flash_is_registered_but_v2_is_not_and_flash_cannot_take_it(zoo):
    """sm_75 (no cuDNN flash attention) with only the flash plugin loaded: refused, saying why neither applies."""
    model, specs, _, sizes = _load(zoo, ("bert", "legacy"))
    _, rec = attention_fusion(
        model, "auto", "fp16", "tensorrt", "8.6.1", "7.5", False, random_feeds(specs, sizes), "m.onnx", flash_registered=True
    )
    assert not rec["replaced"] and all(
        "not in this TensorRT's plugin registry" in r["reason"] and "sm_80" in r["reason"] for r in rec["refused"]
    )


@pytest.mark.parametrize(
    "key", [("bert", "legacy"), ("bert", "dynamo"), ("roberta", "legacy"), ("vit", "dynamo")], ids=lambda k: ".".join(k)
)
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_flash_nodes_share_one_sequence_tensor(zoo, key, fp16):
    """Every layer's flash node reads the first one's [S] tensor (one fill kernel in the engine, not one per layer),
    in the graph build hands the pass too (fp16-converted: no value_info left, so shape inference cannot tell; the
    graph between the layers does). The graph still equals the original (emulated)."""
    from trtforge.build.precision import prepare_for_build

    model, specs, axes, sizes = _load(zoo, key)
    graph = prepare_for_build(model, zoo[key], specs, axes)[0] if fp16 else model
    fused, report = _fuse(graph, specs, sizes)
    nodes = _flash_nodes(fused)
    assert len(nodes) == 2 and len({n.input[1] for n in nodes}) == 1, [n.input[1] for n in nodes]
    assert sum(n.op_type == "Range" and n.name.endswith("max_seqlen64") for n in fused.graph.node) == 1
    assert {r["seq_input"] for r in report.replaced} == {nodes[0].input[1]}
    emulated = emulate_flash_plugins(fused, dtype=onnx.TensorProto.FLOAT16) if fp16 else emulate_flash_plugins(fused)
    _assert_equal_on_ort(model, emulated, _unseen_feeds(specs, sizes, axes), 1e-2 if fp16 else 2e-3)


def test_gpt2_flash_nodes_keep_their_own_sequence_tensor(zoo):
    """GPT-2's layers meet through its Conv1D's Reshapes (a Gemm on [B*S, E]): nothing proves their lengths equal, so
    each flash node keeps its own [S] tensor."""
    model, specs, axes, sizes = _load(zoo, ("gpt2", "legacy"))
    fused, _ = _fuse(model, specs, sizes)
    assert len({n.input[1] for n in _flash_nodes(fused)}) == 2


def test_same_leading_dims_needs_every_path_to_keep_them():
    from onnx import TensorProto, numpy_helper

    from trtforge.fusion.attention import same_leading_dims
    from trtforge.fusion.index import GraphIndex

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 4])
    inits = [
        numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
        numpy_helper.from_array(np.ones(4, np.float32), "b"),
        numpy_helper.from_array(np.ones((1, 2, 4), np.float32), "b3"),
        numpy_helper.from_array(np.array([0, -1, 4]), "shape"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node("Add", ["h", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "b", "b"], ["ln"]),
        helper.make_node("Reshape", ["ln", "shape"], ["flat"]),
        helper.make_node("Add", ["ln", "flat"], ["mixed"]),
        helper.make_node("Add", ["ln", "b3"], ["wide"]),
        helper.make_node("LayerNormalization", ["r", "b", "b"], ["ln0"], axis=0),
    ]
    g = GraphIndex(
        helper.make_model(
            helper.make_graph(
                nodes, "g", [x], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("mixed", "wide", "ln0")], inits
            )
        )
    )
    assert same_leading_dims(g, "ln", {"x"})
    assert not same_leading_dims(g, "mixed", {"x"})  # one path goes through a Reshape
    assert not same_leading_dims(g, "wide", {"x"})  # a 3-D constant can broadcast the leading axes
    assert not same_leading_dims(g, "ln0", {"x"})  # normalized over axis 0
    assert not same_leading_dims(g, "ln", {"y"})  # paths that never reach the group
