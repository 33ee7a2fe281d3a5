"""The bad-input matrix beyond each command's own tests: engines, disks, folders, interrupts, races.

Each case: one sentence on stderr, the right exit code, no traceback, and no partial file left behind.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, assert_user_error, require, run_cli

rtx = require("tensorrt_rtx")


@pytest.fixture(scope="module")
def tiny_engine(tiny_fcn_clean, tmp_path_factory):
    out = tmp_path_factory.mktemp("engine") / "tiny.fp32.engine"
    proc = run_cli("build", str(tiny_fcn_clean), "--tiers", "height=256;width=256", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]


def test_truncated_engine(tiny_engine, tmp_path):
    bad = tmp_path / "t.engine"
    bad.write_bytes(tiny_engine.read_bytes()[:1000])
    (tmp_path / "t.engine.json").write_text(tiny_engine.with_name(tiny_engine.name + ".json").read_text())
    assert_user_error(run_cli("inspect", str(bad)), "t.engine is truncated or altered", "rebuild")
    assert_user_error(run_cli("run", str(bad), "--inputs", "calib_data/tiny_fcn_images"), "truncated or altered")


def test_engine_without_sidecar(tiny_engine, tmp_path):
    bare = tmp_path / "x.engine"
    bare.write_bytes(tiny_engine.read_bytes())
    assert_user_error(run_cli("inspect", str(bare)), "x.engine.json is missing")


@pytest.mark.parametrize(
    "change,fragments",
    [
        ({"backend": "tensorrt", "tensorrt_version": "10.3.0"}, ["built with tensorrt 10.3.0, which is not installed here"]),
        ({"tensorrt_version": "1.0.0.1"}, ["built with TensorRT 1.0.0.1 but this runtime is"]),
    ],
)
def test_engine_for_another_tensorrt(tiny_engine, tmp_path, change, fragments):
    engine = tmp_path / "e.engine"
    engine.write_bytes(tiny_engine.read_bytes())
    side = json.loads(tiny_engine.with_name(tiny_engine.name + ".json").read_text())
    side.update(change)
    (tmp_path / "e.engine.json").write_text(json.dumps(side))
    assert_user_error(run_cli("run", str(engine), "--inputs", "calib_data/tiny_fcn_images"), *fragments)


def test_engine_needs_a_gpu(tiny_engine):
    assert_user_error(run_cli("run", str(tiny_engine), "--inputs", "calib_data/tiny_fcn_images"), "needs a GPU", "ONNX Runtime")


def test_engine_built_for_other_shapes(tiny_engine):
    assert_user_error(
        run_cli("run", str(tiny_engine), "--inputs", "calib_data/tiny_fcn_images", "--chunk", "512"),
        "--chunk 512 (tile size) is larger than engine tiny.fp32.engine",
    )


@pytest.mark.parametrize("command", ["export", "clean", "build"])
def test_unwritable_output_folder(tiny_fcn_clean, tmp_path, command):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    target = blocker / "sub" / "out.onnx"
    args = {
        "export": ["export", "--model", "tiny-fcn", "-o", str(target)],
        "clean": ["clean", str(tiny_fcn_clean), "-o", str(target)],
        "build": ["build", str(tiny_fcn_clean), "--tiers", "height=256;width=256", "-o", str(target)],
    }[command]
    assert_user_error(run_cli(*args), "cannot create output folder", "a_file")


def test_full_disk_leaves_nothing_behind(minilm_onnx, tmp_path):
    """A write that fails mid-way (a 1 MB file-size limit stands in for a full disk)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    env = dict(os.environ, CI="true", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "trtforge", "clean", str(minilm_onnx), "-o", str(tmp_path / "c.onnx")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=600,
    )
    assert_user_error(proc, "could not write", "c.onnx")
    assert list(tmp_path.iterdir()) == []


def _interrupt(args, wait_for, tmp_path, timeout=600, env=None):
    env = dict(os.environ, CI="true", PYTHONPATH=str(ROOT), **(env or {}))
    # A shell's background jobs inherit SIGINT ignored; give the child the default disposition, as a terminal would.
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtforge", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if wait_for in line or not line:
            break
    assert wait_for in lines[-1], f"the command never printed '{wait_for}': " + "".join(lines)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(lines) + err


def test_sigint_during_calibrate(minilm_clean, tmp_path):
    code, err = _interrupt(
        ["calibrate", str(minilm_clean), "--data", "calib_data/minilm", "-o", str(tmp_path / "m.int8.onnx")],
        "collecting histograms",
        tmp_path,
    )
    assert code == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_sigint_during_build(minilm_clean, tmp_path):
    """Ctrl-C while TensorRT builds (the first heartbeat line says the builder is running): a fixed delay raced
    the build's end on CI and also landed in the parser's log callback, where TensorRT swallowed it."""
    code, err = _interrupt(
        ["build", str(minilm_clean), "--precision", "fp16", "--tiers", "128,512", "-o", str(tmp_path / "m.engine")],
        "s elapsed",
        tmp_path,
        env={"TRTFORGE_HEARTBEAT_S": "0.2"},
    )
    assert code == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not [p for p in tmp_path.iterdir() if not p.name.endswith(".lock")]


def test_two_builds_to_one_path(tiny_fcn_clean, tmp_path):
    engine = tmp_path / "same.engine"
    env = dict(os.environ, CI="true", PYTHONPATH=str(ROOT))
    cmds = [
        [sys.executable, "-m", "trtforge", "build", str(tiny_fcn_clean), "--tiers", tiers, "-o", str(engine)]
        for tiers in ("height=256;width=256", "height=128,256;width=256")
    ]
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    side = json.loads((tmp_path / "same.engine.json").read_text())
    from trtforge.core.artifacts import sha256_file

    # Whichever build finished last, the engine and its sidecar are from the same build.
    assert sha256_file(engine) == side["engine_sha256"] and engine.stat().st_size == side["engine_bytes"]
    assert _leftovers(tmp_path) == []
