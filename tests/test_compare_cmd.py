"""`trtforge compare TARGET REFERENCE --inputs DIR` and its layer-wise mode.

A hand-made MatMul -> Add -> Relu chain is the reference; copies of it with one weight perturbed or one node
replaced by a NaN-producing one are targets whose first bad tensor is known. The engine path runs against a fake
engine (ONNX Runtime standing in for TensorRT, as in test_engine_check.py); no engine executes on this machine.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_user_error, export_zoo, require, run_cli
from onnx import TensorProto, helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.errors import UserError
from trtforge.verify.gates import Gate
from trtforge.verify.step import CompareOptions, EngineAccess, compare, first_jump, growth_factors

CHAIN_TENSORS = ["h1_mm", "h1", "h1_relu", "h2_mm", "h2", "h2_relu", "y"]


def chain(w2_scale: float = 1.0, act1: str = "Relu") -> onnx.ModelProto:
    """x[batch, 8] -> MatMul -> Add -> act1 -> MatMul -> Add -> Relu -> MatMul -> y[batch, 4]."""
    rng = np.random.default_rng(0)
    inits = {
        "W1": rng.standard_normal((8, 16)) / 3,
        "B1": rng.standard_normal(16) * 0.1,
        "W2": rng.standard_normal((16, 16)) / 4 * w2_scale,
        "B2": rng.standard_normal(16) * 0.1,
        "W3": rng.standard_normal((16, 4)) / 4,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1_mm"], name="mm1"),
        helper.make_node("Add", ["h1_mm", "B1"], ["h1"], name="add1"),
        helper.make_node(act1, ["h1"], ["h1_relu"], name="act1"),
        helper.make_node("MatMul", ["h1_relu", "W2"], ["h2_mm"], name="mm2"),
        helper.make_node("Add", ["h2_mm", "B2"], ["h2"], name="add2"),
        helper.make_node("Relu", ["h2"], ["h2_relu"], name="act2"),
        helper.make_node("MatMul", ["h2_relu", "W3"], ["y"], name="mm3"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def chains(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("compare")
    for name, model in (("ref", chain()), ("same", chain()), ("pert", chain(w2_scale=1.05)), ("nan", chain(act1="Sqrt"))):
        onnx.save(model, folder / f"{name}.onnx")
    (folder / "in").mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        np.savez(folder / "in" / f"s{i}.npz", x=rng.standard_normal((2, 8)).astype(np.float32))
    return folder


@pytest.fixture
def cli(monkeypatch, capsys):
    """The real command line, in this process (no interpreter start per call): (*args) -> CompletedProcess."""
    from trtforge.cli import app as cli_module

    monkeypatch.setenv("CI", "true")

    def call(*args: str) -> subprocess.CompletedProcess:
        monkeypatch.setattr(sys, "argv", ["trtforge", *args])
        capsys.readouterr()
        try:
            cli_module.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return call


def _compare(chains: Path, target: str, *args: str, cli=run_cli):
    report = chains / f"{target}.{abs(hash(args))}.json"
    report.unlink(missing_ok=True)
    proc = cli(
        "compare", str(chains / f"{target}.onnx"), str(chains / "ref.onnx"), "--inputs", str(chains / "in"), "--report", str(report), *args
    )
    return proc, (json.loads(report.read_text()) if report.exists() else None)


# -- the rule, pure ----------------------------------------------------------------------------------------------


def _row(tensor: str, rel_l2: float, cosine: float = 1.0, nonfinite: int = 0) -> dict:
    return {
        "tensor": tensor,
        "op": "MatMul",
        "node": tensor,
        "rel_l2": rel_l2,
        "cosine": cosine,
        "candidate_nonfinite": nonfinite,
        "values": 10,
    }


def test_first_jump_is_the_first_tensor_in_order_over_a_gate_or_nan():
    gates = [Gate("max_rel_l2", 1e-2, "default for fp16 targets"), Gate("min_cosine", 0.99, "default for fp16 targets")]
    rows = [_row("a", 1e-3), _row("b", 5e-3), _row("c", 2e-2), _row("d", 0.5)]
    assert first_jump(rows, gates)["tensor"] == "c"
    assert first_jump([_row("a", 1e-3), _row("b", 1e-3, cosine=0.9), _row("c", 1.0)], gates)["tensor"] == "b"
    nan = first_jump([_row("a", 1e-3), _row("b", float("nan"), float("nan"), nonfinite=3), _row("c", 1.0)], gates)
    assert nan["tensor"] == "b" and "3 NaN/Inf values of 10" in nan["reasons"][0]
    assert first_jump([_row("a", 1e-3), _row("b", 9e-3)], gates) is None
    assert first_jump([_row("a", float("nan"), float("nan"))], [Gate("min_cosine", 0.99, "set")])["tensor"] == "a"


def test_growth_is_a_tensors_error_over_its_inputs_worst():
    rows = [_row("a", 1e-3), _row("b", 2e-3), _row("c", 4e-2), _row("d", 0.0)]
    growth_factors(rows, {"c": ["a", "b", "W"], "b": ["x"], "d": ["c"]})
    assert [r["growth"] for r in rows] == [None, None, pytest.approx(20.0), 0.0]


def test_a_runtime_failure_on_a_sample_is_one_sentence():
    from trtforge.verify.step import run_sample

    class Broken:
        def run(self, feeds):
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code\nReshape_3: cannot reshape")

    with pytest.raises(UserError, match=r"^the target m.onnx failed on input sample 4 \(RuntimeError: .*cannot reshape\); check"):
        run_sample(Broken(), {}, "the target m.onnx", 4)


def test_outputs_with_a_tolerance_leave_the_default_gates_to_the_others():
    from trtforge.verify.compare import compare_outputs
    from trtforge.verify.step import judge
    from trtforge.verify.tolerances import Tolerance

    rng = np.random.default_rng(0)
    ref = {"a": rng.standard_normal((2, 8)), "b": rng.standard_normal((2, 8))}
    cand = {"a": ref["a"] * 1.05, "b": ref["b"] * 1.05}  # rel-L2 0.05 on both: over fp32's default 1e-4
    tolerances = {"a": Tolerance(atol=1.0)}
    per_output = compare_outputs({"a": None, "b": None}, ref, cand, tolerances=tolerances)
    verdict = judge(per_output, {"a": None, "b": None}, tolerances, {"max_rel_l2": None, "min_cosine": None}, "fp32")
    assert not verdict["passed"] and len(verdict["failures"]) == 1 and "'b'" in verdict["failures"][0]
    assert verdict["checked"][0]["outputs"] == ["b"]
    verdict = judge(per_output, {"a": None, "b": None}, tolerances, {"max_rel_l2": 0.1, "min_cosine": None}, "fp32")
    assert verdict["passed"] and [c["gate"] for c in verdict["checked"]] == ["max_rel_l2"]  # a set gate judges both


# -- the command on the hand-made chain ----------------------------------------------------------------------------


def test_an_unperturbed_copy_passes_layer_wise(chains):
    proc, report = _compare(chains, "same", "--layerwise")
    assert proc.returncode == 0, proc.stderr
    lw = report["layerwise"]
    assert lw["matched"] == 7 and lw["compared"] == 7 and lw["first_jump"] is None
    assert [r["tensor"] for r in lw["rows"]] == CHAIN_TENSORS and all(r["rel_l2"] == 0.0 for r in lw["rows"])
    assert report["precision"] == "fp32" and report["gates"]["checked"][0]["source"] == "default for fp32 targets"
    assert "first tensor over the layer gates (max_rel_l2 0.0001): none" in proc.stdout


def test_layer_wise_names_the_tensor_of_the_perturbed_weight(chains):
    proc, report = _compare(chains, "pert", "--layerwise")
    assert proc.returncode == 1, proc.stderr
    jump = report["layerwise"]["first_jump"]
    assert jump["tensor"] == "h2_mm" and jump["node"] == "mm2"
    statuses = {r["tensor"]: r["status"] for r in report["layerwise"]["rows"]}
    assert [statuses[t] for t in CHAIN_TENSORS[:3]] == ["ok"] * 3
    assert "first tensor over the layer gates (max_rel_l2 0.0001): 'h2_mm' (MatMul node mm2)" in proc.stdout
    assert "rel-L2 of 'y'" in proc.stderr and "Traceback" not in proc.stderr


def test_layer_wise_names_the_node_that_makes_nan(chains):
    proc, report = _compare(chains, "nan", "--layerwise")
    assert proc.returncode == 1, proc.stderr
    jump = report["layerwise"]["first_jump"]
    assert jump["tensor"] == "h1_relu" and jump["target_op"] == "Sqrt" and "NaN/Inf values" in jump["reasons"][0]
    assert "output 'y' of the target has" in proc.stderr


def test_layer_wise_spills_models_over_protobufs_limit_to_disk(chains, monkeypatch):
    """Over 2 GB a model cannot be handed to ONNX Runtime as bytes: the marked copies go to a scratch folder."""
    from trtforge.core import onnxio
    from trtforge.verify import step as compare_step

    saved = []

    def save(model, path, **kw):
        saved.append(path)
        return onnxio.save_onnx(model, path, **kw)

    monkeypatch.setattr(compare_step, "PROTOBUF_LIMIT", 0)
    monkeypatch.setattr(compare_step, "save_onnx", save)
    report = compare(chains / "pert.onnx", chains / "ref.onnx", CompareOptions(inputs=chains / "in", layerwise=True))
    assert report["layerwise"]["first_jump"]["tensor"] == "h2_mm"
    assert [p.name for p in saved] == ["reference.onnx", "target.onnx"] and not saved[0].parent.exists()


def test_without_layerwise_the_outputs_alone_are_judged(chains):
    proc, report = _compare(chains, "pert")
    assert proc.returncode == 1 and "layerwise" not in report
    assert report["per_output"]["y"]["rel_l2"] == pytest.approx(0.05, rel=0.2)
    assert report["gates"]["failures"] == [f for f in report["gates"]["failures"] if "'y'" in f]


def test_tolerances_pass_and_fail_as_set(chains, cli):
    """A tolerance replaces the fp32 default gate (which the 5% weight fails); a set gate still applies."""
    proc, report = _compare(chains, "pert", "--atol", "0.1", cli=cli)
    assert proc.returncode == 0, proc.stderr
    tol = report["per_output"]["y"]["tolerance"]
    assert tol == {**tol, "atol": 0.1, "statistic": "elemwise", "violations": 0, "passed": True}
    assert report["gates"]["checked"] == []
    proc, report = _compare(chains, "pert", "--atol", "y:0.01", cli=cli)
    assert proc.returncode == 1
    assert "output 'y':" in proc.stderr and "outside atol 0.01" in proc.stderr
    proc, report = _compare(chains, "pert", "--rtol", "0.5", "--error-stat", "median", cli=cli)
    assert proc.returncode == 0, proc.stderr
    assert report["per_output"]["y"]["tolerance"]["statistic"] == "median"
    proc, report = _compare(chains, "pert", "--rtol", "1e-4", "--error-stat", "q99", cli=cli)
    assert proc.returncode == 1 and "q99 absolute error" in proc.stderr
    proc, report = _compare(chains, "pert", "--atol", "0.1", "--max-rel-l2", "1e-3", cli=cli)
    assert proc.returncode == 1 and "(max_rel_l2)" in proc.stderr
    assert report["gates"]["checked"][0]["source"] == "set"


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--atol", "y:abc"], ["--atol 'y:abc'"]),
        (["--rtol", "-1"], ["--rtol '-1'"]),
        (["--atol", "logits:0.1"], ["--atol names output 'logits'", "outputs: y"]),
        (["--error-stat", "q150", "--atol", "0.1"], ["--error-stat 'q150'"]),
        (["--error-stat", "max"], ["--error-stat max needs a tolerance"]),
        (["--min-cosine", "2"], ["--min-cosine 2 is outside [-1, 1]"]),
        (["--max-rel-l2", "-1"], ["--max-rel-l2 -1"]),
    ],
)
def test_bad_values_are_one_sentence(chains, cli, args, fragments):
    proc, report = _compare(chains, "pert", *args, cli=cli)
    assert_user_error(proc, *fragments)
    assert report is None


@pytest.mark.parametrize(
    "target, reference, inputs, extra, fragment",
    [
        ("nope.onnx", "ref.onnx", "in", [], "nope.onnx does not exist"),
        ("same.onnx", "gone.onnx", "in", [], "gone.onnx does not exist"),
        ("same.onnx", "ref.onnx", "none", [], "none does not exist"),
        ("model.engine", "ref.onnx", "in", [], "model.engine does not exist"),
        ("same.onnx", "ref.onnx", "in", ["--report", "ref.onnx"], "over its input"),
        ("same.onnx", "ref.onnx", "in", ["--report", "in/s0.npz"], "over a file of its input folder"),
        ("ref.onnx", "ref.onnx", "in", [], "is its own reference"),
    ],
)
def test_missing_files_and_overwrites_are_one_sentence(chains, cli, target, reference, inputs, extra, fragment):
    before = (chains / "ref.onnx").read_bytes()
    proc = cli(
        "compare",
        str(chains / target),
        str(chains / reference),
        "--inputs",
        str(chains / inputs),
        *[str(chains / a) if a.endswith((".onnx", ".json", ".npz")) else a for a in extra],
    )
    assert_user_error(proc, fragment)
    assert (chains / "ref.onnx").read_bytes() == before and not (chains / "in" / "r.json").exists()


def _fake_engine(folder: Path, precision: str = "fp16") -> Path:
    engine = folder / "chain.engine"
    engine.write_bytes(b"not a real engine")
    profile = {"index": 0, "shapes": {"x": {"min": [1, 8], "opt": [2, 8], "max": [4, 8]}}}
    (folder / "chain.engine.json").write_text(
        json.dumps(
            {
                "kind": "engine",
                "backend": "fake",
                "tensorrt_version": "0",
                "precision": precision,
                "engine_bytes": 17,
                "build_seconds": 0.0,
                "profiles": [profile],
                "source_onnx": str(folder / "ref.onnx"),
            }
        )
    )
    return engine


class FakeEngine:
    """ONNX Runtime on a model, standing in for an engine runner."""

    def __init__(self, model: Path):
        self.ort = OrtRunner(model)
        self.input_names, self.output_names, self.closed = self.ort.input_names, self.ort.output_names, False

    def run(self, feeds):
        return self.ort.run(feeds)

    def close(self):
        self.closed = True


def test_an_engine_target_runs_through_its_runner_with_its_precision_gates(chains, tmp_path):
    engine = _fake_engine(tmp_path)
    opened = []

    def runner(path, sidecar):
        opened.append(FakeEngine(chains / ("pert.onnx" if sidecar.get("ruined") else "same.onnx")))
        return opened[-1]

    access = EngineAccess(lambda: (True, "fake"), runner)
    report = compare(engine, chains / "ref.onnx", CompareOptions(inputs=chains / "in"), access)
    assert report["passed"] and report["target_kind"] == "engine" and report["precision"] == "fp16"
    assert [g["source"] for g in report["gates"]["checked"]] == ["default for fp16 targets"] * 2 and opened[0].closed
    side = json.loads((tmp_path / "chain.engine.json").read_text())
    (tmp_path / "chain.engine.json").write_text(json.dumps({**side, "precision": "fp32", "ruined": True}))
    report = compare(engine, chains / "ref.onnx", CompareOptions(inputs=chains / "in"), access)
    assert not report["passed"] and "rel-L2 of 'y'" in report["gates"]["failures"][0]
    with pytest.raises(UserError, match="no TensorRT engine can execute on this machine"):
        compare(engine, chains / "ref.onnx", CompareOptions(inputs=chains / "in"), EngineAccess(lambda: (False, "no GPU"), runner))


def test_an_engine_target_is_refused_where_none_can_execute(chains, tmp_path, cli):
    from trtforge.calibrate.engine_check import runtime_here

    engine = _fake_engine(tmp_path)
    if runtime_here()[0]:
        pytest.skip("this machine executes engines")
    for extra in ([], ["--layerwise"]):
        proc = cli("compare", str(engine), str(chains / "ref.onnx"), "--inputs", str(chains / "in"), *extra)
        assert_user_error(proc, "chain.engine is an engine and no TensorRT engine can execute on this machine")


def test_layerwise_on_an_engine_rebuilds_it_with_the_tensors_marked_as_outputs(chains, tmp_path):
    """A real TensorRT-RTX build of the perturbed chain; ONNX Runtime on the ONNX each engine's sidecar names stands in
    for executing it (no engine executes here). The twin is built from that ONNX with the shared tensors as outputs."""
    require("tensorrt_rtx")
    from trtforge.build.step import build

    engine = build(chains / "pert.onnx", tmp_path / "pert.engine", precision="fp32").engine_path
    twins = []

    def runner(path, sidecar):
        twins.append({"path": Path(path).name, "outputs": [t["name"] for t in sidecar["io"] if t.get("mode") == "output"]})
        return FakeEngine(Path(sidecar["source_onnx"]))

    access = EngineAccess(lambda: (True, "fake"), runner)
    report = compare(engine, chains / "ref.onnx", CompareOptions(inputs=chains / "in", layerwise=True), access)
    layers = report["layerwise"]
    assert not report["passed"] and layers["first_jump"]["tensor"] == "h2_mm" and "twin of pert.engine" in layers["engine"]
    assert [t["path"] for t in twins] == ["pert.engine", "layerwise.engine"]
    assert set(CHAIN_TENSORS) <= set(twins[1]["outputs"]) and twins[0]["outputs"] == ["y"]
    # the deployed engine is left as it was
    assert json.loads((tmp_path / "pert.engine.json").read_text())["source_onnx"].endswith("pert.onnx")


def test_a_built_engine_is_refused_where_none_can_execute(chains, tmp_path, cli):
    """A real engine (TensorRT-RTX builds ahead of time without a GPU) and its real sidecar, on this CPU machine."""
    require("tensorrt_rtx")
    from trtforge.build.step import build
    from trtforge.calibrate.engine_check import runtime_here

    if runtime_here()[0]:
        pytest.skip("this machine executes engines")
    result = build(chains / "ref.onnx", tmp_path / "ref.fp16.engine", "fp16", backend="tensorrt_rtx")
    proc = cli("compare", str(result.engine_path), str(chains / "ref.onnx"), "--inputs", str(chains / "in"))
    assert_user_error(proc, "ref.fp16.engine is an engine and no TensorRT engine can execute on this machine", "compare its ONNX")


# -- a zoo model against its fp16 conversion ---------------------------------------------------------------------


def test_zoo_bert_layer_wise_against_its_fp16_conversion(tmp_path_factory):
    from trtforge.build.precision import prepare_for_build
    from trtforge.core.onnxio import load_onnx, save_onnx
    from trtforge.graph.index import io_specs

    clean = export_zoo(tmp_path_factory.mktemp("zoo"), [("bert", "legacy")])[("bert", "legacy")]
    model = load_onnx(clean)
    specs, axes, _ = io_specs(clean, model)
    fp16, _ = prepare_for_build(model, clean, specs, axes)
    target = save_onnx(fp16, clean.with_name("bert.fp16.onnx"))
    report_path = clean.with_name("compare.json")
    proc = run_cli(
        "compare",
        str(target),
        str(clean),
        "--inputs",
        "calib_data/minilm",
        "--max-samples",
        "3",
        "--layerwise",
        "--report",
        str(report_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["precision"] == "fp16" and report["inputs"]["kind"] == "text"
    assert {n: o["kind"] for n, o in report["outputs"].items()} == {"last_hidden_state": "token", "pooler_output": "pooled"}
    lw = report["layerwise"]
    assert lw["matched"] > 50 and lw["compared"] > 30 and lw["first_jump"] is None
    assert lw["target_tensors"] > lw["matched"]  # the conversion's Casts, matched by no reference name
    assert all(0 < r["rel_l2"] < 1e-2 for r in lw["rows"] if r["op"] in ("MatMul", "Gemm"))
    assert f"layer-wise: {lw['matched']} tensors matched by name" in proc.stdout
    assert "max_rel_l2 0.01 (default for fp16 targets)" in proc.stdout
