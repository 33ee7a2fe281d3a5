"""The attention fusion pass (issue 11) on the zoo's real exports: what it takes, what it refuses and why.

ORT cannot run TensorRT's plugin, so a fused graph is proven on CPU by swapping each plugin node for the
attention the plugin computes (tests/attention_emulation.py) and comparing with the ORIGINAL graph on ORT,
at a sequence length the pass never saw. The engine itself is proven on the H200 (benchmarks/gpu/attention_h200.sh).
"""

import json

import numpy as np
import onnx
import pytest
from attention_emulation import emulate_plugins, load_zoo, with_random_vectors
from conftest import assert_user_error, export_zoo, require, run_cli
from onnx import helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.errors import UserError
from trtforge.fusion.attention import Projection, find_candidates, fuse_attention, pack_qkv, reference_attention, refuse_padding
from trtforge.fusion.plugins import PLUGIN, attention_route, backend_route
from trtforge.fusion.step import attention_fusion, describe, sm_of
from trtforge.runtime.feeds import random_feeds

EXPORTS = [
    ("bert", "legacy"),
    ("bert", "dynamo"),
    ("roberta", "legacy"),
    ("vit", "legacy"),
    ("vit", "dynamo"),
    ("gpt2", "legacy"),
    ("gpt2", "dynamo"),
]
# More architectures with attention written their own way: DistilBERT and CLIP's vision tower (the plugin takes them),
# DeBERTa-v3's disentangled attention, T5's relative-position bias and Swin's window bias and shift mask (it must not).
MORE = [("distilbert", "legacy"), ("clip-vision", "legacy"), ("deberta", "legacy"), ("t5-encoder", "legacy"), ("swin", "legacy")]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Each small zoo model exported once per exporter and cleaned, as `trtforge build` would receive it."""
    return export_zoo(tmp_path_factory.mktemp("attn"), EXPORTS + MORE)


def _load(zoo, key, seq=16):
    return load_zoo(zoo, key, seq)


def _fuse(model, sizes, specs, sm, qkv_projection="matmul"):
    feeds = random_feeds(specs, sizes)
    return fuse_attention(
        model,
        feeds,
        lambda c: attention_route("tensorrt", "8.6.1", sm, c.head_size, c.seq, c.causal),
        "8.6 plugin",
        qkv_projection=qkv_projection,
    )


# "conv": the packed QKV projection as a 1x1 Conv on [tokens, E, 1, 1] (build --qkv-projection conv).
PROJECTIONS = ["matmul", "conv"]


@pytest.mark.parametrize(
    "key,qkv_projection",
    [(k, "matmul") for k in EXPORTS if k[0] != "gpt2"] + [(("bert", "legacy"), "conv"), (("vit", "dynamo"), "conv")],
    ids=lambda k: ".".join(k) if isinstance(k, tuple) else k,
)
def test_encoder_attention_is_fused_and_equals_the_original(zoo, key, qkv_projection):
    """BERT, RoBERTa, ViT (SDPA from both exporters): every attention replaced by one plugin node; the plugin's
    computation on the packed weights equals the original graph at an unseen sequence length."""
    model, specs, axes, sizes = _load(zoo, key)
    fused, report = _fuse(model, sizes, specs, sm=80, qkv_projection=qkv_projection)  # sm_80: head-32 kernels (the zoo's head is 16)
    assert sum(n.op_type == "Conv" and n.name.startswith("fused_attention") for n in fused.graph.node) == (2 * (qkv_projection == "conv"))
    softmaxes = sum(n.op_type == "Softmax" for n in model.graph.node)
    assert len(report.replaced) == softmaxes == 2 and not report.refused, report.to_json()
    assert not any(n.op_type == "Softmax" for n in fused.graph.node)
    plugins = [n for n in fused.graph.node if n.op_type == PLUGIN]
    attrs = {a.name: helper.get_attribute_value(a) for a in plugins[0].attribute}
    assert attrs["plugin_version"] == b"2" and attrs["var_seqlen"] == 1 and attrs["num_heads"] == 4 and attrs["hidden_size"] == 64
    assert report.padding_allowed == (key[0] == "vit") and report.mask_inputs == ([] if key[0] == "vit" else ["attention_mask"])

    _assert_equals_the_original_at_an_unseen_size(model, fused, specs, axes, sizes)


def _assert_equals_the_original_at_an_unseen_size(model, fused, specs, axes, sizes):
    """The fused graph, its plugins emulated, against the original on ORT at batch 3 and (text) sequence 23."""
    emulated = emulate_plugins(fused, padded_head=32)
    if "seq" in sizes:
        sizes = dict(sizes, seq=min(23, axes["seq"].max))
    feeds = random_feeds(specs, dict(sizes, batch=3), seed=7)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulated.SerializeToString()).run(feeds)
    for name, value in want.items():
        rel = np.linalg.norm(got[name] - value) / np.linalg.norm(value)
        assert rel < 1e-5, (name, rel)


@pytest.mark.parametrize("qkv_projection", PROJECTIONS)
@pytest.mark.parametrize("key", [("bert", "dynamo"), ("vit", "legacy")], ids=lambda k: ".".join(k))
def test_fp16_converted_graph_is_fused(zoo, key, qkv_projection):
    """What build actually hands the pass on 8.6: trtforge's fp16 conversion (fp16 weights, Casts around the
    ops kept fp32, the mask Add fed through a Cast). The fused graph stays within the fp16 gate of the fp32 original."""
    from trtforge.build.precision import prepare_for_build

    model, specs, axes, sizes = _load(zoo, key)
    converted, _ = prepare_for_build(model, zoo[key], specs, axes)
    fused, report = _fuse(converted, sizes, specs, sm=80, qkv_projection=qkv_projection)
    assert len(report.replaced) == 2 and not report.refused, report.to_json()
    emulated = emulate_plugins(fused, padded_head=32, dtype=onnx.TensorProto.FLOAT16)
    feeds = random_feeds(specs, dict(sizes, batch=3), seed=5)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    got = OrtRunner(emulated.SerializeToString()).run(feeds)
    for name, value in want.items():
        cos = float(np.sum(got[name] * value) / (np.linalg.norm(got[name]) * np.linalg.norm(value)))
        assert cos > 0.999, (name, cos)


def _quantized(model, specs, sizes, quantize_attention=False):
    """calibrate's Q/DQ insertion on max-abs scales from one ORT run (the placement and insertion are the real ones)."""
    from trtforge.calibrate.placement import plan_quantization
    from trtforge.calibrate.quantize import insert_qdq
    from trtforge.graph.index import expose_tensors

    plan = plan_quantization(model, None, quantize_attention)
    names = plan.activation_tensors({t.node for t in plan.targets})
    feeds = random_feeds(specs, dict(sizes, batch=4), seed=3)
    seen = OrtRunner(expose_tensors(model, names, typed=False).SerializeToString()).run(feeds, names)
    return insert_qdq(model, plan, {k: float(np.abs(v).max()) for k, v in seen.items()})


