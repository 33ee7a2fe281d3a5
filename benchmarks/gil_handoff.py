"""What a GIL-releasing call costs the thread that feeds the GPU while other Python threads are busy (trtforge/backends/cuda_async.py;
`run` aims at a wall time per batch <= 1.1x its GPU time).

The submitting thread of `run` makes about a dozen CUDA calls per batch (async copies, event records and waits,
a graph launch). cuda-python releases the GIL in each; with planning and merging threads running Python code,
the submitting thread may then wait up to a switch interval to get it back, each time. This script models one
batch: the thread sleeps 1 ms (waiting for the GPU, GIL released), then makes CALLS calls of a trivial C
function, either through ctypes.CDLL (releases the GIL, as cuda-python does) or ctypes.PyDLL (keeps it, as
cuda_async does), while N threads run Python loops. It prints, per setting, the mean and p50/p95 of the
milliseconds the calls took, and writes JSON. No GPU needed.

    python benchmarks/gil_handoff.py --out gil.json [--busy 0 2 4 8] [--switch 0.005 0.0005]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path


def _busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


def measure(lib: ctypes.CDLL, calls: int, batches: int) -> list[float]:
    """Milliseconds each batch's `calls` calls took."""
    out = []
    for _ in range(batches):
        time.sleep(0.001)  # the GPU works; the GIL is free for the other threads
        start = time.perf_counter()
        for _ in range(calls):
            lib.getpid()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 2, 4, 8])
    ap.add_argument("--switch", type=float, nargs="+", default=[0.005, 0.0005], help="sys.setswitchinterval values (s)")
    ap.add_argument("--calls", type=int, default=12, help="CUDA calls per batch")
    ap.add_argument("--batches", type=int, default=200)
    args = ap.parse_args()
    name = ctypes.util.find_library("c") or "libc.so.6"
    libs = {"releases GIL (CDLL, like cuda-python)": ctypes.CDLL(name), "keeps GIL (PyDLL, like cuda_async)": ctypes.PyDLL(name)}
    rows = []
    default_interval = sys.getswitchinterval()
    for busy in args.busy:
        for interval in args.switch:
            sys.setswitchinterval(interval)
            stop = threading.Event()
            threads = [threading.Thread(target=_busy, args=(stop,), daemon=True) for _ in range(busy)]
            for t in threads:
                t.start()
            time.sleep(0.05)
            for label, lib in libs.items():
                ms = sorted(measure(lib, args.calls, args.batches))
                rows.append(
                    {
                        "busy_threads": busy,
                        "switch_interval_s": interval,
                        "calls": label,
                        "mean_ms": statistics.mean(ms),
                        "p50_ms": ms[len(ms) // 2],
                        "p95_ms": ms[int(len(ms) * 0.95)],
                    }
                )
            stop.set()
            for t in threads:
                t.join()
    sys.setswitchinterval(default_interval)
    print(f"{args.calls} calls per batch, {args.batches} batches, {os.cpu_count()} CPUs ({platform.node()})")
    print(f"{'busy':>4} {'switch s':>8}  {'calls':<38} {'mean ms':>8} {'p50 ms':>8} {'p95 ms':>8}")
    for r in rows:
        print(
            f"{r['busy_threads']:>4} {r['switch_interval_s']:>8g}  {r['calls']:<38} {r['mean_ms']:>8.3f} {r['p50_ms']:>8.3f} {r['p95_ms']:>8.3f}"
        )
    payload = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "calls": args.calls,
        "batches": args.batches,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
