"""Issue 9 "builds never lose work": inspection after the engine is written, tolerant inspector JSON,
build-log layer precisions, heartbeat progress, slow-build warning; and which engines run where."""

import json
import re

import pytest
from conftest import require, run_cli

from trtforge.backends.engine_layers import InspectorParseError, parse_inspector_json, parse_layer_log, runs_int8, summarize_layers
from trtforge.backends.tensorrt import BuildProgress
from trtforge.build.profiles import plan_profiles, slow_build_warning, tier_ranges
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.platform import engine_support, rtx_targets

# -- inspector JSON ----------------------------------------------------------------------------------


def test_inspector_json_with_raw_control_characters():
    # TensorRT 8.6 wrote raw control characters inside layer names (ResNet-50: "Invalid control character").
    text = '{"Layers": [{"Name": "conv1\x01 + relu\x1f", "LayerType": "CaskConvolution"}], "Bindings": ["x"]}'
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # what the old code did
    assert parse_inspector_json(text)["Layers"][0]["Name"] == "conv1\x01 + relu\x1f"


def test_inspector_json_repairs_control_characters_outside_strings_and_bad_escapes():
    assert parse_inspector_json('{"Layers":\x02 [{"Name": "a"}]}')["Layers"] == [{"Name": "a"}]
    assert parse_inspector_json('{"Layers": [{"Name": "C:\\q\\layer"}]}')["Layers"][0]["Name"] == "C:\\q\\layer"


@pytest.mark.parametrize("garbage", ["", "not json at all", '{"Layers": [', "\x00\x01\x02", "[1, 2]"])
def test_inspector_json_garbage_raises_one_typed_error(garbage):
    with pytest.raises(InspectorParseError):
        parse_inspector_json(garbage)


# -- the builder's verbose layer log -----------------------------------------------------------------

# SAMPLE INPUT (TensorRT 8.6 format, shortened): the VERBOSE "Engine Layer Information" message of a
# dynamic-shape Q/DQ CNN; dims of dynamic axes are negative, tensor names may hold brackets and commas.
LOG_86 = """Engine Layer Information:
Layer(Reformat): /conv1/input_quantizer/QuantizeLinear, Tactic: 0x00000000000003ea, x[Float(-19,3,-20,-21)] -> /conv1/input_quantizer/QuantizeLinear_output_0[Int8(-19,3,-20,-21)]
Layer(CaskConvolution): /conv1/Conv + /relu/Relu, Tactic: 0x4727434768e46395, /conv1/input_quantizer/QuantizeLinear_output_0[Int8(-19,3,-20,-21)] -> /relu/Relu_output_0[Int8(-19,64,-22,-23)]
Layer(Reformat): Reformatting CopyNode for Input Tensor 0 to {ForeignNode[/fc/MatMul...(Unnamed Layer* 9) [Shuffle]]}, Tactic: 0x0000000000000000, /relu/Relu_output_0[Int8(-19,64,-22,-23)] -> Reformatted Input Tensor 0 to {ForeignNode[/fc/MatMul...(Unnamed Layer* 9) [Shuffle]]}[Half(-19,64,-22,-23)]
Layer(Myelin): {ForeignNode[/fc/MatMul...(Unnamed Layer* 9) [Shuffle]]}, Tactic: 0x0000000000000000, Reformatted Input Tensor 0 to {ForeignNode[/fc/MatMul...(Unnamed Layer* 9) [Shuffle]]}[Half(-19,64,-22,-23)], (Unnamed Layer* 4) [Shuffle]_output[Float(1,1,10)] -> logits[Float(-19,10)]"""

# SAMPLE INPUT (TensorRT 10 / TensorRT-RTX format, shortened from a tensorrt_rtx 1.7 build of a Q/DQ conv).
LOG_RTX = """Layers:
Name: __mye64_0_myl0_0, LayerType: shape_call, Inputs: [], Constants: [], Outputs: [], TacticName: , StreamId: 0, Metadata: 
Name: conv_int8_myl0_2, LayerType: correlation, Inputs: [ { Name: __mye1_myl0, Dimensions: [-1,8,-1,-1], Strides: [-1,1,-1,8], StrideOrder: [3,0,2,1], Datatype: Int8, Format: (NHWC) Channel major format }], Constants: [ { Name: w_const, Dimensions: [16,8,3,3], Strides: [72,1,24,8], StrideOrder: [3,0,2,1], Datatype: Int8, Format: (NHWC) Channel major format }], Outputs: [ { Name: y, Dimensions: [-1,16,-1,-1], Strides: [-1,1,-1,16], StrideOrder: [3,0,2,1], Datatype: Float, Format: (NHWC) Channel major format }], TacticName: __myelin_CASK_STUB, StreamId: 0, Metadata: [ONNX Layer: conv_int8]"""