@pytest.mark.parametrize("qkv_projection", PROJECTIONS)
@pytest.mark.parametrize("key", [("bert", "legacy"), ("bert", "dynamo")], ids=lambda k: ".".join(k))
def test_int8_projections_become_one_int8_qkv_gemm(zoo, key, qkv_projection):
    """calibrate's Q/DQ graph: each attention's Q, K, V INT8 projections become one INT8 GEMM (the packed weight
    behind its own Q/DQ, the per-channel scales re-packed with the scale folded into Q's). In fp32 the fused graph
    computes exactly what the Q/DQ graph does: the same int8 values, only their scales moved."""
    from trtforge.calibrate.quantize import int8_gemm_nodes

    model, specs, axes, sizes = _load(zoo, key)
    qdq = _quantized(model, specs, sizes)
    fused, report = _fuse(qdq, sizes, specs, sm=80, qkv_projection=qkv_projection)
    assert len(report.replaced) == 2 and not report.refused, report.to_json()
    int8 = int8_gemm_nodes(fused)
    assert {f"fused_attention_{i}/qkv_{qkv_projection}" for i in range(2)} <= int8
    assert len(int8) == len(int8_gemm_nodes(qdq)) - 4  # three projections became one, twice
    feeds = random_feeds(specs, dict(sizes, batch=3, seq=min(23, axes["seq"].max)), seed=5)
    want = OrtRunner(qdq.SerializeToString()).run(feeds)
    got = OrtRunner(emulate_plugins(fused, padded_head=32).SerializeToString()).run(feeds)
    for name, value in want.items():
        assert float(np.linalg.norm(got[name] - value) / np.linalg.norm(value)) < 1e-5, name


@pytest.mark.parametrize("qkv_projection", PROJECTIONS)
def test_int8_best_graph_is_fused(zoo, qkv_projection):
    """What `build --precision best` hands the pass on 8.6: fp16 outside the INT8 GEMMs, whose Q/DQ stay fp32.
    Against the fp32 original the fused graph is about as close as the unfused one (fp16 rounding moves a few
    int8 values either way: the small zoo's activations quantize coarsely, 0.06-0.12 rel-L2 for both)."""
    from trtforge.build.precision import prepare_for_build

    key = ("bert", "dynamo")
    model, specs, axes, sizes = _load(zoo, key)
    best, _ = prepare_for_build(_quantized(model, specs, sizes), zoo[key], specs, axes)
    fused, report = _fuse(best, sizes, specs, sm=80, qkv_projection=qkv_projection)
    assert len(report.replaced) == 2 and not report.refused, report.to_json()
    emulated = emulate_plugins(fused, padded_head=32, dtype=onnx.TensorProto.FLOAT16)
    feeds = random_feeds(specs, dict(sizes, batch=3, seq=min(23, axes["seq"].max)), seed=5)
    ref, unfused, got = (OrtRunner(m.SerializeToString()).run(feeds) for m in (model, best, emulated))
    for name, value in ref.items():
        rel = lambda out: float(np.linalg.norm(out[name] - value) / np.linalg.norm(value))  # noqa: E731
        assert rel(got) <= 1.5 * rel(unfused) + 0.01, (name, rel(got), rel(unfused))  # a wrong graph is off by O(1)


