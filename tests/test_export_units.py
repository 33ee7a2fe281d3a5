"""Export and clean defects of issue 9, one regression test each (see each test's docstring)."""

import json
from collections import OrderedDict

import numpy as np
import onnx
import pytest
import torch
from conftest import FIXTURES, assert_user_error, run_cli
from onnx import TensorProto, helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.errors import UserError

# -- outputs: every kind of return, mapped to the declared names ----------------------------------


def test_named_outputs_of_model_output_dict_tuple_and_tensor():
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    from trtforge.export.step import named_outputs

    a, b = torch.ones(1), torch.zeros(1)
    model_output = BaseModelOutputWithPooling(last_hidden_state=a, pooler_output=b)  # hidden_states None: skipped
    assert [n for n, _ in named_outputs(model_output)] == ["last_hidden_state", "pooler_output"]
    assert [n for n, _ in named_outputs({"out": a, "aux": (a, b)})] == ["out", "aux.0", "aux.1"]
    assert [n for n, _ in named_outputs((a, b))] == [None, None]
    assert [n for n, _ in named_outputs(a)] == [None]


def test_declared_output_the_module_does_not_return_is_named():
    from trtforge.export.step import named_outputs, select_outputs

    pairs = named_outputs(OrderedDict(logits=torch.ones(1)))
    with pytest.raises(UserError, match="outputs pooled are declared but m returns only logits"):
        select_outputs(pairs, ["logits", "pooled"], "m")
    with pytest.raises(UserError, match="outputs c are declared but m returns only 2"):
        select_outputs(named_outputs((torch.ones(1), torch.ones(1))), ["a", "b", "c"], "m")
    # By name, in the declared order, whatever order the module returns them in.
    got = select_outputs(named_outputs({"x": torch.ones(1), "y": torch.zeros(1)}), ["y", "x"], "m")
    assert [float(t) for t in got] == [0.0, 1.0]


def test_config_declaring_missing_output_fails_naming_it(tmp_path):
    """A config whose `outputs` name a tensor the module does not return: one error naming it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""name: zh
model: {{source: {FIXTURES}/user_models.py:zero_head}}
inputs: [{{name: x, shape: [batch, 8]}}]
axes: {{batch: {{min: 1, opt: 2, max: 4}}}}
outputs: [features, embedding]
""")
    proc = run_cli("export", "--config", str(cfg), "-o", str(tmp_path / "x.onnx"))
    assert_user_error(proc, "outputs embedding are declared", "returns only features, logits")


def test_tuple_outputs_all_compared_and_named(tmp_path):
    """Every output is exported and checked (the old check zip()ped and silently dropped extras)."""
    out = tmp_path / "t.onnx"
    proc = run_cli("export", "--model", f"{FIXTURES}/user_models.py:three_outputs_as_tuple", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [o["name"] for o in report["outputs"]] == ["output_0", "output_1", "output_2"]
    assert all(set(c["metrics"]) == {"output_0", "output_1", "output_2"} for c in report["check"])


def test_output_count_or_name_mismatch_between_torch_and_onnx_is_an_error():
    from trtforge.export.check import require_same_outputs

    require_same_outputs(["a", "b"], ["a", "b"])
    with pytest.raises(UserError, match="only the ONNX graph returns c"):
        require_same_outputs(["a", "b"], ["a", "b", "c"])
    with pytest.raises(UserError, match="only PyTorch returns b"):
        require_same_outputs(["a", "b"], ["a"])


def test_check_against_torch_refuses_an_onnx_with_an_extra_output(tmp_path):
    """The ONNX returns two outputs where PyTorch returns one: an error naming the extra, not a silent zip."""
    from trtforge.core.config import ModelConfig
    from trtforge.export.check import check_against_torch
    from trtforge.export.step import keyword_call
    from trtforge.models import LoadedModel

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    extra = helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["extra"])], "g", [x], [y, extra])
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    loaded = LoadedModel(torch.nn.ReLU().eval(), {"x": torch.randn(2, 3)}, ["y"], "relu")
    cfg = ModelConfig(
        name="r", model={"source": "relu"}, inputs=[{"name": "x", "shape": ["batch", 3]}], axes={"batch": {"min": 1, "opt": 2, "max": 4}}
    )
    call = keyword_call(loaded, ["x"], ["y"])
    with pytest.raises(UserError, match="only the ONNX graph returns extra"):
        check_against_torch(path, call, loaded, cfg, ["y"])


