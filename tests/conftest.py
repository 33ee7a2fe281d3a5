import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def require(module: str):
    """The module, or a skip on a developer's machine; under CI=true a missing module fails the test,
    since CI installs everything and a silent skip there would hide a broken install."""
    if os.environ.get("CI", "").lower() == "true":
        import importlib

        try:
            return importlib.import_module(module)
        except ImportError as exc:
            pytest.fail(f"CI=true but {module} cannot be imported ({exc}); the suite needs it installed.")
    return pytest.importorskip(module)


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real `python -m trtforge` and capture its output."""
    full_env = dict(os.environ, CI="true", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "trtforge", *args], cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def assert_user_error(proc: subprocess.CompletedProcess, *fragments: str, code: int = 2) -> str:
    """One sentence on stderr, the right exit code, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("error:")]
    # Exactly one error sentence, and it is the last thing printed (progress lines may come before it).
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trtforge")


@pytest.fixture(scope="session")
def minilm_onnx(workdir) -> Path:
    out = workdir / "minilm.onnx"
    proc = run_cli("export", "--model", "minilm", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def minilm_clean(minilm_onnx) -> Path:
    proc = run_cli("clean", str(minilm_onnx))
    assert proc.returncode == 0, proc.stderr
    return minilm_onnx.with_name("minilm.clean.onnx")


@pytest.fixture(scope="session")
def tiny_fcn_clean(workdir) -> Path:
    out = workdir / "tiny-fcn.onnx"
    proc = run_cli("export", "--model", "tiny-fcn", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("clean", str(out))
    assert proc.returncode == 0, proc.stderr
    return out.with_name("tiny-fcn.clean.onnx")


@pytest.fixture(scope="session")
def minilm_int8(minilm_clean):
    """The issue's done-when: entropy on the shipped text, held-out accuracy gate, >= 80% INT8 FLOPs."""
    proc = run_cli("calibrate", str(minilm_clean), "--data", "calib_data/minilm", "--method", "entropy", "--json", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return minilm_clean.with_name("minilm.int8.onnx"), json.loads(proc.stdout)


def export_zoo(folder: Path, exports: list[tuple[str, str]]) -> dict[tuple[str, str], Path]:
    """Each small zoo model (zoo/configs/NAME.yaml) exported with each exporter and cleaned, as `trtforge build`
    would receive it: {(name, exporter): cleaned ONNX}. Runs from the project root (the configs' paths)."""
    from trtforge.core.config import apply_overrides, load_config
    from trtforge.export.step import export_model
    from trtforge.graph.index import clean_file

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        paths = {}
        for name, exporter in exports:
            cfg = apply_overrides(load_config(ROOT / "zoo" / "configs" / f"{name}.yaml"), {"export.exporter": exporter})
            raw = folder / f"{name}.{exporter}.onnx"
            export_model(cfg, raw)
            paths[(name, exporter)] = clean_file(raw, folder / "clean" / raw.name, tolerance=cfg.clean.tolerance).path
        return paths
    finally:
        os.chdir(before)
