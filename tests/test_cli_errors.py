"""How a command fails: an unexpected exception is one line naming the step and the exception, exit 3, with the full
traceback in a log file; with --json, stdout carries one JSON object on every failure; what torch prints during a
failed export goes to the log, not to stdout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import assert_user_error, run_cli
from test_bad_input_matrix import invoke

from trtforge.core.errors import INTERNAL_ERROR, GateFailed, UserError


@pytest.fixture(autouse=True)
def log_dir(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("TRTFORGE_LOG_DIR", str(tmp_path / "logs"))
    return tmp_path / "logs"


def _doctor_raises(monkeypatch, exc: BaseException) -> None:
    import trtforge.core.platform

    def report():
        raise exc

    monkeypatch.setattr(trtforge.core.platform, "report", report)


def test_an_unexpected_exception_is_one_line_a_log_and_exit_3(monkeypatch, log_dir):
    _doctor_raises(monkeypatch, ZeroDivisionError("the probe divided by zero"))
    proc = invoke("doctor")
    line = assert_user_error(proc, "internal error in 'doctor'", "ZeroDivisionError: the probe divided by zero", code=INTERNAL_ERROR)
    logs = list(log_dir.iterdir())
    assert len(logs) == 1 and str(logs[0]) in line and not logs[0].name.startswith(".")
    text = logs[0].read_text()
    assert "Traceback (most recent call last)" in text and "def report" not in text and "in report" in text
    assert "ZeroDivisionError: the probe divided by zero" in text


def test_the_log_falls_back_when_the_log_dir_cannot_be_written(monkeypatch, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the log folder would go")
    monkeypatch.setenv("TRTFORGE_LOG_DIR", str(blocker / "logs"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _doctor_raises(monkeypatch, KeyError("profiles"))
    line = assert_user_error(invoke("doctor"), "KeyError", code=INTERNAL_ERROR)
    assert str(tmp_path / "cache" / "trtforge" / "logs") in line


@pytest.mark.parametrize(
    "exc, kind, code",
    [
        (UserError("model m.onnx is missing; export it."), "user_error", 2),
        (GateFailed("cosine 0.5 below the gate 0.99."), "gate_failed", 1),
        (RuntimeError("unexpected"), "internal_error", INTERNAL_ERROR),
    ],
)
def test_json_errors_are_one_object_on_stdout(monkeypatch, log_dir, exc, kind, code):
    _doctor_raises(monkeypatch, exc)
    proc = invoke("doctor", "--json")
    assert proc.returncode == code, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["kind"] == kind and error["exit_code"] == code and str(exc) in error["message"]
    assert (error["log"] is not None) == (kind == "internal_error")
    if error["log"]:
        assert "Traceback" in Path(error["log"]).read_text()


def test_json_usage_errors_and_option_checks_print_an_object(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args, says in (
        (["run", "m.onnx", "--inputs", "d", "--min-cosine", "2", "--json"], "--min-cosine"),
        (["run", "m.onnx", "--max-rel-l2", "-1", "--json"], "--max-rel-l2"),
        (["build", "m.onnx", "--bogus", "--json"], "--bogus"),
        (["clean", "missing.onnx", "--json"], "missing.onnx"),
    ):
        proc = invoke(*args)
        assert proc.returncode == 2, proc.stderr
        error = json.loads(proc.stdout)["error"]
        assert error["exit_code"] == 2 and says in error["message"], error


def test_a_failed_gate_after_the_result_adds_the_error_to_the_one_json_object(monkeypatch):
    """run/calibrate/build print their result, then fail their gate: stdout stays one parseable object."""
    import trtforge.core.platform
    from trtforge.core import ui

    monkeypatch.setattr(trtforge.core.platform, "report", lambda: {"versions": {}})
    print_json = ui.print_json

    def print_then_fail(payload):
        print_json(payload)
        raise GateFailed("the gate failed.")

    monkeypatch.setattr(ui, "print_json", print_then_fail)
    proc = invoke("doctor", "--json")
    payload = json.loads(proc.stdout)
    assert proc.returncode == 1 and payload["versions"] == {} and payload["error"]["kind"] == "gate_failed"


def test_held_json_without_an_error_prints_the_result_unchanged(capsys):
    from trtforge.core import ui

    with ui.held_json() as held:
        ui.print_json({"a": 1})
        assert capsys.readouterr().out == ""
        ui.flush_json(held)
    assert json.loads(capsys.readouterr().out) == {"a": 1}


def test_a_failed_legacy_export_keeps_torch_output_off_stdout(tmp_path):
    """torch's C++ exporter prints the whole IR graph on fd 1 when an operator has no ONNX export: it goes to the log."""
    model = tmp_path / "eigh.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.l = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        y = self.l(x)\n"
        "        return torch.linalg.eigh(y @ y.transpose(-1, -2))[0]\n"
        "def make():\n"
        "    return M(), {'x': torch.randn(2, 8, 8)}\n"
    )
    proc = run_cli(
        "export", "--model", f"{model}:make", "-o", str(tmp_path / "m.onnx"), "--json", env={"TRTFORGE_LOG_DIR": str(tmp_path / "logs")}
    )
    line = assert_user_error(proc, "the legacy exporter failed", "linalg_eigh", "details in")
    error = json.loads(proc.stdout)["error"]  # nothing but the one object
    assert error["kind"] == "user_error" and error["log"] and error["log"] in line
    assert "graph(" not in proc.stdout and "graph(" in Path(error["log"]).read_text()


def test_the_executable_exits_3_without_a_traceback(tmp_path):
    """The real process: an exception inside a command reaches the user as one line (no Python traceback)."""
    import os
    import sys

    code = (
        "import sys, trtforge.core.platform as d\n"
        "def boom(): raise AttributeError(\"'NoneType' object has no attribute 'shape'\")\n"
        "d.report = boom\nsys.argv = ['trtforge', 'doctor']\nfrom trtforge.cli.app import entry\nentry()\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root), "CI": "true", "TRTFORGE_LOG_DIR": str(tmp_path)},
    )
    assert_user_error(proc, "internal error in 'doctor'", "AttributeError", str(tmp_path), code=INTERNAL_ERROR)


def test_a_result_that_is_not_json_is_an_internal_error(monkeypatch, log_dir):
    import trtforge.core.platform

    monkeypatch.setattr(trtforge.core.platform, "report", lambda: {"versions": {"x": object()}})
    proc = invoke("doctor", "--json")
    assert proc.returncode == INTERNAL_ERROR and json.loads(proc.stdout)["error"]["kind"] == "internal_error", proc
    assert_user_error(proc, "internal error in 'doctor'", "TypeError", code=INTERNAL_ERROR)