def test_keywords_where_the_forward_takes_the_input_names_else_positional():
    """transformers 5 forwards need keywords; nn.Sequential's `forward(input)` cannot take 'image'."""
    import sys

    sys.path.insert(0, str(FIXTURES.parent.parent))
    from trtforge.models import called_positionally
    from zoo.models import gpt2

    module, examples, _, _ = gpt2()
    assert not called_positionally(module, list(examples))  # its 2nd positional parameter is past_key_values
    assert called_positionally(torch.nn.Sequential(torch.nn.ReLU()), ["image"])

    class Kw(torch.nn.Module):
        def forward(self, **inputs):
            return inputs["a"]

    assert not called_positionally(Kw(), ["a"])


# -- vacuous references ---------------------------------------------------------------------------


def test_vacuous_reason_definitions():
    from trtforge.verify.guards import vacuous_reason

    rng = np.random.default_rng(0)
    assert vacuous_reason(np.zeros((2, 10))) == "all zeros"
    assert vacuous_reason(np.full((2, 10), 0.37, dtype=np.float32)).startswith("constant")
    # float32 rounding noise on a constant is still constant
    assert vacuous_reason(np.float32(1000.0) + rng.normal(0, 1e-5, 100).astype(np.float32)).startswith("constant")
    # a random-init SegFormer's logits: std ~3e-3 around a small offset, very much not constant
    assert vacuous_reason(0.01 + rng.normal(0, 3e-3, (1, 5, 16, 16)).astype(np.float32)) is None
    assert vacuous_reason(np.array([3.0])) is None  # one value cannot be judged
    assert vacuous_reason(np.array([0.0])) == "all zeros"
    # a random-init MobileViT's logits: activations shrink layer by layer to float32 subnormals (~1e-41),
    # which fp16 and INT8 engines turn into zeros; the spread test alone passed them
    assert vacuous_reason(rng.normal(0, 2e-41, (2, 10)).astype(np.float32)).startswith("too small to measure")
    assert vacuous_reason(rng.normal(0, 1e-25, (2, 10)).astype(np.float32)).startswith(
        "too small to measure"
    )  # normal floats, but their products underflow
    assert vacuous_reason(rng.normal(0, 1e-17, (2, 10)).astype(np.float32)) is None


def test_export_refuses_vanishing_reference_output(tmp_path):
    """A model whose activations vanish (random-init MobileViT: logits ~1e-41) failed later, in calibrate
    and run, with cosine 0 and no hint of why; export now says so and how to fix it."""
    proc = run_cli("export", "--model", f"{FIXTURES}/user_models.py:vanishing", "-o", str(tmp_path / "v.onnx"))
    assert_user_error(proc, "reference output 'logits' is too small to measure against", "larger scale")
    assert not (tmp_path / "v.onnx").exists()


def test_export_refuses_all_zero_reference_output(tmp_path):
    """A zero-initialised head (torchvision ViT, weights=None) made the old check pass with rel-L2 0."""
    proc = run_cli("export", "--model", f"{FIXTURES}/user_models.py:zero_head", "-o", str(tmp_path / "z.onnx"))
    assert_user_error(proc, "reference output 'logits' is all zeros", "re-initialise")
    assert not (tmp_path / "z.onnx").exists()


