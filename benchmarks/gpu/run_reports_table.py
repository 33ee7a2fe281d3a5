"""One row per `trtforge run` report under a GPU window's work folder: throughput, how busy the GPU was, and where the
host's CPU went (runtime.host), so interleaved A/B runs of a window read side by side.

    python3 benchmarks/gpu/run_reports_table.py W [GLOB ...]     # default GLOB: */*.json (W/MODEL/NAME.json)

Columns: tokens/s; wall/GPU (the per-batch wall summed over the GPU compute summed: 1.0 is a GPU never idle); the
loop's wall and CPU seconds (every thread of the process); minor page faults in the loop (reports from 36517c4 on);
CPU seconds of the stages that hold the GIL (plan, prepare_outputs, merge, submit); gates where they were evaluated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _cpu(stages: dict, name: str) -> str:
    return _s((stages.get(name) or {}).get("cpu_seconds"))


def row(path: Path) -> str | None:
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(r, dict) or "throughput" not in r or "latency" not in r:
        return None  # not a run report (sidecars, vs_torch tables, ...)
    host = (r.get("runtime") or {}).get("host") or {}
    stages = host.get("stages") or {}
    lat = r["latency"].get("all") or {}
    ratio = lat.get("wall_over_gpu")
    gates = r.get("gates") or {}
    faults = host.get("loop_minor_faults")
    return (
        f"| {path.parent.name}/{path.stem} | {r['chunking']['chunk']} | {r['batches']} | {r['throughput']['tokens_per_s'] / 1e3:,.0f}k | "
        f"{_s(ratio)} | {_s(host.get('loop_wall_s'))} | {_s(host.get('loop_cpu_s'))} | "
        f"{'-' if faults is None else faults} | {_cpu(stages, 'plan')} | {_cpu(stages, 'prepare_outputs')} | {_cpu(stages, 'merge')} | "
        f"{_cpu(stages, 'submit')} | {'passed' if gates.get('passed') else ('FAILED' if gates else '-')} |"
    )


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    w = Path(sys.argv[1])
    globs = sys.argv[2:] or ["*/*.json"]
    print(
        "| report | chunk | batches | tokens/s | wall / GPU | loop s | loop CPU s | faults | plan CPU s | prepare CPU s | "
        "merge CPU s | submit CPU s | gates |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for pattern in globs:
        for path in sorted(w.glob(pattern)):
            line = row(path)
            if line:
                print(line)


if __name__ == "__main__":
    main()
