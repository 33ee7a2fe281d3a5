"""Where a build's time goes: each of trtforge's steps against TensorRT's own build, for the sidecar's build_overhead
and the build output's 'build time:' line."""

from __future__ import annotations

import time
from typing import Any

TENSORRT_LAP = "TensorRT build and writing the outputs"


class BuildClock:
    """Wall time of each of build's steps, so trtforge's own share can be set against TensorRT's build."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.laps[step] = self.laps.get(step, 0.0) + now - self._last
        self._last = now

    def overhead(self, build_seconds: float, parse_seconds: float = 0.0) -> dict[str, Any]:
        """The sidecar's build_overhead: TensorRT's time (its builder, parser and config, parse_seconds, and its engine
        build, build_seconds), trtforge's (every other step, a failed first TensorRT build of a fused graph included),
        its share of TensorRT's, and each step's seconds, largest first."""
        tensorrt_seconds = build_seconds + parse_seconds
        steps = dict(self.laps)
        if TENSORRT_LAP in steps:
            steps["writing the outputs"] = max(0.0, steps.pop(TENSORRT_LAP) - tensorrt_seconds)
        ours = sum(steps.values())
        return {
            "tensorrt_seconds": round(tensorrt_seconds, 3),
            "tensorrt_parse_seconds": round(parse_seconds, 3),
            "trtforge_seconds": round(ours, 3),
            "share_of_tensorrt": round(ours / tensorrt_seconds, 3) if tensorrt_seconds > 0 else None,
            "steps": {k: round(v, 3) for k, v in sorted(steps.items(), key=lambda kv: -kv[1])},
        }


def overhead_line(record: dict[str, Any] | None) -> str | None:
    """'build time: trtforge 3.1 s, TensorRT 12.4 s (25% of TensorRT's); largest: ...' for the build output, or None."""
    if not record:
        return None
    share = record.get("share_of_tensorrt")
    largest = ", ".join(f"{k} {v:.1f} s" for k, v in list(record["steps"].items())[:3])
    return (
        f"build time: trtforge {record['trtforge_seconds']:.1f} s, TensorRT {record['tensorrt_seconds']:.1f} s"
        + (f" ({share:.0%} of TensorRT's)" if share is not None else "")
        + (f"; largest: {largest}" if largest else "")
    )