def test_clean_refuses_constant_reference_output(tmp_path):
    """clean's parity check on a graph whose output does not depend on its input (a constant)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [4], [0.5] * 4)
    nodes = [helper.make_node("Mul", ["x", "zero"], ["xz"]), helper.make_node("Add", ["xz", "bias"], ["y"])]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[bias, zero])
    path = tmp_path / "const.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    proc = run_cli("clean", str(path))
    assert_user_error(proc, "clean's parity check", "reference output 'y' is constant")


# -- error text -----------------------------------------------------------------------------------


def test_exception_summary_strips_ansi_and_keeps_root_cause():
    from trtforge.core.errors import exception_summary

    try:
        try:
            raise ValueError("the actual \x1b[31mreason\x1b[0m is here")
        except ValueError as cause:
            raise RuntimeError("\x1b[96mpreamble\x1b[0m " + "noise " * 200) from cause
    except RuntimeError as exc:
        text = exception_summary(exc)
    assert text == "ValueError: the actual reason is here"
    long = RuntimeError("\x1b[1m" + "preamble words " * 100 + "\nthe end: Constraints violated (seq)\x1b[0m")
    text = exception_summary(long, limit=120)
    assert "\x1b" not in text and text.endswith("the end: Constraints violated (seq)") and len(text) < 140
    # torch's FX interpreter puts the failing node and the traced code AFTER the reason (T5 and Swin under the dynamo
    # exporter): the summary ended in the traceback and lost the reason
    fx = ValueError(
        "Cannot view a tensor with shape torch.Size([s21, s22, 4, 16]) and strides (64*s22, 16, 16*s22, 1) "
        "as a tensor with shape (s21, s22, 64)!\nWhile executing %view_4 : [num_users=1] = call_function["
        "target=torch.ops.aten.view.default](args = (%transpose_3, [%sym_size_int_9, -1]), kwargs = {})\n"
        "Original traceback:\n"
        + '  File "modeling_t5.py", line 368, in forward\n    x = x.reshape()\n' * 20
        + "Use tlparse to see full graph."
    )
    assert exception_summary(fx) == (
        "ValueError: Cannot view a tensor with shape torch.Size([s21, s22, 4, 16]) and strides "
        "(64*s22, 16, 16*s22, 1) as a tensor with shape (s21, s22, 64)!"
    )


def test_exporter_error_keeps_root_cause_without_ansi(tmp_path):
    """torch's messages carry ANSI colours and a long preamble; the old 300-character cut dropped the cause."""
    proc = run_cli("export", "--model", f"{FIXTURES}/user_models.py:fails_when_traced", "-o", str(tmp_path / "f.onnx"))
    line = assert_user_error(proc, "legacy exporter failed", "the ROOT CAUSE", "data-dependent branch")
    assert "\x1b" not in proc.stderr and "Context line" not in line


# -- TorchScript ----------------------------------------------------------------------------------


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 6)
        self.proj = torch.nn.Linear(6, 3)

    def forward(self, ids, scale):
        return self.proj(self.emb(ids)) * scale.unsqueeze(-1)


@pytest.mark.parametrize("how", ["script", "trace"])
def test_torchscript_export_with_inputs_from_config(tmp_path, how):
    """TorchScript carries no example inputs: they come from the config, passed positionally in its order."""
    torch.manual_seed(0)
    module = _TwoInputs().eval()
    example = (torch.randint(0, 20, (2, 5)), torch.rand(2, 5))
    scripted = torch.jit.script(module) if how == "script" else torch.jit.trace(module, example)
    pt = tmp_path / "m.pt"
    torch.jit.save(scripted, str(pt))
    cfg = tmp_path / "ts.yaml"
    cfg.write_text(f"""name: ts
model: {{source: {pt}}}
inputs:
  - {{name: ids, dtype: int64, shape: [batch, seq], value_range: [0, 20]}}
  - {{name: scale, dtype: float32, shape: [batch, seq], value_range: [0.5, 2.0]}}
axes: {{batch: {{min: 1, opt: 2, max: 8}}, seq: {{min: 1, opt: 5, max: 32}}}}
outputs: [y]
""")
    out = tmp_path / "ts.onnx"
    proc = run_cli("export", "--config", str(cfg), "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [o["name"] for o in report["outputs"]] == ["y"] and {c["axis"] for c in report["check"]} == {"batch", "seq"}
    ids, scale = np.array([[1, 2, 3]]), np.array([[1.0, 0.5, 2.0]], dtype=np.float32)
    with torch.no_grad():
        ref = module(torch.from_numpy(ids), torch.from_numpy(scale)).numpy()
    assert np.allclose(OrtRunner(out).run({"ids": ids, "scale": scale})["y"], ref, atol=1e-5)


def test_torchscript_without_config_says_what_to_do(tmp_path):
    pt = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(_TwoInputs().eval()), str(pt))
    proc = run_cli("export", "--model", str(pt), "-o", str(tmp_path / "x.onnx"))
    assert_user_error(proc, "m.pt is TorchScript", "--config", "'inputs'")


