"""build's time accounting: TensorRT's share is its parse (builder, parser, config) plus its engine build; every other
lap is trtforge's, and what the TensorRT lap holds beyond TensorRT's own time is trtforge's writing of the outputs."""

import pytest

from trtforge.build.clock import TENSORRT_LAP, BuildClock, overhead_line


def _clock(laps: dict[str, float]) -> BuildClock:
    clock = BuildClock()
    clock.laps = dict(laps)
    return clock


def test_tensorrt_time_is_parse_plus_build_and_the_rest_is_ours():
    clock = _clock({"precision conversion": 4.0, "attention pass": 1.0, TENSORRT_LAP: 30.0})
    record = clock.overhead(20.0, 6.0)
    assert record["tensorrt_seconds"] == 26.0 and record["tensorrt_parse_seconds"] == 6.0
    assert record["steps"] == {"precision conversion": 4.0, "writing the outputs": 4.0, "attention pass": 1.0}
    assert record["trtforge_seconds"] == 9.0
    assert record["share_of_tensorrt"] == pytest.approx(9.0 / 26.0, abs=1e-3)
    assert overhead_line(record).startswith("build time: trtforge 9.0 s, TensorRT 26.0 s (35% of TensorRT's)")


def test_without_parse_seconds_the_parse_counts_as_ours():
    """The old accounting (engine build only) puts TensorRT's parse in trtforge's writing step: the difference shows."""
    clock = _clock({TENSORRT_LAP: 30.0})
    assert clock.overhead(20.0)["steps"]["writing the outputs"] == 10.0
    assert clock.overhead(20.0, 6.0)["steps"]["writing the outputs"] == 4.0
