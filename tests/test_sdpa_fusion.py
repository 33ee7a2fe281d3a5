"""The attention pass's SDPA-core form (trtforge/fusion/sdpa.py -> TrtforgeFlashAttention v2): attentions whose Q, K, V
are no projections of one tensor (rotary positions after the projection), grouped-query K/V, sliding windows,
position biases and KV caches, on the zoo's small exports.

ORT cannot run the plugin: each v2 node is swapped for the attention its contract says cuDNN computes
(tests/attention_emulation.emulate_flash_core_plugins) and the result compared with the ORIGINAL graph on ORT at a
batch, sequence (and past) length the pass never saw."""

import numpy as np
import onnx
import pytest
from attention_emulation import emulate_flash_core_plugins, load_zoo
from conftest import ROOT, export_zoo, require
from onnx import helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.fusion.attention import fuse_attention
from trtforge.fusion.plugins import FLASH_PLUGIN, attention_route
from trtforge.fusion.sdpa import NO_BOUND, band, band_mask
from trtforge.runtime.feeds import random_feeds

EXPORTS = [("modernbert", "legacy"), ("qwen2", "legacy"), ("t5-encoder", "legacy"), ("mpnet", "legacy")]
KV_EXPORTS = ["gpt2-kv", "llama-kv"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    import os

    from trtforge.core.config import load_config
    from trtforge.export.kvcache import export_kv
    from trtforge.graph.index import clean_file

    folder = tmp_path_factory.mktemp("sdpa")
    paths = export_zoo(folder, EXPORTS)
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        for name in KV_EXPORTS:
            cfg = load_config(ROOT / "zoo" / "configs" / f"{name}.yaml")
            raw = folder / f"{name}.kv.onnx"
            export_kv(cfg, raw, check=False)
            paths[(name, "kv")] = clean_file(raw, folder / "clean" / raw.name, tolerance=cfg.clean.tolerance).path
    finally:
        os.chdir(before)
    return paths


def _flash(c):
    return attention_route("tensorrt", "8.6.1", 90, c.head_size, c.seq, c.causal, flash=True)


def _core_nodes(model):
    return [n for n in model.graph.node if n.op_type == FLASH_PLUGIN]


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _fused(zoo, key):
    model, specs, axes, sizes = load_zoo(zoo, key)
    fused, report = fuse_attention(model, random_feeds(specs, sizes), _flash, "flash")
    return model, fused, report, specs, axes, sizes


def _max_rel(model, emulated, specs, axes, sizes):
    """The largest rel-L2 between the original and the emulated graph over every output, at batch 3, seq 23 (and a
    past of 300 where the graph has one): sizes the pass never saw."""
    unseen = dict(sizes, batch=3)
    for axis, size in (("seq", 23), ("past", 300)):
        if axis in unseen:
            unseen[axis] = min(size, axes[axis].max)
    feeds = random_feeds(specs, unseen, seed=11)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulated.SerializeToString()).run(feeds)
    return max(float(np.linalg.norm(got[n].astype(np.float64) - v) / max(np.linalg.norm(v), 1e-30)) for n, v in want.items())


# (zoo key, kv heads, the band in words per attention, bias input)
FAMILIES = [
    (("modernbert", "legacy"), 4, ["none", "window -4..+4", "window -4..+4"], False),
    (("qwen2", "legacy"), 2, ["causal", "causal"], False),
    (("t5-encoder", "legacy"), 4, ["none", "none"], True),
    (("mpnet", "legacy"), 4, ["none", "none"], True),
    (("gpt2-kv", "kv"), 4, ["causal (bottom-right)"] * 2, False),
    (("llama-kv", "kv"), 2, ["causal (bottom-right)"] * 2, False),
]


