"""benchmarks/merge_probe.py: one batch's 'center' merge timed outside run, its rows checked first."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_probe_checks_and_times_each_case(tmp_path):
    out = tmp_path / "merge.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "merge_probe.py"), "--out", str(out), "--repeat", "4",
                           "--batch", "3", "--chunk", "20", "--overlap", "4", "--feature", "5", "--busy", "0", "1",
                           "--threads", "1", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["busy"], r["merge_threads"]) for r in rows] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(r["source"] == "numpy" and r["median_ms"] > 0 and r["gb_per_s"] > 0 for r in rows)
    # 3 interior windows of 18 tokens overlapping by 4 keep 14 positions each: 42 rows of 5 floats
    assert rows[0]["kept_mb"] == round(42 * 5 * 4 / 2**20, 3)
    assert "ms/batch" in proc.stdout


def test_the_probe_fails_when_the_merge_is_wrong(tmp_path, monkeypatch):
    """Its correctness check can fail: a take that writes the wrong rows stops the probe."""
    import importlib.util

    import pytest

    spec = importlib.util.spec_from_file_location("merge_probe", ROOT / "benchmarks" / "merge_probe.py")
    merge_probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(merge_probe)

    from trtforge.chunking import StreamingMerge

    take = StreamingMerge.take
    monkeypatch.setattr(StreamingMerge, "take", lambda self, first, source, offsets: take(self, first, source, [o + 1 for o in offsets]))
    with pytest.raises(AssertionError):
        merge_probe.time_merges(merge_probe._NumpySource, 1, 3, 3, 20, 4, 5)
