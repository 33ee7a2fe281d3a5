"""Where a `trtforge run` loop lost time against its GPU: from each report's `runtime.timeline` (every batch's
wall and GPU ms in order), the wall time beyond the GPU's, split into the start-up (first 10% of batches),
the steady state and the drain (last 10%), and the batches that took over twice their GPU time. The aim of
wall <= 1.1x GPU is a steady-state claim only if the excess sits in the middle; start-up and drain shrink
with longer inputs, periodic stalls do not.

    python3 benchmarks/run_stalls.py REPORT.json [REPORT.json ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def stall_profile(wall_ms: list[float], gpu_ms: list[float | None], edge: float = 0.1) -> dict:
    """Wall minus GPU ms per phase (start-up / steady / drain, by batch position) and the stalls (wall > 2x GPU,
    at their positions in the timeline). Batches without a GPU time are left out."""
    indexed = [(i, w, g) for i, (w, g) in enumerate(zip(wall_ms, gpu_ms)) if g is not None]
    pairs = [(w, g) for _, w, g in indexed]
    n = len(pairs)
    if not n:
        return {"batches": 0}
    k = max(1, int(n * edge)) if n >= 3 else 0
    phases = {"startup": pairs[:k], "steady": pairs[k : n - k], "drain": pairs[n - k :] if k else []}
    out: dict = {"batches": n, "wall_ms": round(sum(w for w, _ in pairs), 3), "gpu_ms": round(sum(g for _, g in pairs), 3)}
    out["wall_over_gpu"] = round(out["wall_ms"] / out["gpu_ms"], 3) if out["gpu_ms"] > 0 else None
    for name, part in phases.items():
        excess = sum(max(0.0, w - g) for w, g in part)
        gpu = sum(g for _, g in part)
        out[name] = {
            "batches": len(part),
            "excess_ms": round(excess, 3),
            "wall_over_gpu": round(sum(w for w, _ in part) / gpu, 3) if gpu > 0 else None,
        }
    stalls = [(i, w - g) for i, w, g in indexed if w > 2 * g]
    out["stalls"] = {"count": len(stalls), "excess_ms": round(sum(e for _, e in stalls), 3), "first_positions": [i for i, _ in stalls[:20]]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    rows = {}
    print(
        "| report | tokens/s | batches | wall / GPU | start-up excess ms (wall/GPU) | steady excess ms (wall/GPU) | drain excess ms (wall/GPU) | stalls > 2x GPU (excess ms) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for path in a.reports:
        report = json.loads(path.read_text())
        timeline = (report.get("runtime") or {}).get("timeline")
        tokens = (report.get("throughput") or {}).get("tokens_per_s")
        tokens = "-" if tokens is None else f"{tokens:,.0f}"
        if not timeline:
            print(f"| {path} | {tokens} | no runtime.timeline in this report (older trtforge) | | | | | |")
            continue
        prof = stall_profile(timeline["wall_ms"], timeline["gpu_ms"])
        prof["capped"] = timeline["shown"] < timeline["batches"]  # then "drain" is the last listed batches, not the run's
        rows[str(path)] = prof
        if not prof["batches"]:
            print(f"| {path} | {tokens} | 0 (no GPU times: not a TensorRT run) | | | | | |")
            continue
        cell = lambda ph: f"{prof[ph]['excess_ms']:.1f} ({prof[ph]['wall_over_gpu']})"  # noqa: E731
        shown = f"{prof['batches']} of {timeline['batches']}" if prof["capped"] else prof["batches"]
        print(
            f"| {path} | {tokens} | {shown} | {prof['wall_over_gpu']} | {cell('startup')} | {cell('steady')} | {cell('drain')} | "
            f"{prof['stalls']['count']} ({prof['stalls']['excess_ms']:.1f}) |"
        )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
