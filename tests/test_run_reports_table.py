"""benchmarks/gpu/run_reports_table.py: one row per `run` report of a GPU window, other JSON files skipped."""

import json
import subprocess
import sys


def test_each_run_report_is_a_row_and_other_json_is_skipped(tmp_path):
    (tmp_path / "minilm").mkdir()
    report = {
        "chunking": {"chunk": 256},
        "batches": 86,
        "throughput": {"tokens_per_s": 5_087_000.0},
        "latency": {"all": {"wall_over_gpu": 1.8273}},
        "gates": {"passed": True},
        "runtime": {
            "host": {
                "loop_wall_s": 0.23731,
                "loop_cpu_s": 0.41,
                "loop_minor_faults": 1234,
                "stages": {"plan": {"cpu_seconds": 0.093}, "merge": {"cpu_seconds": 0.051}},
            }
        },
    }
    (tmp_path / "minilm" / "ids_1.json").write_text(json.dumps(report))
    (tmp_path / "minilm" / "m.onnx.json").write_text(json.dumps({"kind": "onnx", "inputs": []}))  # a sidecar
    out = subprocess.run(
        [sys.executable, "benchmarks/gpu/run_reports_table.py", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(out) == 3, out
    assert out[2] == "| minilm/ids_1 | 256 | 86 | 5,087k | 1.827 | 0.237 | 0.410 | 1234 | 0.093 | - | 0.051 | - | passed |"
