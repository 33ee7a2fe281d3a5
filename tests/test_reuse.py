"""Reuse only what is verified: a calibration cache, a Q/DQ ONNX or an engine is reused only when its bytes are the ones
its sidecar recorded at write time (and a cache's header names the method's algorithm); otherwise the step runs again
and says which file did not match. Each case below was reused by the old code."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import ROOT, require, run_cli


@pytest.fixture()
def work(tiny_fcn_clean, tmp_path):
    """tiny-fcn's cleaned ONNX and its sidecar, with calibration data, in a folder of its own."""
    for name in ("tiny-fcn.clean.onnx", "tiny-fcn.clean.onnx.json"):
        shutil.copy(tiny_fcn_clean.with_name(name), tmp_path / name.replace("tiny-fcn", "t"))
    shutil.copytree(ROOT / "calib_data" / "tiny_fcn", tmp_path / "data")
    return tmp_path


def _calibrate(work, method="percentile"):
    from trtforge.calibrate.options import CalibrateOptions
    from trtforge.calibrate.step import calibrate

    options = CalibrateOptions(data=work / "data", method=method, min_cosine=0.5, engine_check=False)
    return calibrate(work / "t.clean.onnx", options)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _side(path):
    return json.loads(path.with_name(path.name + ".json").read_text())


def _consistent(work):
    """The files on disk describe each other: the cache is the one both sidecars name, with the int8 model's method."""
    cache, int8 = work / "t.calib.cache", work / "t.int8.onnx"
    from trtforge.calibrate.cache import ALGORITHMS

    assert _side(cache)["cache_sha256"] == _sha(cache) == _side(int8)["cache_sha256"]
    assert cache.read_text().splitlines()[0].endswith(ALGORITHMS[_side(int8)["method"]])
    assert _side(int8)["sha256"] == _sha(int8)


@pytest.mark.parametrize("scale", ["40000000", "00000000"])
def test_hand_edited_scale_is_not_reused(work, scale):
    _calibrate(work)
    cache = work / "t.calib.cache"
    lines = cache.read_text().splitlines()
    name, _, _ = lines[1].rpartition(":")
    lines[1] = f"{name}: {scale}"
    cache.write_text("\n".join(lines) + "\n")
    result = _calibrate(work)
    assert not result.reused
    assert "t.calib.cache does not hold the bytes its sidecar recorded" in result.reason
    assert f"{name}: {scale}" not in cache.read_text()
    _consistent(work)


def test_header_naming_another_algorithm_is_not_reused(work):
    """Even where the sidecar's hash was made to match, a minmax header is not a percentile cache."""
    _calibrate(work)
    cache = work / "t.calib.cache"
    text = cache.read_text().replace("LegacyCalibration", "MinMaxCalibration")
    cache.write_text(text)
    side = _side(cache)
    side["cache_sha256"] = _sha(cache)
    cache.with_name("t.calib.cache.json").write_text(json.dumps(side))
    result = _calibrate(work)
    assert not result.reused
    assert "header names MinMaxCalibration, not percentile's LegacyCalibration" in result.reason
    _consistent(work)


def test_crash_between_cache_and_its_sidecar(work, monkeypatch):
    """A disk full after the minmax cache was written and before its sidecar: the percentile sidecar left beside a
    minmax cache must not make the next percentile run reuse it."""
    from trtforge.calibrate import step
    from trtforge.core.errors import UserError

    _calibrate(work)
    real = step.write_sidecar

    def disk_full(artifact, payload):
        if str(artifact).endswith(".cache"):
            raise UserError(f"could not write {artifact}.json: No space left on device; free space or choose another path.")
        return real(artifact, payload)

    monkeypatch.setattr(step, "write_sidecar", disk_full)
    with pytest.raises(UserError, match="No space left"):
        _calibrate(work, "minmax")
    monkeypatch.setattr(step, "write_sidecar", real)
    assert (work / "t.calib.cache").read_text().startswith("TRT-8600-MinMaxCalibration")
    assert _side(work / "t.calib.cache")["method"] == "percentile"
    result = _calibrate(work)
    assert not result.reused and "t.calib.cache does not hold the bytes its sidecar recorded" in result.reason
    _consistent(work)


def test_verified_reuse_evaluates_nothing_and_rewrites_nothing(work, monkeypatch):
    from trtforge.calibrate import step

    first = _calibrate(work)
    int8 = work / "t.int8.onnx"
    before = int8.stat().st_mtime_ns, _sha(int8)

    def no_evaluation(*args, **kwargs):
        raise AssertionError("a verified reuse evaluated the held-out set")

    monkeypatch.setattr(step, "evaluate", no_evaluation)
    monkeypatch.setattr(step, "save_onnx", no_evaluation)
    result = _calibrate(work)
    assert result.reused and "recorded held-out results" in result.reason
    assert (int8.stat().st_mtime_ns, _sha(int8)) == before
    assert (
        result.sidecar["accuracy"] == first.sidecar["accuracy"] and result.result.accuracy.mean_cosine == first.result.accuracy.mean_cosine
    )
    assert _side(int8)["cache_reused"] is True
    _consistent(work)