def test_layer_log_86_gives_precisions_where_the_inspector_says_na():
    layers = parse_layer_log("[V] [TRT] " + LOG_86)
    assert [l["LayerType"] for l in layers] == ["Reformat", "CaskConvolution", "Reformat", "Myelin"]
    conv = layers[1]
    assert conv["Name"] == "/conv1/Conv + /relu/Relu"
    assert conv["Inputs"][0]["Datatype"] == "Int8" and conv["Outputs"][0]["Dimensions"] == [-19, 64, -22, -23]
    myelin = layers[3]
    assert [t["Datatype"] for t in myelin["Inputs"]] == ["Half", "Float"] and myelin["Outputs"][0]["Name"] == "logits"
    summary = summarize_layers(layers)
    assert summary["int8_layers"] == ["/conv1/Conv + /relu/Relu"]  # the dequantizing reformat does not count
    assert summary["by_precision"] == {"Int8": 2, "Half": 1, "Float": 1}


def test_layer_log_rtx_format_and_inspector_na():
    layers = parse_layer_log(LOG_RTX)
    assert [l["Name"] for l in layers] == ["__mye64_0_myl0_0", "conv_int8_myl0_2"]
    assert runs_int8(layers[1]) and not runs_int8(layers[0])
    assert layers[1]["Outputs"] == [{"Name": "y", "Datatype": "Float", "Dimensions": [-1, 16, -1, -1]}]
    # The 8.6 inspector without concrete shapes: precision unknown, not a made-up one.
    na = [
        {
            "Name": "c",
            "LayerType": "Convolution",
            "Inputs": [{"Format/Datatype": "N/A due to dynamic shapes"}],
            "Outputs": [{"Format/Datatype": "N/A due to dynamic shapes"}],
        }
    ]
    summary = summarize_layers(na)
    assert (summary["by_type"], summary["by_precision"], summary["int8_layers"]) == ({"Convolution": 1}, {"unknown": 1}, [])
    assert parse_layer_log("garbage\nLayer(: broken") == []


# -- progress ----------------------------------------------------------------------------------------


def test_progress_follows_the_monitor_phases():
    """Phase events as tensorrt_rtx 1.7 reported them for a 2-profile build (captured, shortened)."""
    progress = BuildProgress(profiles=2)
    assert "no per-profile progress" in progress.describe()  # TensorRT 8.6: no monitor, only the clock
    progress.phase_start("Building engine", 6)
    progress.phase_start("Computing profile costs", 10)
    progress.phase_start("Timing tactics", 3)
    progress.step_complete("Timing tactics", 0)
    assert progress.describe() == "profile 1 of 2, Timing tactics 1/3"
    progress.phase_finish("Timing tactics")
    for step in range(5):
        progress.step_complete("Computing profile costs", step)
    assert progress.profile == 2 and progress.describe() == "profile 2 of 2, Computing profile costs 5/10"
    progress.step_complete("Computing profile costs", 9)
    assert progress.profile == 2


# -- slow build warning ------------------------------------------------------------------------------


def _image_profiles(batch_max: int, tiers: list[int]):
    specs = [InputSpec(name="x", dtype="float32", shape=["batch", 3, "height", "width"])]
    axes = {
        "batch": AxisRange(min=1, opt=1, max=batch_max),
        "height": AxisRange(min=64, opt=512, max=1024),
        "width": AxisRange(min=64, opt=512, max=1024),
    }
    plan = {a: tier_ranges(tiers, axes[a], a) for a in ("height", "width")}
    return plan_profiles(specs, axes, plan)


def test_slow_build_warning_names_cause_and_remedies():
    warning = slow_build_warning(_image_profiles(1, [256, 1024]))  # DeepLabV3 of issue 9
    assert warning is not None and "\n" not in warning
    for fragment in (
        "4 optimization profiles",
        "input 'x' 1x3x1024x1024",
        "fewer tiers",
        "smaller max",
        "--optimization-level",
        "--timing-cache",
    ):
        assert fragment in warning, warning
    assert slow_build_warning(_image_profiles(1, [1024])) is None  # one profile up to 1024x1024
    specs = [InputSpec(name="input_ids", dtype="int64", shape=["batch", "seq"])]
    axes = {"batch": AxisRange(min=1, opt=8, max=32), "seq": AxisRange(min=1, opt=128, max=512)}
    minilm = plan_profiles(specs, axes, {"seq": tier_ranges([128, 256, 512], axes["seq"], "seq")})
    assert slow_build_warning(minilm) is None


# -- which engines run where -------------------------------------------------------------------------