def test_quantized_attention_matmuls_are_refused_with_their_reason(zoo):
    model, specs, axes, sizes = _load(zoo, ("bert", "legacy"))
    _, report = _fuse(_quantized(model, specs, sizes, quantize_attention=True), sizes, specs, sm=80)
    assert not report.replaced and len(report.refused) == 2
    assert all("--quantize-attention" in r["reason"] for r in report.refused), report.refused
    # The build's record keeps them apart, so an engine that leaves them unfused is said to, not warned about.
    from trtforge.fusion.engine_evidence import attention_evidence, evidence_lines, shortfall_warning
    from trtforge.fusion.step import attention_fusion

    qdq = _quantized(model, specs, sizes, quantize_attention=True)
    _, record = attention_fusion(qdq, "auto", "best", "tensorrt", "8.6.1", "8.0", True, random_feeds(specs, sizes), "m.onnx")
    assert record["route"] == "plugin" and len(record["attentions"]) == len(record["quantized_attentions"]) == 2
    record["engine"] = attention_evidence(record, [{"Name": "/MatMul", "LayerType": "gemm"}], profiles=1)
    assert shortfall_warning(record, "best", "m.engine") is None
    assert "2 of them quantized by calibrate --quantize-attention, left unfused on purpose" in evidence_lines(record, "best")[0]
    record["quantized_attentions"] = record["quantized_attentions"][:1]  # one owed and missing: warned
    assert "not all of the graph's 2 attention(s)" in shortfall_warning(record, "best", "m.engine")


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_causal_attention_is_refused_with_its_reason(zoo, exporter):
    model, specs, _, sizes = _load(zoo, ("gpt2", exporter))
    fused, report = _fuse(model, sizes, specs, sm=80)
    assert not report.replaced and len(report.refused) == 2
    assert all("causal" in r["reason"] for r in report.refused), report.refused
    assert fused.graph.node == model.graph.node


@pytest.mark.parametrize("key", [("distilbert", "legacy"), ("clip-vision", "legacy")], ids=lambda k: k[0])
def test_more_encoders_are_fused_and_equal_the_original(zoo, key):
    """Biases and norms redrawn (random-init starts them at 0 and 1), so that the packed Q/K/V biases are checked too."""
    model, specs, axes, sizes = _load(zoo, key)
    model = with_random_vectors(model)
    fused, report = _fuse(model, sizes, specs, sm=80)
    assert len(report.replaced) == 2 and not report.refused, report.to_json()
    _assert_equals_the_original_at_an_unseen_size(model, fused, specs, axes, sizes)


@pytest.mark.parametrize("key,count", [(("t5-encoder", "legacy"), 2), (("swin", "legacy"), 4)], ids=["t5-encoder", "swin"])
def test_position_bias_attentions_are_refused_with_their_reason(zoo, key, count):
    """T5's relative-position bias and Swin's window bias (and shift mask) are added to the scores; the plugin adds
    none, so each attention is refused, saying why, and still counted as an attention (what a native route owes)."""
    model, specs, _, sizes = _load(zoo, key)
    fused, report = _fuse(model, sizes, specs, sm=80)
    assert not report.replaced and len(report.refused) == count, report.to_json()
    assert all("varies across the keys" in r["reason"] and "no padding mask" in r["reason"] for r in report.refused), report.refused
    assert sum(c.attention for c in find_candidates(model)) == count
    assert fused.graph.node == model.graph.node


def test_deberta_disentangled_attention_is_counted_and_refused(zoo):
    """DeBERTa-v3 adds content-to-position and position-to-content terms to Q·Kᵀ on [B*N, S, S] scores and reshapes
    them to [B, N, S, S] only for the mask: counted as an attention (TensorRT-RTX fuses it), refused by the plugin route."""
    model, specs, _, sizes = _load(zoo, ("deberta", "legacy"))
    assert [c.attention for c in find_candidates(model)] == [True, True]
    fused, report = _fuse(model, sizes, specs, sm=80)
    assert not report.replaced and all("not [batch, heads, seq, seq]" in r["reason"] for r in report.refused), report.refused
    assert fused.graph.node == model.graph.node


def test_head_size_without_sm90_kernel_is_refused(zoo):
    """The small zoo's head size 16 pads to 32, for which TensorRT 8.6 ships no sm_90 kernel."""
    model, specs, _, sizes = _load(zoo, ("bert", "legacy"))
    _, report = _fuse(model, sizes, specs, sm=90)
    assert not report.replaced and all("head size 16" in r["reason"] and "sm_90" in r["reason"] for r in report.refused)


def test_sequence_beyond_the_plugin_limit_is_refused(zoo):
    model, specs, _, sizes = _load(zoo, ("bert", "legacy"))
    feeds = random_feeds(specs, sizes)
    _, report = fuse_attention(model, feeds, lambda c: attention_route("tensorrt", "8.6.1", 80, c.head_size, 1024, c.causal), "x")
    assert not report.replaced and all("512" in r["reason"] for r in report.refused)


def _attention_model(heads=2, head=4, hidden_order="NH", seed=0, score_term=None):
    """A hand-written attention X -> softmax(QKᵀ/sqrt(d))V -> [B, S, E]; hidden_order 'HN' splits the hidden
    axis the other way round (head-minor), which is still attention but not the layout the plugin packs;
    score_term: a constant [heads, S, S] added to the scores before the softmax (a position bias)."""
    rng = np.random.default_rng(seed)
    e = heads * head
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    split = [0, 0, heads, head] if hidden_order == "NH" else [0, 0, head, heads]
    perm = [0, 2, 1, 3] if hidden_order == "NH" else [0, 3, 1, 2]
    init("split", np.array(split, np.int64))
    for p in "qkv":
        init(f"w{p}", rng.standard_normal((e, e)).astype(np.float32))
        init(f"b{p}", rng.standard_normal(e).astype(np.float32))
        nodes += [
            helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}0"]),
            helper.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
            helper.make_node("Reshape", [f"{p}1", "split"], [f"{p}2"]),
            helper.make_node("Transpose", [f"{p}2"], [f"{p}3"], perm=perm),
        ]
    nodes += [
        helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q3", "kt"], ["qk"]),
        helper.make_node(
            "Div", ["qk", init("sqrt_d", np.array(np.sqrt(head), np.float32))], ["scores" if score_term is None else "scaled"]
        ),
    ]
    if score_term is not None:
        nodes.append(helper.make_node("Add", ["scaled", init("score_term", score_term.astype(np.float32))], ["scores"]))
    nodes += [
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v3"], ["ctx4"]),
        helper.make_node("Transpose", ["ctx4"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", init("merge", np.array([0, 0, e], np.int64))], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", e])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "seq", e])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _route_any(c):
    return attention_route("tensorrt", "8.6.1", 80, c.head_size, c.seq, c.causal)


