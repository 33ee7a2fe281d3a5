"""benchmarks/run_stalls.py: a run's excess wall time over its GPU, split by phase of the loop."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("run_stalls", Path(__file__).resolve().parents[1] / "benchmarks/run_stalls.py")
run_stalls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_stalls)


def test_excess_is_split_into_startup_steady_and_drain():
    # 20 batches of 1 ms GPU: the first waits 9 ms (start-up), batch 10 stalls 4 ms, the last one 2 ms (drain).
    gpu = [1.0] * 20
    wall = [1.0] * 20
    wall[0], wall[10], wall[19] = 10.0, 5.0, 3.0
    prof = run_stalls.stall_profile(wall, gpu)
    assert prof["batches"] == 20 and prof["wall_over_gpu"] == round(sum(wall) / 20, 3)
    assert (prof["startup"]["batches"], prof["steady"]["batches"], prof["drain"]["batches"]) == (2, 16, 2)
    assert (prof["startup"]["excess_ms"], prof["steady"]["excess_ms"], prof["drain"]["excess_ms"]) == (9.0, 4.0, 2.0)
    assert prof["stalls"] == {"count": 3, "excess_ms": 15.0, "first_positions": [0, 10, 19]}


def test_batches_without_gpu_time_are_left_out():
    assert run_stalls.stall_profile([1.0, 2.0], [None, None]) == {"batches": 0}
    # stall positions are the timeline's, not shifted by the batches left out
    assert run_stalls.stall_profile([9.0, 5.0, 1.0, 1.0], [None, 1.0, 1.0, 1.0])["stalls"]["first_positions"] == [1]
    prof = run_stalls.stall_profile([2.0, 1.0], [1.0, 1.0])  # too few batches for phases: all steady
    assert prof["steady"]["excess_ms"] == 1.0 and prof["startup"]["batches"] == 0 and prof["drain"]["batches"] == 0
