"""benchmarks/gpu/validate.sh and its zoo table: the scripts parse, the suites are named and checked before anything
runs, and the table reads the layout validate.sh writes (WORKDIR/MODEL/run_ref_LABEL.json, steps named STEP-LABEL-MODEL)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_gpu_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(GPU / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_validate_lists_suites_and_refuses_an_unknown_one(tmp_path):
    listed = subprocess.run(["bash", str(GPU / "validate.sh"), "list"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0
    for suite in ("zoo", "vs-torch", "int8", "fp8", "attention", "runloop", "stateful", "ray"):
        assert suite in listed.stdout
    work = tmp_path / "w"
    bad = subprocess.run(["bash", str(GPU / "validate.sh"), "-w", str(work), "zoo", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown suite 'nope'" in bad.stderr
    assert not work.exists()  # refused before any step ran


def test_zoo_table_reads_validate_layout(tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "bert.clean.onnx.json").write_text("{}")
    (tmp_path / "bert" / "bert.fp16.engine.json").write_text(
        json.dumps({"build_seconds": 12.5, "engine_bytes": 3 * 2**20, "profiles": [{}, {}]})
    )
    report = {
        "precision_error": {"worst": {"rel_l2": 0.0031, "cosine": 0.99999}},
        "latency": {"all": {}, "profile 1": {"gpu_compute": {"count": 40, "p50_ms": 1.25}}},
        "chunking": {"batch_size": 64},
        "gates": {"passed": True},
    }
    (tmp_path / "bert" / "run_ref_fp16.json").write_text(json.dumps(report))
    steps = [
        {"step": "export-bert", "rc": 0},
        {"step": "clean-bert", "rc": 0},
        {"step": "build-fp16-bert", "rc": 0},
        {"step": "run-ref-fp16-bert", "rc": 1},
        {"step": "build-fp16-gpt2", "rc": 0},
    ]
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(s) for s in steps) + "\n")
    proc = subprocess.run([sys.executable, str(GPU / "zoo_table.py"), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "zoo.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["bert"]
    row = rows[0]
    assert row["steps"] == {"export-bert": 0, "clean-bert": 0, "build-fp16-bert": 0, "run-ref-fp16-bert": 1}
    assert row["build_s"] == 12.5 and row["engine_mb"] == 3 and row["profiles"] == 2
    assert row["precision"]["rel_l2"] == 0.0031 and row["gpu_ms_p50"] == 1.25
    assert "run-ref-fp16-bert rc=1" in proc.stdout  # the failed step is listed with its log tail
