"""What one batch's 'center' merge costs the host outside `run` (issue 11: `run` wall <= 1.1x GPU).

On the H200 box `run`'s merge threads took ~3 ms per MiniLM batch summed over them (5.5 MB of kept rows copied out of a
16x256x384 fp32 batch), as long for BERT-base's 11 MB, and whatever the GIL switch interval (benchmarks/RESULTS.md, third
session of 2026-12-02); the same np.take takes 0.41 ms on the 2-core dev VM. This times chunking.StreamingMerge.take of
one batch of 16 consecutive windows into a mapped merged output, as run does it, with the source in
- `numpy`: ordinary memory, written by the CPU just before (warm);
- `pinned`: page-locked memory (cudaMallocHost) just written by a device-to-host copy (--gpu only), as run's slots are;
- `direct` (--gpu only): no host copy at all, the copy engine writing the kept rows into a registered merged output (one
  cudaMemcpy2D per run of windows; the registration's one-off cost printed beside it): what a pooled, page-locked merged
  output would cost per batch;
beside 0 or N busy threads (`--tokenizer`: threads tokenizing the documents in a loop, the planning threads' load; else
threads running Python loops, GIL contention), on 1 or 2 merge threads at once. Each case checks the merged rows first.
Prints a table (median ms per batch and GB/s of kept rows) and writes JSON.

    python benchmarks/merge_probe.py --out merge.json [--gpu] [--tokenizer out/minilm.tokenizer] [--feature 384]
        [--switch-interval-us 500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtforge.chunking import StreamingMerge, plan_windows  # noqa: E402


def batch_windows(batch: int, chunk: int, overlap: int) -> tuple[list, int]:
    """`batch` consecutive interior windows of one long document (specials: one token each side), and its length."""
    capacity = chunk - 2
    length = (batch + 2) * (capacity - overlap) + overlap
    windows = plan_windows(length, capacity, overlap)
    return windows[1:1 + batch], length


class _PinnedSource:
    """run's slot buffers (tensorrt_runtime.PinnedBuffer / DeviceBuffer) of one batch's output; refill() copies
    device -> host and waits."""

    def __init__(self, shape: tuple[int, ...]):
        from cuda.bindings import runtime as cudart

        from trtforge.backends.tensorrt_runtime import DeviceBuffer, PinnedBuffer

        self.cudart = cudart
        self.nbytes = int(np.prod(shape)) * 4
        self.pinned, self.buffer = PinnedBuffer(self.nbytes), DeviceBuffer(self.nbytes)
        self.host, self.device = self.pinned.ptr, self.buffer.ptr
        self.array = self.pinned.view(np.dtype(np.float32), shape)
        data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        assert int(cudart.cudaMemcpy(self.device, data.ctypes.data, self.nbytes, kind)[0]) == 0
        self.expected = data

    def refill(self) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        assert int(self.cudart.cudaMemcpy(self.host, self.device, self.nbytes, kind)[0]) == 0


class _NumpySource:
    def __init__(self, shape: tuple[int, ...]):
        self.expected = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        self.array = np.empty_like(self.expected)

    def refill(self) -> None:
        np.copyto(self.array, self.expected)


def time_direct(repeat: int, batch: int, chunk: int, overlap: int, feature: int) -> dict[str, float]:
    """The copy engine instead of the host (--gpu): the batch's kept rows copied device -> host straight into a
    page-locked merged output, one cudaMemcpy2D for the run (interior windows keep equal, equally placed slices), after
    registering the merged output once (cudaHostRegister: its cost is what a pool would pay once per buffer)."""
    from cuda.bindings import runtime as cudart

    windows, length = batch_windows(batch, chunk, overlap)
    source = _PinnedSource((batch, chunk, feature))
    row = feature * 4
    skip = 1 + windows[0].keep_start - windows[0].start  # special token, then the part the neighbour keeps
    width = (windows[0].keep_end - windows[0].keep_start) * row
    assert all((w.keep_end - w.keep_start) * row == width and w.keep_start - w.start == skip - 1 for w in windows)
    merged = np.zeros((length, feature), np.float32)
    start = time.perf_counter()
    assert int(cudart.cudaHostRegister(merged.ctypes.data, merged.nbytes, 0)[0]) == 0
    register_ms = (time.perf_counter() - start) * 1e3
    lo = windows[0].keep_start
    times = []
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
    for _ in range(repeat):
        start = time.perf_counter()
        err = cudart.cudaMemcpy2D(merged.ctypes.data + lo * row, width, int(source.device) + skip * row, chunk * row, width,
                                  batch, kind)[0]
        times.append((time.perf_counter() - start) * 1e3)
        assert int(err) == 0, err
    want = np.concatenate([source.expected[k, skip:skip + width // row] for k in range(batch)])
    np.testing.assert_array_equal(merged[lo:lo + len(want)], want)
    cudart.cudaHostUnregister(merged.ctypes.data)
    ms = statistics.median(times[1:])
    return {"median_ms": round(ms, 4), "p90_ms": round(sorted(times[1:])[int(0.9 * (len(times) - 2))], 4),
            "gb_per_s": round(width * batch / ms / 1e6, 3), "kept_mb": round(width * batch / 2**20, 3),
            "register_ms": round(register_ms, 3), "register_mb": round(merged.nbytes / 2**20, 3)}


def _busy_threads(n: int, tokenizer: Path | None, texts: list[str], stop: threading.Event) -> list[threading.Thread]:
    if tokenizer is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))

        def work() -> None:
            while not stop.is_set():
                for text in texts:
                    tok.encode_batch([text], add_special_tokens=False)
    else:
        def work() -> None:
            x = 0
            while not stop.is_set():
                for i in range(1000):
                    x += i
    threads = [threading.Thread(target=work, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def time_merges(make_source: Callable[[tuple[int, ...]], Any], threads: int, repeat: int, batch: int, chunk: int,
                overlap: int, feature: int) -> dict[str, float]:
    """Median ms per batch of `threads` merge threads each merging `repeat` batches (source refilled before each)."""
    windows, length = batch_windows(batch, chunk, overlap)
    shape = (batch, chunk, feature)
    offsets = [k * chunk + 1 for k in range(batch)]  # row k's document tokens start after its special token
    kept = sum(w.keep_end - w.keep_start for w in windows)
    per_thread: list[list[float]] = [[] for _ in range(threads)]
    sources = [make_source(shape) for _ in range(threads)]

    def merge_loop(t: int) -> None:
        source = sources[t]
        merge = StreamingMerge(plan_windows(length, chunk - 2, overlap), length)
        merge.preallocate((feature,), np.float32)
        first = 1  # the windows above are windows 1..batch of this plan
        for _ in range(repeat):
            source.refill()
            flat = source.array.reshape(-1, feature)
            start = time.perf_counter()
            merge.take(first, flat, offsets)
            per_thread[t].append((time.perf_counter() - start) * 1e3)
        lo = windows[0].keep_start
        want = np.concatenate([source.expected[k, 1 + w.keep_start - w.start:1 + w.keep_end - w.start] for k, w in enumerate(windows)])
        np.testing.assert_array_equal(merge.merged[lo:lo + kept], want)  # the rows it timed are the right ones

    failures: list[BaseException] = []

    def guarded(t: int) -> None:
        try:
            merge_loop(t)
        except BaseException as exc:  # raised below: a wrong merge must stop the probe, not print a figure
            failures.append(exc)

    workers = [threading.Thread(target=guarded, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if failures:
        raise failures[0]
    times = [x for ts in per_thread for x in ts[1:]]  # the first take of each thread warms up
    ms = statistics.median(times)
    return {"median_ms": round(ms, 4), "p90_ms": round(sorted(times)[int(0.9 * (len(times) - 1))], 4),
            "gb_per_s": round(kept * feature * 4 / ms / 1e6, 3), "kept_mb": round(kept * feature * 4 / 2**20, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpu", action="store_true", help="also a pinned source refilled by a device-to-host copy (cuda-python)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="busy threads tokenize (a tokenizer dir); else Python loops")
    ap.add_argument("--docs", type=Path, default=ROOT / "calib_data" / "minilm_long")
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 8])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--overlap", type=int, default=32)
    ap.add_argument("--feature", type=int, default=384, help="MiniLM 384, BERT-base 768")
    ap.add_argument("--switch-interval-us", type=int, default=500, help="the GIL switch interval, as run sets it")
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval_us * 1e-6)

    texts = [p.read_text() for p in sorted(args.docs.glob("*.txt"))]
    sources = {"numpy": _NumpySource, **({"pinned": _PinnedSource} if args.gpu else {})}
    rows = []
    for name, make in sources.items():
        for busy in args.busy:
            stop = threading.Event()
            load = _busy_threads(busy, args.tokenizer, texts, stop)
            try:
                for threads in args.threads:
                    result = time_merges(make, threads, args.repeat, args.batch, args.chunk, args.overlap, args.feature)
                    rows.append({"source": name, "busy": busy, "busy_kind": "tokenize" if args.tokenizer else "python",
                                 "merge_threads": threads, **result})
            finally:
                stop.set()
                for t in load:
                    t.join()
    if args.gpu:  # the copy engine writing the kept rows into a registered merged output, no busy threads
        rows.append({"source": "direct", "busy": 0, "busy_kind": "-", "merge_threads": 1,
                     **time_direct(args.repeat, args.batch, args.chunk, args.overlap, args.feature)})
    print(f"{args.batch}x{args.chunk}x{args.feature} fp32 batch, 'center' take of {rows[0]['kept_mb']} MB; "
          f"{os.cpu_count()} CPUs ({platform.node()}), switch interval {args.switch_interval_us} us, median of {args.repeat - 1} per thread")
    print(f"{'source':>8}{'busy':>6}{'threads':>9}{'ms/batch':>10}{'p90 ms':>9}{'GB/s':>8}")
    for r in rows:
        print(f"{r['source']:>8}{r['busy']:>6}{r['merge_threads']:>9}{r['median_ms']:>10.3f}{r['p90_ms']:>9.3f}{r['gb_per_s']:>8.2f}"
              + (f"  (cudaHostRegister of {r['register_mb']} MB: {r['register_ms']} ms)" if "register_ms" in r else ""))
    args.out.write_text(json.dumps({"cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