@pytest.mark.parametrize("key,kv_heads,masks,bias", FAMILIES, ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_every_attention_is_fused_as_separate_qkv_and_equals_the_original(zoo, key, kv_heads, masks, bias):
    """ModernBERT (rotary, sliding window), Qwen2 and LLaMA (rotary, grouped-query K/V), T5 and MPNet (relative-position
    bias), GPT-2 and LLaMA over a KV cache (query length != key length): every attention becomes one v2 node with
    the right band, head counts and bias, no Softmax is left, and the graph with the plugin's computation in place
    equals the original at an unseen batch, length and past."""
    model, fused, report, specs, axes, sizes = _fused(zoo, key)
    assert not report.refused and [r["mask"] for r in report.replaced] == masks, report.to_json()
    assert all(r["plugin"] == f"{FLASH_PLUGIN} v2" and r["kv_heads"] == kv_heads and r["bias"] == bias for r in report.replaced)
    nodes = _core_nodes(fused)
    assert len(nodes) == len(masks) and not any(n.op_type == "Softmax" for n in fused.graph.node)
    assert all(len(n.input) == 3 + bias and _attrs(n)["kv_heads"] == kv_heads for n in nodes)
    assert _max_rel(model, emulate_flash_core_plugins(fused), specs, axes, sizes) < 5e-3


@pytest.mark.parametrize("key", [("qwen2", "legacy"), ("llama-kv", "kv")], ids=lambda k: k[0])
def test_grouped_query_repeat_is_not_materialised(zoo, key):
    """K and V reach the plugin with their own (fewer) heads: the Unsqueeze -> Expand -> Reshape repeats are gone."""
    from trtforge.fusion.index import GraphIndex

    model, fused, *_ = _fused(zoo, key)
    g = GraphIndex(fused)
    for node in _core_nodes(fused):
        for t in node.input[1:3]:
            while g.producer[t].op_type == "Cast":
                t = g.producer[t].input[0]
            repeat = g.producer[t]
            assert not (repeat.op_type == "Reshape" and g.producer[repeat.input[0]].op_type == "Expand"), repeat.name
        assert _attrs(node)["kv_heads"] < _attrs(node)["num_heads"]


@pytest.mark.parametrize(
    "key,field,value",
    [
        (("modernbert", "legacy"), "left_bound", NO_BOUND),
        (("gpt2-kv", "kv"), "alignment", 0),
        (("qwen2", "legacy"), "right_bound", NO_BOUND),
    ],
    ids=["window-dropped", "top-left-over-a-cache", "causal-dropped"],
)
def test_a_wrong_band_is_caught_by_the_comparison(zoo, key, field, value):
    """A plugin that read the band wrongly (no window, top-left over a cache, no causal mask) would differ: the
    comparison above can fail."""
    model, fused, _, specs, axes, sizes = _fused(zoo, key)
    for node in _core_nodes(fused):
        for a in node.attribute:
            if a.name == field:
                a.i = value
    assert _max_rel(model, emulate_flash_core_plugins(fused), specs, axes, sizes) > 1e-2


def test_without_the_flash_plugin_the_core_form_is_refused_with_both_reasons(zoo):
    model, specs, _, sizes = load_zoo(zoo, ("modernbert", "legacy"))
    route = lambda c: attention_route("tensorrt", "8.6.1", 90, c.head_size, c.seq, c.causal)  # noqa: E731
    fused, report = fuse_attention(model, random_feeds(specs, sizes), route, "v2")
    assert not report.replaced and len(report.refused) == 3
    assert all("as separate Q, K, V" in r["reason"] and "TrtforgeFlashAttention v2" in r["reason"] for r in report.refused), report.refused
    assert fused.graph.node == model.graph.node


def test_fp16_converted_modernbert_is_fused_within_the_fp16_gate(zoo):
    """What build hands the pass on 8.6 for --precision fp16."""
    from trtforge.build.precision import prepare_for_build

    key = ("modernbert", "legacy")
    model, specs, axes, sizes = load_zoo(zoo, key)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    fused, report = fuse_attention(converted, random_feeds(specs, sizes), _flash, "flash")
    assert len(report.replaced) == 3 and not report.refused, report.to_json()
    assert _max_rel(model, emulate_flash_core_plugins(fused), specs, axes, sizes) < 1e-2


def test_band_reads_causal_bottom_right_and_windows():
    s = 6
    causal = np.tril(np.ones((s, s), bool))
    assert band(causal) == (0, NO_BOUND, 0)
    assert band(np.ones((s, s), bool)) == (0, NO_BOUND, NO_BOUND)
    window = np.abs(np.arange(s)[:, None] - np.arange(s)[None, :]) <= 2
    assert band(window) == (0, 3, 2)
    causal_window = causal & ~np.tril(np.ones((s, s), bool), -3)  # the 3 keys up to the query
    assert band(causal_window) == (0, 3, 0)
    cache = np.tril(np.ones((2, 5), bool), 3)  # 2 new queries over 3 cached + 2 new keys
    assert band(cache) == (1, NO_BOUND, 0)
    for alignment, left, right in [(0, 3, 2), (1, NO_BOUND, 0), (0, 3, 0)]:
        keep = band_mask(s, s + alignment * 3, alignment, left, right)
        assert band(keep)[1:] == (left, right)
    scattered = causal.copy()
    scattered[4, 1] = False  # a hole inside the band
    assert band(scattered) is None
    empty_row = causal.copy()
    empty_row[0, 0] = False
    assert band(empty_row) is None


def _hand_attention(mask: np.ndarray) -> onnx.ModelProto:
    """softmax(q kᵀ / 4 + mask) v on graph inputs q, k, v [1, 2, 6, 16] and a constant additive mask [1, 2, 6, 6]."""
    from onnx import TensorProto, numpy_helper

    x = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 6, 16])  # noqa: E731
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "quarter"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "shape"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.25, np.float32), "quarter"),
        numpy_helper.from_array(mask.astype(np.float32), "mask"),
        numpy_helper.from_array(np.array([1, 6, 32], np.int64), "shape"),
    ]
    graph = helper.make_graph(nodes, "attn", [x("q"), x("k"), x("v")], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_mask_that_differs_between_heads_is_refused_and_a_bias_is_taken():
    rng = np.random.default_rng(0)
    feeds = {n: rng.normal(size=(1, 2, 6, 16)).astype(np.float32) for n in "qkv"}
    causal = np.where(np.tril(np.ones((6, 6), bool)), 0.0, -np.inf)
    per_head = np.stack([causal, causal.T])[None]  # head 1 looks the other way
    _, report = fuse_attention(_hand_attention(per_head), feeds, _flash, "flash")
    assert not report.replaced and "differ between rows or heads" in report.refused[0]["reason"], report.to_json()
    alibi = -np.abs(np.arange(6)[:, None] - np.arange(6)[None, :])[None, None] * np.array([0.5, 0.25])[None, :, None, None]
    model = _hand_attention(alibi + causal)
    fused, report = fuse_attention(model, feeds, _flash, "flash")
    assert [(r["mask"], r["bias"]) for r in report.replaced] == [("causal", True)], report.to_json()
    want = OrtRunner(model.SerializeToString()).run(feeds)["y"]
    got = OrtRunner(emulate_flash_core_plugins(fused).SerializeToString()).run(feeds)["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-3


@pytest.mark.parametrize(
    "key,attentions",
    [(("modernbert", "legacy"), 3), (("qwen2", "legacy"), 2), (("mpnet", "legacy"), 2)],
    ids=lambda v: v[0] if isinstance(v, tuple) else None,
)
def test_a_tensorrt_rtx_build_states_how_many_attentions_it_fused(zoo, key, attentions, tmp_path):
    """The build's first attention line and its sidecar give 'fused N of M', N counted in the engine's layers (what
    TensorRT-RTX fused itself: the native route leaves the graph as it is)."""
    require("tensorrt_rtx")
    from trtforge.build.clock import overhead_line
    from trtforge.build.step import build
    from trtforge.fusion.step import describe

    result = build(zoo[key], tmp_path / "m.engine", "fp16", None, backend="tensorrt_rtx")
    record = result.sidecar["attention_fusion"]
    engine = record["engine"]
    assert len(record["attentions"]) == attentions and engine["known"], record
    assert 0 <= engine["fused"] <= attentions
    assert describe(record, "fp16")[0] == f"attention: fused {engine['fused']} of {attentions} (counted in the engine's layers)"
    # The build's own time against TensorRT's: every step timed, the build output's line made from the sidecar.
    overhead = result.sidecar["build_overhead"]
    # TensorRT's time: its engine build plus its builder, parser and config (parse_seconds), not trtforge's
    assert overhead["tensorrt_parse_seconds"] > 0
    assert overhead["tensorrt_seconds"] == pytest.approx(result.sidecar["build_seconds"] + overhead["tensorrt_parse_seconds"], abs=2e-3)
    assert {"precision conversion", "attention pass", "layer inspection"} <= set(overhead["steps"])
    assert overhead["trtforge_seconds"] == pytest.approx(sum(overhead["steps"].values()), abs=0.01)
    assert overhead_line(overhead).startswith(f"build time: trtforge {overhead['trtforge_seconds']:.1f} s, TensorRT ")