def test_hand_written_attention_is_fused():
    model = _attention_model()
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    fused, report = fuse_attention(model, {"x": x}, _route_any, "x")
    assert len(report.replaced) == 1 and report.replaced[0]["heads"] == 2 and report.padding_allowed
    x2 = np.random.default_rng(2).standard_normal((3, 7, 8)).astype(np.float32)
    want = OrtRunner(model.SerializeToString()).run({"x": x2})["y"]
    got = OrtRunner(emulate_plugins(fused, 32).SerializeToString()).run({"x": x2})["y"]
    assert np.abs(got - want).max() < 1e-4


def test_a_small_position_bias_is_refused_however_close_the_context():
    """A bias small enough to keep the recomputed context within the numeric check's tolerance used to be fused and
    dropped (the review of 514a57a): the decision is on the added term itself. A term constant across the keys (a
    per-query shift, which the softmax ignores) is no reason to refuse."""
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    bias = np.random.default_rng(4).normal(0, 1e-4, (2, 5, 5))
    _, report = fuse_attention(_attention_model(score_term=bias), {"x": x}, _route_any, "x")
    assert not report.replaced and "varies across the keys" in report.refused[0]["reason"], report.to_json()
    _, report = fuse_attention(_attention_model(score_term=np.repeat(bias[..., :1], 5, axis=-1)), {"x": x}, _route_any, "x")
    assert len(report.replaced) == 1, report.to_json()


def test_a_score_term_varies_across_keys_where_a_query_attends():
    from trtforge.fusion.attention_verify import varies_across_keys

    s = 4
    padding = np.zeros((2, 1, 1, s))  # an additive padding mask on unpadded rows
    causal = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, 0.0)[None, None]
    window = np.where(np.eye(s, k=2, dtype=bool), -np.inf, 0.0)[None, None]  # a {0, -inf} window mask
    assert not varies_across_keys(padding) and not varies_across_keys(np.full((1, 2, s, s), -3.0))
    assert varies_across_keys(np.random.default_rng(0).normal(0, 1e-4, (1, 2, s, s)))  # a tiny position bias
    assert varies_across_keys(window) and varies_across_keys(causal)
    assert not varies_across_keys(causal, causal=True)  # above the diagonal a causal query attends to nothing
    assert varies_across_keys(causal + np.tril(np.arange(s * s).reshape(s, s)), causal=True)


def test_a_layout_the_pass_does_not_model_is_refused_not_fused_wrong():
    """Structurally the same chain, but heads split head-minor: the numeric check refuses it."""
    model = _attention_model(hidden_order="HN")
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    _, report = fuse_attention(model, {"x": x}, _route_any, "x")
    assert not report.replaced and "differs from the graph's" in report.refused[0]["reason"]