def test_edited_qdq_onnx_is_written_again(work):
    import onnx
    from onnx import numpy_helper

    _calibrate(work)
    int8 = work / "t.int8.onnx"
    model = onnx.load(str(int8))
    scale = next(i for i in model.graph.initializer if i.name.endswith("_scale"))
    scale.CopyFrom(numpy_helper.from_array(np.array(1.0, dtype=np.float32), scale.name))
    onnx.save(model, str(int8))
    edited = _sha(int8)
    result = _calibrate(work)
    assert result.reused and "recorded held-out results" not in result.reason  # the cache stands, the model is remade
    assert _sha(int8) != edited
    _consistent(work)


def test_a_second_run_on_the_same_outputs_waits_for_the_first(work):
    """Two calibrate runs on the same outputs: the second waits for the first's lock, so the files on disk come from
    one run (the old code wrote an entropy Q/DQ ONNX beside a minmax cache)."""
    from trtforge.core.artifacts import output_lock

    int8 = work / "t.int8.onnx"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true")
    with output_lock(int8):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trtforge",
                "calibrate",
                str(work / "t.clean.onnx"),
                "--data",
                str(work / "data"),
                "--method",
                "minmax",
                "--min-cosine",
                "0.5",
                "--no-engine-check",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen, waiting = [], threading.Event()

        def read():
            for line in proc.stderr:
                seen.append(line)
                if "waiting for another trtforge process" in line:
                    waiting.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        waiting.wait(120)
        assert waiting.is_set(), "".join(seen)
        assert not int8.exists()
    assert proc.wait(300) == 0, "".join(seen)
    reader.join(10)
    _consistent(work)


def test_output_lock_excludes_and_leaves_no_lock_file(tmp_path):
    """Holders one at a time, waiters told, and the lock file gone once the last holder leaves (a holder removes it
    while it still holds it; a waiter that then finds its file gone locks the new one)."""
    import time

    from trtforge.core.artifacts import output_lock

    events = []

    def hold(i):
        with output_lock(tmp_path / "m.int8.onnx", waiting=lambda line: events.append(("waits", i))):
            events.append(("in", i))
            time.sleep(0.05)
            events.append(("out", i))

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    inside = 0
    for kind, _ in events:
        inside += {"in": 1, "out": -1}.get(kind, 0)
        assert inside in (0, 1), events
    assert sum(kind == "in" for kind, _ in events) == 4 and any(kind == "waits" for kind, _ in events)
    assert list(tmp_path.iterdir()) == []


# -- pipeline: an output changed since the step wrote it makes the step run again ---------------------------------


def _pipeline(out):
    proc = run_cli("pipeline", "configs/tiny-fcn.yaml", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "tiny-fcn.pipeline.json").read_text())
    return {s["step"]: s for s in report["steps"]}, proc.stderr


@pytest.fixture(scope="module")
def pipeline_out(tmp_path_factory):
    require("tensorrt_rtx")
    out = tmp_path_factory.mktemp("reuse_pipeline")
    steps, _ = _pipeline(out)
    assert {s["status"] for s in steps.values()} == {"ran"}
    return out


def test_pipeline_rebuilds_a_truncated_engine(pipeline_out, tmp_path):
    out = tmp_path / "p"
    shutil.copytree(pipeline_out, out)
    engine = out / "tiny-fcn.fp16.engine"
    with open(engine, "r+b") as fh:
        fh.truncate(engine.stat().st_size // 2)
    steps, log = _pipeline(out)
    assert steps["build"]["status"] == "ran" and steps["export"]["status"] == "skipped"
    assert "tiny-fcn.fp16.engine does not hold the bytes its sidecar recorded" in steps["build"]["detail"]
    assert "build: running again" in log
    assert _side(engine)["engine_sha256"] == _sha(engine)


def test_pipeline_recalibrates_an_edited_qdq_onnx(pipeline_out, tmp_path):
    out = tmp_path / "p"
    shutil.copytree(pipeline_out, out)
    int8 = out / "tiny-fcn.int8.onnx"
    int8.write_bytes(int8.read_bytes() + b"\x00")
    steps, _ = _pipeline(out)
    assert steps["calibrate"]["status"] == "ran"
    assert "tiny-fcn.int8.onnx does not hold the bytes its sidecar recorded" in steps["calibrate"]["detail"]