def _gpu(cc: str, name: str = "GPU"):
    return {"name": name, "compute_capability": cc, "memory_gib": 24.0, "count": 1}


def test_engine_support_per_flavour_and_compute_capability():
    rtx_only = dict(tensorrt=False, tensorrt_rtx=True, cuda_python=True)
    assert engine_support(_gpu("8.9", "RTX 4090"), **rtx_only)["tensorrt_rtx"] == (True, "yes: on RTX 4090 (compute capability 8.9)")
    assert engine_support(_gpu("12.0"), **rtx_only)["tensorrt_rtx"][0]
    ok, why = engine_support(_gpu("9.0", "NVIDIA H200"), **rtx_only)["tensorrt_rtx"]
    assert not ok and "does not support compute capability 9.0 (NVIDIA H200)" in why
    assert engine_support(None, **rtx_only)["tensorrt_rtx"] == (False, "no: no CUDA GPU found")
    assert "cuda-python" in engine_support(_gpu("8.9"), False, True, False)["tensorrt_rtx"][1]
    both = engine_support(_gpu("9.0"), True, True, True)
    assert both["tensorrt"][0] and not both["tensorrt_rtx"][0]
    assert not engine_support(_gpu("8.6"), False, False, True)["tensorrt"][0]


def test_rtx_targets_from_the_installed_module():
    class FakeRtx:
        class ComputeCapability:
            __members__ = {"NONE": 0, "CURRENT": 1, "SM75": 2, "SM86": 3, "SM120": 4}

    assert rtx_targets(FakeRtx) == ("7.5", "8.6", "12.0")
    assert "8.9" in rtx_targets(None)


def test_pipeline_runs_rtx_engines_on_a_supported_gpu(monkeypatch):
    """The defect: a GPU with only TensorRT-RTX was treated as unable to run engines."""
    require("tensorrt_rtx")
    pytest.importorskip("cuda.bindings")
    import trtforge.core.platform as doctor
    from trtforge.pipeline import _engine_runs_here

    monkeypatch.setattr(doctor, "trt_module", lambda name: None if name == "tensorrt" else __import__(name))
    monkeypatch.setattr(doctor, "gpu_info", lambda: _gpu("8.9", "RTX 4090"))
    assert _engine_runs_here()
    monkeypatch.setattr(doctor, "gpu_info", lambda: _gpu("9.0", "NVIDIA H200"))
    assert not _engine_runs_here()


# -- real builds with tensorrt-rtx (CPU) -------------------------------------------------------------


def _conv_onnx(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c"], ["y"], name="relu0"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, "h", "w"])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_engine_is_kept_when_the_inspector_fails(tmp_path, monkeypatch):
    require("tensorrt_rtx")
    import trtforge.build.step as build_mod

    def broken_inspector(*_args, **_kwargs):
        raise json.JSONDecodeError("Invalid control character at", "{\x01}", 1)

    monkeypatch.setattr("trtforge.build.engine_record.engine_layers", broken_inspector)
    warnings: list[str] = []
    engine = tmp_path / "c.engine"
    result = build_mod.build(_conv_onnx(tmp_path / "c.onnx"), engine, warn=warnings.append)
    side = json.loads((tmp_path / "c.engine.json").read_text())
    assert engine.stat().st_size == side["engine_bytes"] > 0 and result.engine_path == engine
    assert "Invalid control character" in side["inspector"]["error"]
    assert len(warnings) == 1 and "engine inspector failed" in warnings[0] and "\n" not in warnings[0]
    # Layer precisions still come from the builder's verbose log.
    assert side["layer_source"] == "build log" and side["layer_summary"]["by_precision"].get("Float")
    layers = json.loads((tmp_path / "c.engine.layers.json").read_text())
    assert layers["inspector"]["error"] == side["inspector"]["error"] and layers["layers"]


def test_heartbeat_lines_under_ci(tmp_path):
    require("tensorrt_rtx")
    onnx_path = _conv_onnx(tmp_path / "c.onnx")
    proc = run_cli("build", str(onnx_path), "--tiers", "h=16,64", "-o", str(tmp_path / "c.engine"), env={"TRTFORGE_HEARTBEAT_S": "0.01"})
    assert proc.returncode == 0, proc.stderr
    beats = [l for l in proc.stderr.splitlines() if re.fullmatch(r"building c\.onnx: \d+ s elapsed, .*", l)]
    assert beats and all(re.search(r"profile [12] of 2", l) for l in beats), proc.stderr
    proc = run_cli("inspect", str(tmp_path / "c.engine"))
    assert proc.returncode == 0 and "layers running INT8: 0" in proc.stdout and "from the build log" in proc.stdout
