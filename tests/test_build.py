"""`trtforge build` with tensorrt-rtx, which builds ahead of time without a GPU."""

import json
from pathlib import Path

import pytest
from conftest import FIXTURES, assert_user_error, require, run_cli

from trtforge.build.engine_record import check_engine_compat
from trtforge.build.step import parse_tiers
from trtforge.core.config import AxisRange
from trtforge.core.errors import UserError

require("tensorrt_rtx")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_minilm_engine_three_tiers(minilm_clean, tmp_path, precision):
    engine = tmp_path / f"minilm.{precision}.engine"
    proc = run_cli("build", str(minilm_clean), "--precision", precision, "--tiers", "128,256,512", "-o", str(engine), "--json")
    assert proc.returncode == 0, proc.stderr
    side = json.loads(engine.with_name(engine.name + ".json").read_text())
    assert engine.stat().st_size == side["engine_bytes"] > 1_000_000
    assert side["backend"] == "tensorrt_rtx" and side["precision"] == precision and side["strongly_typed"]
    ranges = [p["axes"]["seq"][0::2] for p in side["profiles"]]
    assert ranges == [[1, 128], [129, 256], [257, 512]]
    assert side["profiles"][1]["shapes"]["input_ids"] == {"min": [1, 129], "opt": [8, 256], "max": [32, 256]}
    io = {t["name"]: t for t in side["io"]}
    assert io["input_ids"]["dtype"] == "int64" and io["last_hidden_state"]["mode"] == "output"
    assert io["last_hidden_state"]["dtype"] == "float32"  # fp16 keeps fp32 I/O
    assert len(side["source_onnx_sha256"]) == 64 and side["source_graph_hash"]
    assert side["build_seconds"] > 0 and side["target_compute_capabilities"]
    if precision == "fp16":
        report = side["precision_report"]
        assert report["fp16_nodes"] > 100 and "LayerNormalization" in json.dumps(report["kept_fp32"])
        built = tmp_path / "minilm.fp16.onnx"
        assert built.is_file() and side["built_onnx"] == str(built)
    else:
        assert side["built_onnx"] == str(minilm_clean)
    # TensorRT-RTX engines cannot be deserialized without a GPU: the sidecar says so instead of failing.
    assert side["layer_info"] or "cannot deserialize" in side["layer_info_unavailable"]
    proc = run_cli("inspect", str(engine))
    assert proc.returncode == 0 and "optimization profiles" in proc.stdout


def test_timing_cache_is_a_noop_on_rtx(minilm_clean, tmp_path):
    proc = run_cli(
        "build",
        str(minilm_clean),
        "--tiers",
        "seq=64",
        "--timing-cache",
        str(tmp_path / "tc.bin"),
        "--compute-capability",
        "SM86",
        "-o",
        str(tmp_path / "e.engine"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "no-op" in proc.stdout and not (tmp_path / "tc.bin").exists()
    side = json.loads((tmp_path / "e.engine.json").read_text())
    assert side["target_compute_capabilities"] == ["SM86"]


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--tiers", "128,1024"], ["axis 'seq'", "leave its range 1..512"]),
        (["--tiers", "256,128"], ["strictly increasing"]),
        (["--tiers", "tokens=128"], ["axis 'tokens'", "batch, seq"]),
        (["--tiers", "12a"], ["comma-separated integers"]),
        (["--tiers", "auto"], ["--lengths"]),
        (["--precision", "int8"], ["no Q/DQ nodes", "trtforge calibrate"]),
        (["--precision", "fp8"], ["--precision must be 'fp32', 'fp16', 'int8' or 'best', got 'fp8'"]),
        (["--compute-capability", "SM1000"], ["SM1000"]),
        (["--backend", "cuda"], ["--backend must be one of auto, tensorrt, tensorrt_rtx, got 'cuda'"]),
    ],
)
def test_build_bad_input(minilm_clean, tmp_path, args, fragments):
    proc = run_cli("build", str(minilm_clean), "-o", str(tmp_path / "x.engine"), *args)
    assert_user_error(proc, *fragments)
    assert not (tmp_path / "x.engine").exists()


