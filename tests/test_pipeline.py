"""`trtforge pipeline` on tiny-fcn: every step, skipping unchanged steps, --from/--only, gates."""

import json
import shutil

import pytest
from conftest import ROOT, assert_user_error, require, run_cli

require("tensorrt_rtx")


def _statuses(report):
    return {s["step"]: s["status"] for s in report["steps"]}


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    proc = run_cli("pipeline", "configs/tiny-fcn.yaml", "--out-dir", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert _statuses(report) == {s: "ran" for s in ("export", "clean", "calibrate", "build", "run")}
    return out


def test_all_steps_ran_and_wrote_their_files(pipeline_dir):
    for name in (
        "tiny-fcn.onnx",
        "tiny-fcn.clean.onnx",
        "tiny-fcn.int8.onnx",
        "tiny-fcn.calib.cache",
        "tiny-fcn.fp16.engine",
        "tiny-fcn.run.json",
        "tiny-fcn.pipeline.json",
    ):
        assert (pipeline_dir / name).is_file(), name
    run = json.loads((pipeline_dir / "tiny-fcn.run.json").read_text())
    assert run["gates"]["passed"] and run["chunking_error"]["worst"]["rel_l2"] < 1e-5


def test_second_run_skips_every_step(pipeline_dir):
    proc = run_cli("pipeline", "configs/tiny-fcn.yaml", "--out-dir", str(pipeline_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    assert set(_statuses(json.loads(proc.stdout)).values()) == {"skipped"}


def test_changed_input_reruns_that_step_and_what_depends_on_it(pipeline_dir, tmp_path):
    out = tmp_path / "p"
    shutil.copytree(pipeline_dir, out)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text((ROOT / "configs" / "tiny-fcn.yaml").read_text().replace("overlap: 16", "overlap: 24"))
    report = json.loads(run_cli("pipeline", str(cfg), "--out-dir", str(out), "--json").stdout)
    assert _statuses(report) == {"export": "skipped", "clean": "skipped", "calibrate": "skipped", "build": "skipped", "run": "ran"}
    # A corrupted intermediate file changes its hash: the steps after it run again.
    (out / "tiny-fcn.onnx").write_bytes((out / "tiny-fcn.onnx").read_bytes())  # same bytes: still skipped
    report = json.loads(run_cli("pipeline", str(cfg), "--out-dir", str(out), "--json").stdout)
    assert _statuses(report)["clean"] == "skipped"


def test_from_and_only(pipeline_dir, tmp_path):
    out = tmp_path / "p"
    shutil.copytree(pipeline_dir, out)
    report = json.loads(run_cli("pipeline", "configs/tiny-fcn.yaml", "--out-dir", str(out), "--from", "build", "--json").stdout)
    assert _statuses(report) == {"export": "not-run", "clean": "not-run", "calibrate": "not-run", "build": "ran", "run": "skipped"}
    report = json.loads(run_cli("pipeline", "configs/tiny-fcn.yaml", "--out-dir", str(out), "--only", "clean", "--json").stdout)
    assert _statuses(report)["clean"] == "ran" and _statuses(report)["build"] == "not-run"
    assert_user_error(
        run_cli("pipeline", "configs/tiny-fcn.yaml", "--out-dir", str(out), "--only", "deploy"), "--only 'deploy' is not a step"
    )


def test_only_a_step_whose_input_is_missing(tmp_path):
    proc = run_cli("pipeline", "configs/tiny-fcn.yaml", "--out-dir", str(tmp_path), "--only", "build")
    assert_user_error(proc, "pipeline step 'build'", "tiny-fcn.clean.onnx")


def test_gate_failure_exits_1_and_later_steps_still_run(pipeline_dir, tmp_path):
    out = tmp_path / "p"
    shutil.copytree(pipeline_dir, out)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text((ROOT / "configs" / "tiny-fcn.yaml").read_text().replace("min_cosine: 0.98", "min_cosine: 1.0"))
    proc = run_cli("pipeline", str(cfg), "--out-dir", str(out), "--json")
    assert proc.returncode == 1
    statuses = _statuses(json.loads(proc.stdout))
    assert statuses["calibrate"] == "gate-failed" and statuses["build"] in ("ran", "skipped") and statuses["run"] in ("ran", "skipped")
    # A failed gate is never skipped next time.
    assert _statuses(json.loads(run_cli("pipeline", str(cfg), "--out-dir", str(out), "--json").stdout))["calibrate"] == "gate-failed"


def test_misspelled_key_in_pipeline_config(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text((ROOT / "configs" / "tiny-fcn.yaml").read_text().replace("overlap: 16", "overlp: 16"))
    assert_user_error(run_cli("pipeline", str(cfg), "--out-dir", str(tmp_path)), "'run.overlp'", "did you mean 'overlap'")


def test_the_build_steps_fingerprint_covers_calib_datas_files(tmp_path):
    """build.calib_data's files set the fp16 magnitudes and FP8 scales: new files there must rebuild the engine, as
    calibrate's data does for the INT8 scales."""
    import shutil

    from trtforge.core.config import apply_overrides, load_config
    from trtforge.pipeline import Pipeline

    data = tmp_path / "data"
    shutil.copytree(ROOT / "calib_data" / "tiny_fcn", data)
    cfg = apply_overrides(load_config(ROOT / "configs" / "tiny-fcn.yaml"), {"build.calib_data": str(data)})
    pipe = Pipeline(cfg, tmp_path / "out", backend="auto")
    pipe.paths["clean"].parent.mkdir(parents=True, exist_ok=True)
    pipe.paths["clean"].write_bytes(b"stand-in for the cleaned ONNX")
    before = pipe._fp("build")
    assert pipe._fp("build") == before
    first = sorted(p for p in data.iterdir() if p.is_file())[0]
    first.write_bytes(first.read_bytes()[::-1])
    assert pipe._fp("build") != before
    # without build.calib_data they come from the calibration cache's data: calibrate.data's files count too
    calib = tmp_path / "calib"
    shutil.copytree(ROOT / "calib_data" / "tiny_fcn", calib)
    pipe = Pipeline(
        apply_overrides(load_config(ROOT / "configs" / "tiny-fcn.yaml"), {"calibrate.data": str(calib)}), tmp_path / "out", backend="auto"
    )
    before = pipe._fp("build")
    first = sorted(p for p in calib.iterdir() if p.is_file())[0]
    first.write_bytes(first.read_bytes()[::-1])
    assert pipe._fp("build") != before


def test_a_build_section_that_contradicts_itself_fails_before_the_export(tmp_path):
    """build.fp8_chain_ffn: on without FP8 GEMMs cannot build: the pipeline says so (exit 2) before it exports,
    cleans and calibrates."""
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "tiny-fcn.yaml").read_text())
    cfg.setdefault("build", {})["fp8_chain_ffn"] = "on"
    path = tmp_path / "tiny-fcn.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli("pipeline", str(path), "--out-dir", str(tmp_path / "out"))
    assert_user_error(proc, "--fp8-chain-ffn on (config key build.fp8_chain_ffn)", "--gemm-precision fp8")
    assert not list((tmp_path / "out").glob("*.onnx"))  # nothing exported