# -- clean: Shape(start, end) for TensorRT 8.6 -----------------------------------------------------


def _shape_slice_model(path):
    """y = x reshaped to [x.shape[0] * x.shape[1], x.shape[2]], the shape read with Shape(start, end)."""
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
    graph = helper.make_graph(nodes, "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_clean_rewrites_shape_start_end_and_lists_nodes(tmp_path):
    """TensorRT 8.6 rejects Shape with start/end (dynamo graphs): clean rewrites them, ORT unchanged."""
    path = tmp_path / "s.onnx"
    _shape_slice_model(path)
    proc = run_cli("clean", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["rewritten"]["shape_start_end"] == ["shape_ab", "shape_c"]
    cleaned = onnx.load(str(tmp_path / "s.clean.onnx"))
    assert not [n for n in cleaned.graph.node if n.op_type == "Shape" and n.attribute]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    assert np.array_equal(OrtRunner(path).run({"x": x})["y"], OrtRunner(tmp_path / "s.clean.onnx").run({"x": x})["y"])
    proc = run_cli("clean", str(path), "-o", str(tmp_path / "t.onnx"))
    assert "rewrote 2 node(s) for TensorRT's parser (shape_start_end): shape_ab, shape_c" in proc.stdout


def test_split_shape_slices_keeps_plain_shapes():
    from trtforge.graph.index import split_shape_slices

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Shape", ["x"], ["y"], name="s")], "g", [x], [y]))
    assert split_shape_slices(model) == [] and len(model.graph.node) == 1


# -- opset repairs of the dynamo exporter ---------------------------------------------------------


def test_opset_17_graph_loses_opset_18_attributes():
    """onnx's 18 -> 17 converter leaves Split's num_outputs (GPT-2) and ReduceMean's noop_with_empty_axes
    (ResNet): ONNX Runtime refuses such a graph. conform_to_opset drops them and says so."""
    from trtforge.export.onnx_fixups import conform_to_opset

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, None]) for n in ("a", "b", "c")]
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], axis=1, num_outputs=2),
        helper.make_node("ReduceMean", ["x"], ["c"], axes=[1], keepdims=1, noop_with_empty_axes=0),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 17)])
    fixed, repairs = conform_to_opset(model, 17)
    assert repairs == ["dropped 'noop_with_empty_axes' from 1 ReduceMean node(s)", "dropped 'num_outputs' from 1 Split node(s)"]
    onnx.checker.check_model(fixed, full_check=True)
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    got = OrtRunner(fixed.SerializeToString()).run({"x": data})
    assert np.array_equal(got["a"], data[:, :3]) and np.allclose(got["c"], data.mean(1, keepdims=True))


# -- no-config specs --------------------------------------------------------------------------------


def test_specs_from_examples_makes_text_seq_dynamic_and_masks_all_ones():
    from trtforge.export.step import specs_from_examples
    from trtforge.models import LoadedModel

    ids = torch.tensor([[101, 2000, 102, 0], [101, 2001, 2002, 102]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    specs, axes = specs_from_examples(LoadedModel(None, {"input_ids": ids, "attention_mask": mask, "img": torch.rand(2, 3, 8, 8)}))
    assert [s.shape for s in specs] == [["batch", "seq"], ["batch", "seq"], ["batch", 3, 8, 8]]
    assert specs[0].value_range == (0.0, 2003.0) and specs[1].value_range == (1.0, 2.0)
    assert axes["seq"].opt == 4 and axes["seq"].min == 1 and axes["batch"].opt == 2