def test_auto_tiers_from_lengths_file(minilm_clean, tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in [12, 20, 31, 40, 55, 90, 130, 180, 300, 420] * 5))
    proc = run_cli(
        "build",
        str(minilm_clean),
        "--tiers",
        "auto",
        "--tier-count",
        "3",
        "--lengths",
        str(lengths),
        "-o",
        str(tmp_path / "a.engine"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    profiles = json.loads(proc.stdout)["profiles"]
    bounds = [p["axes"]["seq"][2] for p in profiles]
    assert bounds[-1] == 512 and all(b % 8 == 0 for b in bounds) and len(bounds) == 3


def test_baked_reshape_names_profile_and_tensor(tmp_path):
    onnx_path = tmp_path / "baked.onnx"
    proc = run_cli("export", "--config", str(FIXTURES / "transformer.yaml"), "--no-check", "-o", str(onnx_path))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("build", str(onnx_path), "--tiers", "8,16,64", "-o", str(tmp_path / "b.engine"))
    line = assert_user_error(proc, "profile 0", "layer '/layer/self_attn/Reshape_4'", "tensor '", "--exporter dynamo")
    assert "seq 1..8" in line
    assert not (tmp_path / "b.engine").exists()


def test_build_corrupt_onnx(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x12\x34not an onnx file")
    assert_user_error(run_cli("build", str(bad)), "bad.onnx")


def test_parse_tiers_default_axis_and_config():
    axes = {"batch": AxisRange(min=1, opt=8, max=32), "seq": AxisRange(min=1, opt=128, max=512)}
    assert [t.max for t in parse_tiers("128,512", {}, axes)["seq"]] == [128, 512]
    assert [t.max for t in parse_tiers(None, {"seq": [256, 512]}, axes)["seq"]] == [256, 512]
    both = parse_tiers("seq=128,512;batch=4,32", {}, axes)
    assert [t.max for t in both["batch"]] == [4, 32]
    img = {"batch": AxisRange(min=1, opt=1, max=4), "h": AxisRange(min=1, opt=8, max=64), "w": AxisRange(min=1, opt=8, max=64)}
    with pytest.raises(UserError, match="must name its axis"):
        parse_tiers("16,64", {}, img)


def _side(**kw):
    base = {
        "kind": "engine",
        "backend": "tensorrt",
        "tensorrt_version": "8.6.0",
        "compute_capability": "9.0",
        "gpu": "NVIDIA H200",
        "build_options": {"hardware_compatibility": "none", "version_compatible": False},
    }
    base.update(kw)
    return base


def test_engine_compat_refuses_other_version_and_gpu(tmp_path):
    here = {"backend": "tensorrt", "version": "8.6.0", "gpu": "NVIDIA H200", "compute_capability": "9.0"}
    check_engine_compat(tmp_path / "e.engine", _side(), here)
    with pytest.raises(UserError, match="built with TensorRT 10.3.0 but this runtime is 8.6.0"):
        check_engine_compat(tmp_path / "e.engine", _side(tensorrt_version="10.3.0"), here)
    with pytest.raises(UserError, match="compute capability 8.0 .*this GPU is 9.0"):
        check_engine_compat(tmp_path / "e.engine", _side(compute_capability="8.0", gpu="A100"), here)
    with pytest.raises(UserError, match="built with tensorrt_rtx"):
        check_engine_compat(tmp_path / "e.engine", _side(backend="tensorrt_rtx"), here)
    # Hardware-compatible engines are allowed across compute capabilities.
    check_engine_compat(
        tmp_path / "e.engine", _side(compute_capability="8.0", build_options={"hardware_compatibility": "ampere_plus"}), here
    )


def test_minilm_int8_engine_three_tiers(minilm_int8, tmp_path):
    """The issue's done-when: `trtforge build out/minilm.int8.onnx --tiers 128,256,512` builds in CI."""
    int8, _ = minilm_int8
    engine = tmp_path / "minilm.int8.engine"
    proc = run_cli("build", str(int8), "--tiers", "128,256,512", "-o", str(engine), "--json")
    assert proc.returncode == 0, proc.stderr
    side = json.loads(proc.stdout)
    assert side["precision"] == "int8" and len(side["profiles"]) == 3  # int8 chosen because the model holds Q/DQ
    assert side["calibration_cache_sha256"] and side["reference_onnx"].endswith("minilm.clean.onnx")
    proc = run_cli("build", str(int8), "--tiers", "128,512", "--precision", "best", "-o", str(tmp_path / "best.engine"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["precision_report"]["fp16_nodes"] > 100


def test_parser_error_names_the_node(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("FancyOp", ["a"], ["y"], name="fancy_layer", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    path = tmp_path / "badop.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]), path)
    proc = run_cli("build", str(path), "-o", str(tmp_path / "b.engine"))
    assert_user_error(proc, "ONNX parser rejected badop.onnx", "node 'fancy_layer' (FancyOp)")
    assert not (tmp_path / "b.engine").exists()


def test_a_build_never_writes_over_the_onnx_it_builds_or_its_parents(minilm_onnx, minilm_clean, tmp_path):
    """The fp16 graph a build converts goes beside the engine as ENGINE_STEM.onnx, unless that is the ONNX being
    built, one it was made from (however its sidecar recorded the parent: relative to another folder, without a sidecar
    of its own, behind a symlink), or a file no build wrote: then ENGINE_STEM.PRECISION.onnx (`build m.onnx -o m.engine`
    used to replace m.onnx itself). An engine path that is the source or a parent is refused (exit 2)."""
    import hashlib
    import shutil

    def digest(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    a = tmp_path / "a"
    a.mkdir()
    clean_side = json.loads(minilm_clean.with_name(minilm_clean.name + ".json").read_text())

    def artifact(name, source, **side):
        shutil.copy(source, a / name)
        (a / f"{name}.json").write_text(json.dumps({**clean_side, **side}))

    shutil.copy(minilm_onnx, a / "m.onnx")  # the export: its sidecar is deleted below, the parent link stays
    artifact("m.clean.onnx", minilm_clean, parent="m.onnx")  # recorded relative, as typed in folder a
    artifact("x.onnx", minilm_clean, step="precision", parent="m.clean.onnx")  # an earlier build's converted graph...
    artifact("y.onnx", minilm_clean, parent="x.onnx")  # ...that a later ONNX was made from
    (a / "other.onnx").write_bytes(b"a file of the user's, no sidecar")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "s.onnx").symlink_to(a / "m.clean.onnx")  # no sidecar beside the link
    names = ("m.onnx", "m.clean.onnx", "x.onnx", "y.onnx", "other.onnx")
    before = {name: digest(a / name) for name in names}
    common = ("--precision", "fp16", "--tiers", "64", "--fuse-attention", "off")
    cases = (
        ("a/m.clean.onnx", "m.clean.engine", "m.clean.fp16.onnx"),  # the source's own name
        ("a/m.clean.onnx", "m.engine", "m.fp16.onnx"),  # its parent's, recorded relative to folder a
        ("a/y.onnx", "x.engine", "x.fp16.onnx"),  # a parent that an earlier build wrote
        ("link/s.onnx", "m.engine", "m.fp16.onnx"),  # through a symlink to m.clean.onnx
        ("a/m.clean.onnx", "other.engine", "other.fp16.onnx"),  # a file no build wrote
        ("a/m.clean.onnx", "free.engine", "free.onnx"),  # nothing there: the usual name
        ("a/m.clean.onnx", "free.engine", "free.onnx"),
    )  # its own earlier output: replaced
    for source, engine, converted in cases:  # run from tmp_path, not from folder a
        proc = run_cli("build", source, *common, "-o", f"a/{engine}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        side = json.loads((a / (engine + ".json")).read_text())
        built = side["built_onnx"]
        assert built == f"a/{converted}" and (a / converted).is_file(), (source, engine, built)
        recorded = [side["source_onnx"], side["reference_onnx"], json.loads((a / f"{converted}.json").read_text())["parent"]]
        assert all(Path(p).is_absolute() and Path(p).resolve() == (tmp_path / source).resolve() for p in recorded), recorded
    assert {name: digest(a / name) for name in names} == before
    (a / "m.onnx.json").unlink(missing_ok=True)
    for source, engine, what in (
        ("a/m.clean.onnx", "a/m.onnx", "which its input a/m.clean.onnx was made from"),
        ("link/s.onnx", "a/m.onnx", "which its input link/s.onnx was made from"),
        ("a/y.onnx", "a/x.onnx", "which its input a/y.onnx was made from"),
        ("a/y.onnx", "a/y.onnx", "over its input a/y.onnx"),
    ):
        assert_user_error(run_cli("build", source, *common, "-o", engine, cwd=tmp_path), f"build would write {engine} over", what)
    assert {name: digest(a / name) for name in names} == before
