"""The run loop on the H200 (benchmarks/gpu/runloop_h200.sh W): `trtforge run` with and without CUDA graphs
per model, from W/MODEL/run.json and run_nographs.json, then every step's exit code and seconds.

    python3 benchmarks/gpu/runloop_table.py W
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def main() -> None:
    w = Path(sys.argv[1])
    print("| model | CUDA graphs | batches | wall p50 ms | GPU p50 ms | wall / GPU (sum) | wall / GPU (p50) | tokens/s | "
          "peak GPU MiB | graphs captured / replayed / fallbacks | shared device memory | precision rel-L2 | gates |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in sorted(p.name for p in w.iterdir() if p.is_dir()):
        for label, name in (("on", "run.json"), ("off", "run_nographs.json")):
            path = w / model / name
            if not path.is_file():
                continue
            r = json.loads(path.read_text())
            lat = r["latency"]["all"]
            g = (r.get("runtime") or {}).get("cuda_graphs") or {}
            shared = (r.get("runtime") or {}).get("shared_device_memory") or {}
            pe = r["precision_error"]
            rel = pe.get("worst", {}).get("rel_l2") if pe.get("measured") else None
            print(f"| {model} | {label} | {lat['wall'].get('count')} | {fmt(lat['wall'].get('p50_ms'))} | "
                  f"{fmt(lat.get('gpu_compute', {}).get('p50_ms'))} | {fmt(lat.get('wall_over_gpu'))} | {fmt(lat.get('wall_over_gpu_p50'))} | "
                  f"{fmt(r['throughput']['tokens_per_s'], ',.0f')} | {fmt(r['memory'].get('peak_gpu_mb'), '.0f')} | "
                  f"{g.get('captured', '-')} / {g.get('replayed', '-')} / {len(g.get('fallbacks', []))} | "
                  f"{fmt(shared.get('mb'), '.0f') + ' MiB' if shared.get('enabled') else 'off'} | {fmt(rel, '.2e')} | "
                  f"{'passed' if r['gates']['passed'] else 'FAILED'} |")
    steps = w / "steps.jsonl"
    if steps.is_file():
        print("\n| step | rc | seconds |\n|---|---|---|")
        for line in steps.read_text().splitlines():
            s = json.loads(line)
            print(f"| {s['step']} | {s.get('rc')} | {s.get('seconds', s.get('skipped', '-'))} |")


if __name__ == "__main__":
    main()
