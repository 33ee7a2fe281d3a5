"""Engine re-check (issue 10): calibrate's held-out gate measured again on the engine, beside ORT's figure.

No GPU here: the real runtime is absent, so the skip message is tested for real and the engine is a
fake injected through EngineHooks (ONNX Runtime on the fp32 model, honest or with its outputs ruined).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, require, run_cli

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate import engine_check
from trtforge.calibrate.engine_check import SKIPPED, EngineHooks
from trtforge.calibrate.options import CalibrateOptions, gate_failures
from trtforge.calibrate.step import calibrate
from trtforge.core.onnxio import load_onnx

DATA = ROOT / "calib_data" / "tiny_fcn"


class FakeEngine:
    """ONNX Runtime on a model, standing in for a TensorRT engine; `ruin` replaces its outputs by noise,
    as TensorRT 8.6 did to a Q/DQ BERT (engine cosine 0.74 where ORT gave 0.9998)."""

    def __init__(self, onnx_path: Path, ruin: bool):
        self.ort = OrtRunner(load_onnx(onnx_path).SerializeToString())
        self.input_names, self.output_names, self.ruin = self.ort.input_names, self.ort.output_names[::-1], ruin
        self.calls = 0

    def run(self, feeds):
        self.calls += 1
        out = self.ort.run(feeds)
        rng = np.random.default_rng(self.calls)
        return {k: rng.standard_normal(v.shape).astype(np.float32) if self.ruin else v for k, v in out.items()}


def _hooks(reference: Path, ruin: bool, built: list) -> EngineHooks:
    def build(onnx_path):
        built.append(onnx_path)
        engine = onnx_path.with_name("fake.engine")
        return engine, {"backend": "fake", "tensorrt_version": "0", "precision": "best", "source_onnx": str(onnx_path)}

    return EngineHooks(lambda: (True, "fake"), build, lambda engine, side: FakeEngine(reference, ruin))


def _options(tmp_path, **kw) -> CalibrateOptions:
    return CalibrateOptions(data=DATA, method="percentile", min_cosine=0.95, fallback=False, output=tmp_path / "fcn.int8.onnx", **kw)


@pytest.fixture
def no_runtime(monkeypatch):
    """What this machine is (no GPU): pinned so that the test means the same on a GPU machine."""
    monkeypatch.setattr(engine_check, "runtime_here", lambda: (False, "tensorrt: no CUDA GPU found"))


def test_engine_failing_the_gate_fails_calibrate_even_though_ort_passes(tiny_fcn_clean, tmp_path):
    built: list = []
    result = calibrate(tiny_fcn_clean, _options(tmp_path), engine_hooks=_hooks(tiny_fcn_clean, ruin=True, built=built))
    side = result.sidecar
    assert built == [tmp_path / "fcn.int8.onnx"]  # the engine is built from the Q/DQ ONNX just written
    assert side["accuracy"]["mean_cosine"] >= 0.95  # ORT passes
    check = side["engine_check"]
    assert check["status"] == "failed" and check["engine"]["mean_cosine"] < 0.5
    rows = {r[0]: r[1:] for r in check["rows"]}
    assert rows["mean cosine"][0] == pytest.approx(side["accuracy"]["mean_cosine"]) and rows["mean cosine"][2] == ">= 0.95"
    failures = gate_failures(side, _options(tmp_path))
    assert len(failures) == 2 and failures[0].startswith("on the TensorRT engine fake.engine: INT8 mean cosine")
    assert failures[1].startswith("ONNX Runtime passes") and f"trtforge bisect {tiny_fcn_clean} --data {DATA}" in failures[1]
    assert json.loads((tmp_path / "fcn.int8.onnx.json").read_text())["engine_check"]["status"] == "failed"


def test_engine_equal_to_ort_passes_with_figures_side_by_side(tiny_fcn_clean, tmp_path):
    int8 = tmp_path / "fcn.int8.onnx"
    result = calibrate(tiny_fcn_clean, _options(tmp_path), engine_hooks=_hooks(int8, ruin=False, built=[]))
    check = result.sidecar["engine_check"]
    assert check["status"] == "passed" and check["failures"] == []
    assert check["engine"]["mean_cosine"] == pytest.approx(result.sidecar["accuracy"]["mean_cosine"], abs=1e-6)
    assert check["engine"]["samples"] == result.sidecar["accuracy"]["samples"]
    assert gate_failures(result.sidecar, _options(tmp_path)) == []


def test_a_q_dq_onnx_that_does_not_build_fails_the_check(tiny_fcn_clean, tmp_path):
    from trtforge.core.errors import UserError

    def no_build(onnx_path):
        raise UserError("the tensorrt 8.6.0 ONNX parser rejected fcn.int8.onnx: node 'q' (QuantizeLinear): unsupported")

    hooks = EngineHooks(lambda: (True, "tensorrt"), no_build, lambda engine, side: None)
    result = calibrate(tiny_fcn_clean, _options(tmp_path), engine_hooks=hooks)
    check = result.sidecar["engine_check"]
    assert (
        check["status"] == "failed"
        and "could not build an engine from fcn.int8.onnx: the tensorrt 8.6.0 ONNX parser" in check["failures"][0]
    )
    assert gate_failures(result.sidecar, _options(tmp_path)) == check["failures"]
    assert engine_check.render_lines(check)[0].startswith("engine re-check: FAILED: the engine re-check could not build")


def test_build_rechecks_an_engine_from_calibrate_and_only_such(tiny_fcn_clean, tmp_path):
    result = calibrate(tiny_fcn_clean, _options(tmp_path, engine_check=False))
    assert result.sidecar["engine_check"]["status"] == "skipped"
    int8 = tmp_path / "fcn.int8.onnx"
    engine = tmp_path / "fcn.best.engine"
    side = {"precision": "best", "source_onnx": str(int8), "backend": "fake", "tensorrt_version": "0"}
    check = engine_check.after_build(engine, side, _hooks(tiny_fcn_clean, ruin=True, built=[]))
    assert check["status"] == "failed" and check["engine_path"] == str(engine)  # data and gate from calibrate's sidecar
    assert engine_check.after_build(engine, dict(side, precision="fp16"), _hooks(tiny_fcn_clean, True, [])) is None
    assert engine_check.after_build(engine, dict(side, source_onnx=str(tiny_fcn_clean)), _hooks(tiny_fcn_clean, True, [])) is None
    # Held-out data gone (the ONNX copied to another machine): skipped, saying so, never an error after the build.
    int8_side = json.loads((tmp_path / "fcn.int8.onnx.json").read_text())
    int8_side["held_out"]["data"] = str(tmp_path / "gone")
    (tmp_path / "fcn.int8.onnx.json").write_text(json.dumps(int8_side))
    check = engine_check.after_build(engine, side, _hooks(tiny_fcn_clean, ruin=True, built=[]))
    assert check["status"] == "skipped" and "gone" in check["reason"] and check["message"].endswith("(held-out data not found)")


def test_cli_exits_1_when_only_the_engine_fails(tiny_fcn_clean, tmp_path, monkeypatch, capsys):
    from trtforge.cli import app as cli

    monkeypatch.setattr("trtforge.calibrate.recheck.default_hooks", lambda *a: _hooks(tiny_fcn_clean, ruin=True, built=[]))
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "trtforge",
            "calibrate",
            str(tiny_fcn_clean),
            "--data",
            str(DATA),
            "--method",
            "percentile",
            "--min-cosine",
            "0.95",
            "--no-fallback",
            "-o",
            str(tmp_path / "fcn.int8.onnx"),
        ],
    )
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        cli.main()
    out = capsys.readouterr()
    assert exc.value.code == 1
    assert "ONNX Runtime (Q/DQ ONNX) vs the TensorRT engine" in out.out and "engine re-check on fake.engine" in out.out
    assert "on the TensorRT engine fake.engine: INT8 mean cosine" in out.err


def test_cli_says_the_recheck_was_skipped_without_a_gpu(tiny_fcn_clean, tmp_path):
    if engine_check.runtime_here()[0]:
        pytest.skip("this machine executes engines: the re-check runs instead")
    proc = run_cli(
        "calibrate",
        str(tiny_fcn_clean),
        "--data",
        str(DATA),
        "--method",
        "percentile",
        "--min-cosine",
        "0.95",
        "--no-fallback",
        "-o",
        str(tmp_path / "fcn.int8.onnx"),
    )
    assert proc.returncode == 0, proc.stderr
    assert SKIPPED in proc.stdout
    check = json.loads((tmp_path / "fcn.int8.onnx.json").read_text())["engine_check"]
    assert check["status"] == "skipped" and check["message"] == SKIPPED and "GPU" in check["reason"]


def test_build_says_the_recheck_was_skipped(tiny_fcn_clean, tmp_path, no_runtime):
    require("tensorrt_rtx")
    from trtforge.build.step import build

    calibrate(tiny_fcn_clean, _options(tmp_path, engine_check=False))
    result = build(tmp_path / "fcn.int8.onnx", tmp_path / "fcn.int8.engine", "int8", backend="tensorrt_rtx")
    check = result.sidecar["engine_check"]
    assert check["status"] == "skipped" and check["message"] == SKIPPED
    assert json.loads((tmp_path / "fcn.int8.engine.json").read_text())["engine_check"] == check