def test_a_classifier_softmax_is_not_attention():
    w = numpy_helper.from_array(np.ones((8, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"], axis=-1)],
        "cls",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [2, 3])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _, report = fuse_attention(model, {"x": np.ones((2, 8), np.float32)}, _route_any, "x")
    assert not report.replaced and "MatMul(probs, V)" in report.refused[0]["reason"]
    assert [c.attention for c in find_candidates(model)] == [False]  # nor what a native route expects fused


@pytest.mark.parametrize("scale,head,padded", [(0.125, 64, 64), (0.3, 48, 64), (1.0, 20, 32)])
def test_packed_weights_compute_the_same_attention(scale, head, padded):
    """Re-packing in numpy: the plugin's view of the packed QKV ([tokens, heads, 3, head], scale 1/sqrt(padded))
    equals the original attention with the model's own scale folded into Q."""
    rng = np.random.default_rng(0)
    heads, e_in = 3, 40
    e = heads * head
    proj = [Projection("x", rng.standard_normal((e_in, e)), rng.standard_normal(e), s) for s in (1.0, 0.5, 2.0)]
    x = rng.standard_normal((2, 6, e_in))
    want = reference_attention(x, *proj, heads, scale)
    w, b = pack_qkv(*proj, heads, q_factor=scale * np.sqrt(padded))
    packed = (x @ w + b).reshape(2, 6, heads, 3, head)
    q, k, v = (packed[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(padded)
    p = np.exp(s - s.max(-1, keepdims=True))
    got = ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(2, 6, e)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_route_table():
    assert backend_route("tensorrt_rtx", "1.7.0").kind == "native"
    assert backend_route("tensorrt", "10.3.0").kind == "native"
    assert attention_route("tensorrt", "8.6.1", 90, 64, 512, False).padded_head == 64
    assert attention_route("tensorrt", "8.6.1", 90, 64, 513, False).kind == "none"
    assert "causal" in attention_route("tensorrt", "8.6.1", 90, 64, 128, True).reason
    assert "sm_61" in attention_route("tensorrt", "8.6.1", 61, 64, 128, False).reason
    assert "head size 80" in attention_route("tensorrt", "8.6.1", 90, 80, 128, False).reason
    assert attention_route("tensorrt", "8.6.1", 80, 16, 128, False).padded_head == 32
    assert "unknown" in attention_route("tensorrt", "8.6.1", None, 64, 128, False).reason
    assert sm_of("9.0") == 90 and sm_of(None) is None


def test_build_step_modes():
    model = _attention_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)}
    fused, rec = attention_fusion(model, "off", "fp16", "tensorrt", "8.6.1", "8.0", True, feeds, "m.onnx")
    assert fused is None and rec["route"] == "off" and not rec["replaced"]
    assert len(rec["attentions"]) == 1  # whatever the route: what the engine is checked against
    fused, rec = attention_fusion(model, "on", "fp16", "tensorrt_rtx", "1.7.0", None, False, None, "m.onnx")
    assert fused is None and rec["route"] == "native"
    fused, rec = attention_fusion(model, "auto", "fp16", "tensorrt", "8.6.1", "8.0", True, feeds, "m.onnx")
    assert fused is not None and len(rec["replaced"]) == 1 and "replaced 1" in "\n".join(describe(rec))
    _, rec = attention_fusion(model, "auto", "fp32", "tensorrt", "8.6.1", "8.0", True, feeds, "m.onnx")
    assert rec["route"] == "none" and "fp16" in rec["why"]
    with pytest.raises(UserError, match="m.onnx.*fp16"):
        attention_fusion(model, "on", "fp32", "tensorrt", "8.6.1", "8.0", True, feeds, "m.onnx")
    with pytest.raises(UserError, match="plugin registry"):
        attention_fusion(model, "on", "fp16", "tensorrt", "8.6.1", "8.0", False, feeds, "m.onnx")
    with pytest.raises(UserError, match="build.fuse_attention"):
        attention_fusion(model, "yes", "fp16", "tensorrt", "8.6.1", "8.0", True, feeds, "m.onnx")
    with pytest.raises(UserError, match="build.qkv_projection"):
        attention_fusion(model, "auto", "fp16", "tensorrt", "8.6.1", "8.0", True, feeds, "m.onnx", "gemm")
    fused, rec = attention_fusion(model, "auto", "fp16", "tensorrt", "8.6.1", "8.0", True, feeds, "m.onnx", "conv")
    assert rec["qkv_projection"] == "conv" and any(n.op_type == "Conv" for n in fused.graph.node)


def test_run_refuses_padding_for_an_unmasked_engine():
    side = {"attention_fusion": {"padding_allowed": False, "mask_inputs": ["attention_mask"]}}
    refuse_padding(side, "doc", {"attention_mask": np.ones((1, 8), np.int64)}, "e.engine")
    with pytest.raises(UserError, match="'doc' has zeros in 'attention_mask'.*e.engine"):
        refuse_padding(side, "doc", {"attention_mask": np.array([[1, 1, 0]])}, "e.engine")
    refuse_padding({"attention_fusion": {"padding_allowed": True}}, "doc", {"attention_mask": np.zeros((1, 3))}, "e.engine")
    refuse_padding({}, "doc", {"attention_mask": np.zeros((1, 3))}, "e.engine")


def test_cli_build_records_the_fusion_and_rejects_a_bad_mode(minilm_clean, tmp_path):
    """On tensorrt-rtx (CI's TensorRT) attention is left to TensorRT's own fusion, and the sidecar says so."""
    require("tensorrt_rtx")
    engine = tmp_path / "m.engine"
    proc = run_cli(
        "build", str(minilm_clean), "--precision", "fp16", "--tiers", "64", "--fuse-attention", "on", "-o", str(engine), "--json"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)["attention_fusion"]
    assert record["mode"] == "on" and record["route"] == "native" and not record["replaced"]
    assert_user_error(
        run_cli("build", str(minilm_clean), "--fuse-attention", "maybe", "-o", str(tmp_path / "x.engine")),
        "--fuse-attention must be 'auto', 'on' or 'off', got 'maybe'",
        "build.fuse_attention",
    )

    # An engine whose sidecar says its attention is unmasked: `run` refuses a padded mask before any GPU work.
    side_path = tmp_path / "m.engine.json"
    side = json.loads(side_path.read_text())
    side["attention_fusion"].update(padding_allowed=False, mask_inputs=["attention_mask"])
    side_path.write_text(json.dumps(side))
    inputs = tmp_path / "padded"
    inputs.mkdir()
    np.savez(
        inputs / "doc.npz",
        input_ids=np.full((1, 16), 2000, np.int64),
        attention_mask=np.concatenate([np.ones((1, 12), np.int64), np.zeros((1, 4), np.int64)], 1),
    )
    assert_user_error(
        run_cli("run", str(engine), "--inputs", str(inputs), "--no-chunking", "--reference", str(minilm_clean)),
        "'doc' has zeros in 'attention_mask'",
        "m.engine",
        "--fuse-attention off",
    )


@pytest.mark.parametrize("fusion", ["attention", "gelu", "skip_layernorm"])
def test_auto_falls_back_to_the_unfused_graph_when_the_fused_one_does_not_build(minilm_clean, tmp_path, monkeypatch, fusion):
    """`auto` promises a faster engine, never a failed build (`--fuse-attention`, `--fuse-gelu` and
    `--fuse-skip-layernorm auto` alike): TensorRT-RTX has no plugin registry, so a graph fused as for 8.6 fails to
    parse there, and the build goes on without what auto added, saying why in the sidecar."""
    require("tensorrt_rtx")
    import dataclasses

    import trtforge.build.step as build_mod
    import trtforge.fusion.step as step
    from trtforge.fusion.gelu import PLUGIN as GELU
    from trtforge.fusion.skip_layernorm import PLUGIN as SKIP_LN

    feeds = {"batch": 2, "seq": 64}
    if fusion == "attention":

        def fused_attention(mod, identity, model, precision, options, specs, axes, profiles, onnx_path, observation=None):
            return step.attention_fusion(
                model, "auto", precision, "tensorrt", "8.6.1", "8.0", True, random_feeds(specs, feeds), onnx_path.name
            )

        monkeypatch.setattr(build_mod, "fuse_attention", fused_attention)
        monkeypatch.setattr(build_mod, "ELEMENTWISE_PASSES", ())
        monkeypatch.setattr("trtforge.build.passes.ELEMENTWISE_PASSES", ())
    else:  # the one pass under test, as auto would apply it on 8.6 in fp16
        spec = dataclasses.replace(step.GELU_PASS if fusion == "gelu" else step.SKIP_LN_PASS, auto_precisions=("fp16",))
        real_fusion, real_skip = step.elementwise_fusion, step.elementwise_skip
        monkeypatch.setattr(build_mod, "ELEMENTWISE_PASSES", (spec,))
        monkeypatch.setattr("trtforge.build.passes.ELEMENTWISE_PASSES", (spec,))
        monkeypatch.setattr("trtforge.backends.plugin_libraries.plugin_registered", lambda mod, name, version: True)
        monkeypatch.setattr(
            step,
            "elementwise_skip",
            lambda s, mode, precision, flavour, version, registered: real_skip(s, mode, precision, "tensorrt", "8.6.1", registered),
        )
        monkeypatch.setattr(
            step,
            "elementwise_fusion",
            lambda s, model, observe, mode, precision, flavour, version, registered, f, name, options=None, observation=None: real_fusion(
                s, model, observe, mode, precision, "tensorrt", "8.6.1", True, f, name, options, observation
            ),
        )
    key, word, plugin, original = {
        "attention": ("attention_fusion", "attention", PLUGIN, "Softmax"),
        "gelu": ("gelu_fusion", "GELU", GELU, "Erf"),
        "skip_layernorm": ("skip_layernorm_fusion", "skip-LayerNorm", SKIP_LN, "LayerNormalization"),
    }[fusion]
    warnings = []
    result = build_mod.build(minilm_clean, tmp_path / "m.engine", "fp16", "seq=64", backend="tensorrt_rtx", warn=warnings.append)
    record = result.sidecar[key]
    assert record["route"] == "none" and "failed to build" in record["why"] and not record["replaced"]
    assert any(f"without {word} fusion" in w for w in warnings), warnings
    built = onnx.load(result.sidecar["built_onnx"])
    assert not any(n.op_type == plugin for n in built.graph.node) and any(n.op_type == original for n in built.graph.node)


def _dequantized_projections(model, dtype):
    """The hand-written attention with its Q/K/V weights given as integer constants behind DequantizeLinear."""
    rng = np.random.default_rng(0)
    g = model.graph
    for init in [i for i in g.initializer if i.name in ("wq", "wk", "wv")]:
        w = numpy_helper.to_array(init)
        q = rng.integers(0, 256, w.shape) if dtype == np.uint8 else rng.integers(-127, 128, w.shape)
        g.initializer.remove(init)
        g.initializer.extend(
            [
                numpy_helper.from_array(q.astype(dtype), init.name + "_q"),
                numpy_helper.from_array(np.full(w.shape[1], 0.003, np.float32), init.name + "_s"),
                numpy_helper.from_array(np.zeros(w.shape[1], dtype), init.name + "_z"),
            ]
        )
        g.node.insert(0, helper.make_node("DequantizeLinear", [init.name + "_q", init.name + "_s", init.name + "_z"], [init.name], axis=1))
    return model


@pytest.mark.parametrize("qkv_projection", PROJECTIONS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_integer_weight_constants_are_packed_only_when_int8(dtype, qkv_projection):
    """The packed weight is re-quantized as int8: uint8 weights (128..255 would saturate) are refused."""
    model = _dequantized_projections(_attention_model(), dtype)
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    fused, report = fuse_attention(model, {"x": x}, _route_any, "x", qkv_projection=qkv_projection)
    if dtype == np.uint8:
        assert not report.replaced and "not a projection" in report.refused[0]["reason"]
        return
    assert len(report.replaced) == 1
    x2 = np.random.default_rng(2).standard_normal((3, 7, 8)).astype(np.float32)
    want = OrtRunner(model.SerializeToString()).run({"x": x2})["y"]
    got = OrtRunner(emulate_plugins(fused, 32).SerializeToString()).run({"x": x2})["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize("qkv_projection", PROJECTIONS)
def test_fp32_projections_with_an_fp16_bias_give_a_valid_graph(qkv_projection):
    """A projection GEMM kept fp32 in an fp16 graph (Cast after it, fp16 bias): the packed GEMM is cast to the
    bias's type before the Add, so the fused graph is valid ONNX and computes the same attention."""
    model = _attention_model(heads=2, head=32)
    g = model.graph
    for init in g.initializer:
        if init.name in ("bq", "bk", "bv", "sqrt_d"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    nodes = []
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in ("wq", "wk", "wv"):
            out, n.output[0] = n.output[0], n.output[0] + "_32"
            nodes += [n, helper.make_node("Cast", [n.output[0]], [out], to=onnx.TensorProto.FLOAT16)]
        elif n.output[0] == "y":
            n.output[0] = "y16"
            nodes += [n, helper.make_node("Cast", ["y16"], ["y"], to=onnx.TensorProto.FLOAT)]
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    x = np.random.default_rng(1).standard_normal((2, 5, 64)).astype(np.float32)
    fused, report = fuse_attention(model, {"x": x}, _route_any, "x", qkv_projection=qkv_projection)
    assert len(report.replaced) == 1, report.to_json()
    want = OrtRunner(model.SerializeToString()).run({"x": x})["y"]
    got = OrtRunner(emulate_plugins(fused, 32, onnx.TensorProto.FLOAT16).SerializeToString()).run({"x": x})["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


# -- what the engine shows (fusion/engine_evidence.py) ---------------------------------------------------------------


def _layer(name, tactic="", kind="kgen"):
    return {"Name": name, "LayerType": kind, "TacticName": tactic}


def test_fused_attention_layers_are_counted_by_kernel_or_plugin_node_and_nothing_else():
    from trtforge.fusion.engine_evidence import fused_attention_layers

    myelin = [
        _layer("_gemm_mha_v2_myl1_7", "_gemm_mha_v2_0x51"),
        _layer("_gemm_mha_v2_myl3_7", "_gemm_mha_v2_0x9b"),
        _layer("__myl_SlicReshMulAddMaxrSubExpSumDivMul_myl1_23"),  # an unfused softmax
        _layer("/bert/encoder/layer.0/attention/self/MatMul_myl1_6", kind="gemm"),
    ]
    assert fused_attention_layers(myelin, profiles=2) == {"layers": 2, "kinds": {"_gemm_mha_v2": 2}, "by_profile": [1, 1]}
    # The model's own node names are not kernels, whatever they are called (TensorRT-RTX keeps them in layer names).
    named = [
        _layer("/model/layers.0/flash_attn/MatMul_myl0_3", kind="gemm"),
        _layer("/enc/fused_mha/MatMul_myl0_4", kind="gemm"),
        _layer("/enc/fmha_block/Softmax"),
        _layer("/vision/flashlight_head/Conv"),
    ]
    assert fused_attention_layers(named)["layers"] == 0
    tactics = [
        _layer("attn", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"),
        _layer("attn2", "fmha_v2_fp16_512_64_sm90_kernel"),
    ]
    assert fused_attention_layers(tactics)["layers"] == 2
    plugins = [
        _layer("fused_attention_0/qkv_to_context", kind="PluginV2"),
        _layer("fused_attention_0/qkv_to_context [profile 1]", kind="PluginV2"),
        _layer("fused_attention_0/x_to_tokens", kind="Shuffle"),
    ]
    found = fused_attention_layers(plugins, ["fused_attention_0/qkv_to_context"], profiles=2)
    assert found == {"layers": 2, "kinds": {"attention plugin layer": 2}, "by_profile": [1, 1]}
    assert fused_attention_layers(plugins)["layers"] == 0  # a plugin layer counts only as one the pass wrote
    # One profile: every layer is profile 0, however many Myelin graphs; several profiles and Myelin graphs that are not
    # one per profile: the profile of a layer cannot be told.
    two_graphs = [_layer("_gemm_mha_v2_myl0_7"), _layer("_gemm_mha_v2_myl2_7")]
    assert fused_attention_layers(two_graphs, profiles=1)["by_profile"] == [2]
    assert fused_attention_layers(two_graphs * 2, profiles=3)["by_profile"] is None


def test_attention_evidence_compares_each_profile_and_says_what_is_missing():
    from trtforge.fusion.engine_evidence import attention_evidence, evidence_lines, shortfall_warning

    native = {"route": "native", "attentions": ["s0", "s1"]}
    layers = [_layer(f"_gemm_mha_v2_myl{p}_{i}") for p in (1, 3) for i in (7, 17)]
    native["engine"] = attention_evidence(native, layers, profiles=2)
    assert native["engine"]["complete"] and native["engine"]["by_profile"] == [2, 2]  # Myelin graphs 1, 3: profiles 0, 1
    assert evidence_lines(native, "fp16") == ["  in the engine: 2 of 2 attention(s) fused in every profile (_gemm_mha_v2 x4)"]
    assert shortfall_warning(native, "fp16", "m.engine") is None
    # A KV-cache engine: prefill profiles run _gemm_mha, the decode profile _gemv_mha; here its second one is unfused.
    kv = [_layer(f"_gemm_mha_v2_myl{g}_{i}") for g in (1, 3) for i in (7, 18)] + [
        _layer("_gemv_mha_v1_myl5_7"),
        _layer("__myl_MulAddMaxrSubExpSumDiv_myl5_18"),
    ]
    native["engine"] = attention_evidence(native, kv, profiles=3)
    assert native["engine"]["by_profile"] == [2, 2, 1] and not native["engine"]["complete"]
    line = evidence_lines(native, "fp16")[0]
    assert "not every attention is fused in every profile" in line and "by profile: 2, 2, 1" in line
    assert "m.engine: not all of the graph's 2 attention(s) are fused in the engine in some optimization profile" in shortfall_warning(
        native, "fp16", "m.engine"
    )
    # Profiles that cannot be told apart: totals against profiles x attentions, never a fraction.
    native["engine"] = attention_evidence(native, [_layer(f"_gemm_mha_v2_myl{g}_7") for g in (0, 2, 4, 6, 8)], profiles=3)
    assert native["engine"]["by_profile"] is None and not native["engine"]["complete"]
    assert "5 fused layers for 3 profiles x 2 attentions" in evidence_lines(native, "fp16")[0]
    native["engine"] = attention_evidence(native, [_layer("/MatMul", kind="gemm")], profiles=1)
    line = evidence_lines(native, "fp32")[0]
    assert "none of the 2 attention(s) fused" in line and "build --precision fp16" in line
    assert "build --precision best" in evidence_lines(native, "int8")[0]
    assert shortfall_warning(native, "fp32", "m.engine") is None  # fp32: said, not warned
    assert shortfall_warning(native, "int8", "m.engine") is None  # int8 alone: no fp16 to fuse in
    assert "m.engine: not all of the graph's 2 attention(s)" in shortfall_warning(native, "best", "m.engine")
    plugin = {"route": "plugin", "replaced": [{"node": "fused_attention_0/qkv_to_context"}]}
    plugin["engine"] = attention_evidence(plugin, [_layer("fused_attention_0/qkv_to_context", kind="PluginV2")], 1)
    assert evidence_lines(plugin, "fp16") == ["  in the engine: 1 of 1 attention(s) fused (attention plugin layer x1)"]
    # The pass replaced one of the graph's two attentions (the other refused, e.g. causal without the flash plugin).
    plugin["attentions"] = ["s0", "s1"]
    plugin["engine"] = attention_evidence(plugin, [_layer("fused_attention_0/qkv_to_context", kind="PluginV2")], 1)
    assert "only 1 of 2 attention(s) fused" in evidence_lines(plugin, "fp16")[0]
    assert "not all of the graph's 2 attention(s)" in shortfall_warning(plugin, "fp16", "m.engine")
    plugin["route"] = "none"  # nothing was to be fused (no plugin, or fp32 on 8.6): said, not warned
    assert evidence_lines(plugin, "fp16") and shortfall_warning(plugin, "fp16", "m.engine") is None
    unknown = {"route": "native", "attentions": ["s0"]}
    unknown["engine"] = attention_evidence(unknown, None, 1, "cannot deserialize here")
    assert evidence_lines(unknown, "fp16") == ["  in the engine: not known (cannot deserialize here)"]
    assert shortfall_warning(unknown, "fp16", "m.engine") is None


@pytest.mark.parametrize("key", EXPORTS, ids=lambda key: "-".join(key))
def test_tensorrt_rtx_fuses_every_zoo_attention_in_fp16_and_the_build_proves_it(zoo, key, tmp_path):
    """The native route (TensorRT 10+ / TensorRT-RTX fuse attention themselves) checked on the engine: each zoo model's
    attentions (BERT, RoBERTa, ViT, GPT-2 causal; both exporters) are Myelin fused-attention layers in the fp16 build,
    counted from the engine's layers against the graph's attentions; `inspect` prints the count."""
    require("tensorrt_rtx")
    from trtforge.build.step import build

    warnings: list[str] = []
    result = build(zoo[key], tmp_path / "m.engine", "fp16", None, backend="tensorrt_rtx", warn=warnings.append)
    record = result.sidecar["attention_fusion"]
    assert record["route"] == "native" and len(record["attentions"]) == 2  # the small zoo configs: 2 layers
    engine = record["engine"]
    assert engine["known"] and engine["complete"] and engine["by_profile"] == [2] and engine["expected_per_profile"] == 2, engine
    assert set(engine["kinds"]) == {"_gemm_mha_v2"} and not [w for w in warnings if "fused in the engine" in w]
    assert engine["fused"] == 2 and describe(record, "fp16")[0] == "attention: fused 2 of 2 (counted in the engine's layers)"
    proc = run_cli("inspect", str(tmp_path / "m.engine"))
    assert proc.returncode == 0 and "in the engine: 2 of 2 attention(s) fused" in proc.stdout


@pytest.mark.parametrize("key", [k for k in MORE if k[0] != "swin"], ids=lambda key: key[0])
def test_tensorrt_rtx_fuses_the_other_architectures_attention_and_the_build_counts_it(zoo, key, tmp_path):
    """DistilBERT, CLIP, DeBERTa-v3 (disentangled) and T5 (position bias): TensorRT-RTX fuses both layers' attention,
    and the build counts them against the graph's two (DeBERTa's were not counted before: 4 fused of 0)."""
    require("tensorrt_rtx")
    from trtforge.build.step import build

    warnings: list[str] = []
    result = build(zoo[key], tmp_path / "m.engine", "fp16", None, backend="tensorrt_rtx", warn=warnings.append)
    record = result.sidecar["attention_fusion"]
    engine = record["engine"]
    assert len(record["attentions"]) == 2 and engine["complete"] and engine["expected_per_profile"] == 2, engine
    assert not [w for w in warnings if "fused in the engine" in w]


def test_swin_window_attention_unfused_by_tensorrt_rtx_is_warned(zoo, tmp_path):
    """Swin's four window attentions (bias and shift mask) are not fused by TensorRT-RTX: the build says so."""
    require("tensorrt_rtx")
    from trtforge.build.step import build

    warnings: list[str] = []
    result = build(zoo[("swin", "legacy")], tmp_path / "m.engine", "fp16", None, backend="tensorrt_rtx", warn=warnings.append)
    engine = result.sidecar["attention_fusion"]["engine"]
    assert engine["expected_per_profile"] == 4 and not engine["complete"], engine
    assert [w for w in warnings if "not all of the graph's 4 attention(s) are fused" in w]


@pytest.mark.parametrize("key", EXPORTS, ids=lambda key: "-".join(key))
def test_an_fp32_engine_says_its_attention_is_not_fused(zoo, key, tmp_path):
    """TensorRT-RTX fuses attention in reduced precision only: an fp32 build of each zoo model holds none, and says so."""
    require("tensorrt_rtx")
    from trtforge.build.step import build

    result = build(zoo[key], tmp_path / "m.engine", "fp32", None, backend="tensorrt_rtx")
    engine = result.sidecar["attention_fusion"]["engine"]
    assert engine["known"] and engine["by_profile"] == [0] and engine["expected_per_profile"] == 2
    proc = run_cli("inspect", str(tmp_path / "m.engine"))
    assert proc.returncode == 0 and "none of the 2 attention(s) fused" in proc.stdout
