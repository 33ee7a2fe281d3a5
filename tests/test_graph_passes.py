"""Each clean pass on small hand-built graphs, checked with ONNX Runtime."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.onnxio import load_onnx, save_onnx
from trtforge.graph.index import clean_model, graph_stats, verify_same


def _model(nodes, initializers, outputs=("y",)):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SPECS = [InputSpec(name="x", shape=["n", 4], value_range=(-1, 1))]
AXES = {"n": AxisRange(min=1, opt=3, max=8)}


def _w(name, shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).normal(size=shape).astype(np.float32), name)


def test_identity_and_dropout_removed_outputs_unchanged():
    model = _model(
        [
            helper.make_node("Identity", ["x"], ["a"]),
            helper.make_node("MatMul", ["a", "w"], ["b"]),
            helper.make_node("Dropout", ["b"], ["c"]),
            helper.make_node("Relu", ["c"], ["d"]),
            helper.make_node("Identity", ["d"], ["y"]),  # feeds the graph output: name must survive
        ],
        [_w("w", (4, 4))],
    )
    cleaned, counts = clean_model(model)
    ops = graph_stats(cleaned).ops
    assert "Identity" not in ops and "Dropout" not in ops
    assert counts["passthrough_removed"] == 3
    assert [o.name for o in cleaned.graph.output] == ["y"]
    worst = verify_same(model.SerializeToString(), cleaned.SerializeToString(), SPECS, AXES)
    assert worst["y"]["rel_l2"] == 0.0 and worst["y"]["candidate_nonfinite"] == 0


def test_dead_nodes_and_unused_initializers_removed():
    model = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("MatMul", ["x", "w_dead"], ["dead"]),
            helper.make_node("Relu", ["dead"], ["dead2"]),
        ],
        [_w("w", (4, 4)), _w("w_dead", (4, 4), 1), _w("unused", (100,), 2)],
    )
    cleaned, _ = clean_model(model)
    assert graph_stats(cleaned).nodes == 1
    assert {t.name for t in cleaned.graph.initializer} == {"w"}
    assert graph_stats(cleaned).initializer_bytes == 4 * 4 * 4


def test_constant_folding_respects_size_threshold():
    # w2 = Transpose(w) is constant: folded when small enough, kept when over the threshold.
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    model = _model(nodes, [_w("w", (4, 4))])
    folded, _ = clean_model(model, fold_size_limit_mb=1.0)
    assert "Transpose" not in graph_stats(folded).ops
    kept, _ = clean_model(model, fold_size_limit_mb=1e-6)
    assert "Transpose" in graph_stats(kept).ops
    assert verify_same(model.SerializeToString(), folded.SerializeToString(), SPECS, AXES)["y"]["rel_l2"] < 1e-6


def test_toposort_and_shape_inference():
    # Nodes listed out of order still produce a valid, sorted graph with inferred value_info.
    model = _model(
        [
            helper.make_node("Relu", ["b"], ["y"]),
            helper.make_node("MatMul", ["x", "w"], ["b"]),
        ],
        [_w("w", (4, 4))],
    )
    cleaned, _ = clean_model(model)
    assert [n.op_type for n in cleaned.graph.node] == ["MatMul", "Relu"]
    assert any(v.name == "b" for v in cleaned.graph.value_info)
    onnx.checker.check_model(cleaned)


def test_external_data_roundtrip(tmp_path):
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_w("w", (4, 4))])
    path = tmp_path / "m.onnx"
    save_onnx(model, path, external_data=True)
    assert (tmp_path / "m.onnx.data").is_file()
    loaded = load_onnx(path)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), numpy_helper.to_array(model.graph.initializer[0]))
    assert not list(tmp_path.glob(".*"))  # no temp leftovers


def _chain_with_a_branch() -> onnx.ModelProto:
    """x -> a -> b -> y, with c reading a beside b, and an If whose branch reads b from the outer scope."""
    from onnx import TensorProto, helper

    then = helper.make_graph(
        [helper.make_node("Identity", ["b"], ["t"])], "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="A"),
        helper.make_node("Neg", ["a"], ["c"], name="C"),
        helper.make_node("Relu", ["a"], ["b"], name="B"),
        helper.make_node("If", ["cond"], ["i"], name="I", then_branch=then, else_branch=then),
        helper.make_node("Add", ["b", "c"], ["y"], name="Y"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]), helper.make_tensor_value_info("i", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph)


def test_sort_nodes_orders_in_place_keeping_the_original_order_among_ready_nodes():
    from trtforge.graph.index import sort_nodes

    model = _chain_with_a_branch()
    want = [n.name for n in model.graph.node]
    shuffled = [model.graph.node[i] for i in (4, 3, 2, 1, 0)]
    scrambled = onnx.ModelProto()
    scrambled.CopyFrom(model)
    del scrambled.graph.node[:]
    scrambled.graph.node.extend(shuffled)
    assert sort_nodes(scrambled) is scrambled
    # among nodes ready together the scrambled order (Y, I, B, C, A) holds: B before C; If waits for B, which its
    # branch reads from the outer scope
    assert [n.name for n in scrambled.graph.node] == ["A", "B", "I", "C", "Y"]
    onnx.checker.check_model(scrambled)
    # a sorted graph is left as it is
    assert [n.name for n in sort_nodes(model).graph.node] == want
