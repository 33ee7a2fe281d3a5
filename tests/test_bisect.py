"""`trtforge bisect` (issue 10): role groups (pure), variants, suspects, and the command on MiniLM with a fake
engine that breaks one group the way TensorRT 8.6 broke BERT's attention batched MatMuls."""

import json

import numpy as np
import onnx
import pytest
from conftest import ROOT, run_cli
from onnx import TensorProto, helper, numpy_helper

from trtforge.calibrate.collect import gemm_shapes, plan_quantization
from trtforge.calibrate.groups import float_nodes_for, role_groups, select_groups, variants
from trtforge.core.config import InputSpec
from trtforge.core.onnxio import load_onnx
from trtforge.graph.index import io_specs, name_all_nodes
from trtforge.runtime.feeds import random_feeds
from trtforge.verify.bisect import BisectOptions, bisect, data_profile, suspects, table_rows


@pytest.fixture(scope="module")
def minilm_cache(minilm_clean, tmp_path_factory):
    """A quick calibration (no fallback): bisect needs scales, not a passing gate."""
    out = tmp_path_factory.mktemp("bisect") / "m.int8.onnx"
    proc = run_cli(
        "calibrate",
        str(minilm_clean),
        "--data",
        "calib_data/minilm",
        "--max-samples",
        "32",
        "--max-eval-samples",
        "8",
        "--no-fallback",
        "--min-cosine",
        "0",
        "--no-engine-check",
        "-o",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out.with_name("m.calib.cache")


def _plan(path):
    model = load_onnx(path)
    name_all_nodes(model)
    specs, axes, _ = io_specs(path, model)
    shapes = gemm_shapes(model, random_feeds(specs, {k: r.opt for k, r in axes.items()}))
    plan = plan_quantization(model, shapes, quantize_attention=True)
    return model, plan, shapes


def test_transformer_roles_on_minilm(minilm_clean):
    model, plan, shapes = _plan(minilm_clean)
    groups = role_groups(model, plan, shapes)
    layers = 6  # MiniLM-L6
    assert {g: len(n) for g, n in groups.items()} == {
        "qkv_projection": 3 * layers,
        "attention_qk": layers,
        "attention_av": layers,
        "attention_output": layers,
        "ffn_up": layers,
        "ffn_down": layers,
    }
    assert all("attention/self/MatMul" in n and not n.endswith("_1") for n in groups["attention_qk"])
    assert all(n.endswith("attention/self/MatMul_1") for n in groups["attention_av"])
    assert all("intermediate/dense" in n for n in groups["ffn_up"]) and all(
        "/output/dense" in n and "attention" not in n for n in groups["ffn_down"]
    )


def _cnn() -> onnx.ModelProto:
    """x -> first conv 3->16 -> relu -> conv (+ residual through a 1x1 max pool) -> relu -> conv stride 2 -> relu -> pool -> Gemm -> logits."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="block_conv", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["r0"], ["m0"], name="identity_pool", kernel_shape=[1, 1]),
        helper.make_node("Add", ["c1", "m0"], ["a1"], name="residual"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="down_conv", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wfc", "bfc"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10])],
        [
            w("w0", 16, 3, 3, 3),
            w("w1", 16, 16, 3, 3),
            w("w2", 32, 16, 3, 3),
            w("wfc", 10, 32),
            numpy_helper.from_array(np.zeros(10, np.float32), "bfc"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cnn_roles_first_conv_stages_head_residual():
    model = _cnn()
    shapes = gemm_shapes(model, {"x": np.ones((2, 3, 16, 16), np.float32)})
    plan = plan_quantization(model, shapes, rules=("gemv", "conv_channels"))  # keep the head: it is a group here
    groups = role_groups(model, plan, shapes)
    assert groups == {
        "first_conv": ["stem"],
        "conv_16x16": ["block_conv"],
        "conv_8x8": ["down_conv"],
        "head": ["fc"],
        "residual_add": ["residual"],
    }
    assert role_groups(model, plan, None)["conv"] == ["block_conv", "down_conv"]  # no shapes: one conv group


def test_selection_variants_and_float_nodes():
    model = _cnn()
    shapes = gemm_shapes(model, {"x": np.ones((2, 3, 16, 16), np.float32)})
    plan = plan_quantization(model, shapes, rules=("gemv", "conv_channels"))
    groups = role_groups(model, plan, shapes)
    assert list(select_groups(groups, "conv_*,head")) == ["conv_16x16", "conv_8x8", "head"]
    with pytest.raises(ValueError, match="unknown group.*attention_qk.*first_conv"):
        select_groups(groups, "attention_qk")
    chosen = select_groups(groups, "first_conv,residual_add")
    names = [v for v, _ in variants(chosen)]
    assert names == ["all", "without first_conv", "only first_conv", "without residual_add", "only residual_add"]
    assert [v for v, _ in variants(chosen, ["alone"])] == ["all", "only first_conv", "only residual_add"]
    # Only the chosen groups ever carry Q/DQ; a residual Add is switched like a node.
    assert float_nodes_for(plan, chosen, {"first_conv"}) == {"block_conv", "down_conv", "fc", "residual"}
    assert float_nodes_for(plan, chosen, {"first_conv", "residual_add"}) == {"block_conv", "down_conv", "fc"}


def test_suspects_alone_gap_and_closing_gap():
    rows = [
        {"variant": "all", "mode": "all", "group": None, "gap": 0.25},
        {"variant": "without a", "mode": "off", "group": "a", "gap": 0.001},
        {"variant": "only a", "mode": "alone", "group": "a", "gap": 0.2},
        {"variant": "without b", "mode": "off", "group": "b", "gap": 0.24},
        {"variant": "only b", "mode": "alone", "group": "b", "gap": 0.0},
        {"variant": "only c", "mode": "alone", "group": "c"},
    ]  # no engine figure: never named
    assert suspects(rows, 0.005) == ["a"]
    assert suspects(rows, 0.3) == []


def test_data_profile_spans_the_data_shapes():
    specs = [InputSpec(name="ids", dtype="int64", shape=["batch", "seq"])]
    batches = [{"ids": np.zeros(s, np.int64)} for s in [(16, 40), (16, 40), (3, 7), (16, 128)]]
    p = data_profile(specs, batches)
    assert p.shapes["ids"] == ((3, 7), (16, 40), (16, 128))


def test_bisect_names_the_group_a_fake_engine_breaks(minilm_clean, minilm_cache, tmp_path):
    """The engine is ORT on the variant with its output ruined whenever attention_av is quantized: the
    bisection must name attention_av and nothing else."""
    calls = []

    def fake_engine(path, qdq, batches, refs, kinds):
        from trtforge.backends.onnxruntime import OrtRunner
        from trtforge.calibrate.evaluate import evaluate

        calls.append(path.name)
        runner = OrtRunner(qdq.SerializeToString())
        broken = any(
            n.op_type == "MatMul" and n.name.endswith("attention/self/MatMul_1") and n.input[0].endswith("_dq") for n in qdq.graph.node
        )

        class Engine:
            input_names, output_names = runner.input_names, runner.output_names

            def run(self, feeds):
                out = runner.run(feeds)
                return {k: np.flip(v, axis=-1).copy() if broken else v for k, v in out.items()}  # channels scrambled

        acc = evaluate(Engine(), batches, refs, kinds)
        return {"built": True, "mean_cosine": acc.mean_cosine, "min_cosine": acc.min_cosine, "gpu_ms": 1.0}

    options = BisectOptions(
        cache=minilm_cache, data=ROOT / "calib_data" / "minilm_eval", groups="attention_av,ffn_up", max_samples=16, out_dir=tmp_path / "b"
    )
    result = bisect(minilm_clean, options, measure=fake_engine, availability=("run", "fake"))
    assert [r["variant"] for r in result.rows] == ["all", "without attention_av", "only attention_av", "without ffn_up", "only ffn_up"]
    assert result.suspects == ["attention_av"]
    assert len(calls) == 5 and (tmp_path / "b" / "only_attention_av.onnx").is_file()
    rows = {r[0]: r for r in table_rows(result)}
    assert rows["only ffn_up"][4] == pytest.approx(0, abs=1e-6) and rows["only attention_av"][4] > 0.05
    report = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert report["suspects"] == ["attention_av"] and report["groups"] == {"attention_av": 6, "ffn_up": 6}


def test_bisect_cli_without_engine_says_why(minilm_clean, minilm_cache, tmp_path):
    proc = run_cli(
        "bisect",
        str(minilm_clean),
        "--data",
        "calib_data/minilm_eval",
        "--max-samples",
        "8",
        "--groups",
        "attention_qk",
        "--no-build-check",
        "--cache",
        str(minilm_cache),
        "--out-dir",
        str(tmp_path / "b"),
        env={"COLUMNS": "300"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "engine: absent:" in proc.stdout and "attention_qk" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("all "))
    assert "absent: " in row  # the engine column says why it is empty
    report = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert [r["variant"] for r in report["rows"]] == ["all"] and report["rows"][0]["ort_mean_cosine"] > 0.9
    assert "engine" not in report["rows"][0]


def test_bisect_cli_bad_input(minilm_clean, minilm_cache, tmp_path):
    from conftest import assert_user_error

    assert_user_error(
        run_cli("bisect", str(minilm_clean), "--data", "calib_data/minilm_eval", "--groups", "conv_*", "--cache", str(minilm_cache)),
        "--groups",
        "unknown group(s) conv_*",
        "attention_qk",
    )
    assert_user_error(
        run_cli("bisect", str(minilm_clean), "--data", "calib_data/minilm_eval", "--cache", str(tmp_path / "no.cache")),
        "no.cache does not exist",
    )
    assert_user_error(
        run_cli("bisect", str(minilm_cache.with_name("m.int8.onnx")), "--data", "calib_data/minilm_eval", "--cache", str(minilm_cache)),
        "already holds Q/DQ",
    )


def test_a_variant_whose_engine_fails_is_recorded_and_the_rest_go_on(minilm_clean, minilm_cache, tmp_path):
    def flaky(path, qdq, batches, refs, kinds):
        if path.name == "all.onnx":
            raise RuntimeError("TensorRT execution failed on profile 0")
        return {"built": True}

    options = BisectOptions(
        cache=minilm_cache,
        data=ROOT / "calib_data" / "minilm_eval",
        groups="ffn_up,ffn_down",
        modes=("alone",),
        max_samples=4,
        out_dir=tmp_path / "b",
    )
    result = bisect(minilm_clean, options, measure=flaky, availability=("build", "fake"))
    assert list(result.groups) == ["ffn_up", "ffn_down"]  # found behind SmoothQuant's inserted Mul too (the cache is smoothed)
    assert [r.get("engine") for r in result.rows] == [
        {"error": "RuntimeError: TensorRT execution failed on profile 0"},
        {"built": True},
        {"built": True},
    ]
    assert [row[3] for row in table_rows(result)] == [
        "failed: RuntimeError: TensorRT execution failed on profile 0",
        "built (not run here)",
        "built (not run here)",
    ]
    assert result.suspects == [] and result.engine_status == "built only: fake"


def test_tanh_gelu_ffn_and_a_pooler_before_a_classifier():
    """A tanh-GELU FFN (6 ops between the GEMMs and the Tanh) with a residual, then BERT's pooler ([CLS] by a
    Gather, dense, Tanh) feeding a classifier: the pooler is head, not ffn_up, though a Tanh follows it."""
    rng = np.random.default_rng(0)

    def init(name, value):
        return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)

    inits = [
        init("wup", rng.standard_normal((8, 16))),
        init("bup", np.zeros(16)),
        init("wdown", rng.standard_normal((16, 8))),
        init("c3", 3.0),
        init("k", 0.044715),
        init("r", 0.79788),
        init("one", 1.0),
        init("half", 0.5),
        init("wp", rng.standard_normal((8, 8))),
        init("bp", np.zeros(8)),
        init("wc", rng.standard_normal((8, 3))),
        numpy_helper.from_array(np.array(0, np.int64), "cls"),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "wup"], ["u"], name="up"),
        n("Add", ["u", "bup"], ["h"], name="bias_up"),
        n("Pow", ["h", "c3"], ["p"], name="pow"),
        n("Mul", ["p", "k"], ["m"], name="mul_k"),
        n("Add", ["h", "m"], ["a"], name="add_a"),
        n("Mul", ["a", "r"], ["s"], name="mul_r"),
        n("Tanh", ["s"], ["t"], name="tanh"),
        n("Add", ["t", "one"], ["o"], name="add_one"),
        n("Mul", ["h", "o"], ["g"], name="mul_g"),
        n("Mul", ["g", "half"], ["g2"], name="mul_half"),
        n("MatMul", ["g2", "wdown"], ["d"], name="down"),
        n("Add", ["d", "x"], ["y"], name="residual"),
        n("Gather", ["y", "cls"], ["c"], name="cls_token", axis=1),
        n("MatMul", ["c", "wp"], ["pd"], name="pooler"),
        n("Add", ["pd", "bp"], ["pb"], name="bias_p"),
        n("Tanh", ["pb"], ["pooled"], name="pool_tanh"),
        n("MatMul", ["pooled", "wc"], ["logits"], name="classifier"),
    ]
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 3]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = plan_quantization(model, None, rules=())
    assert role_groups(model, plan, None) == {"ffn_up": ["up"], "ffn_down": ["down"], "head": ["pooler", "classifier"]}
