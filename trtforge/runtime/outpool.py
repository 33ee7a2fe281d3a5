"""Host memory for `run`'s merged outputs, reused from one input to the next.

Why: a merged output written into fresh memory pays a page fault per 4 KiB page on its first write. On the dev VM
that ran at ~1.1 GB/s per thread and was most of `run`'s host time per batch: `benchmarks/host_overhead.py`,
pre-tokenized MiniLM, 4.1-5.2 ms per batch with fresh outputs, 1.2 ms with mapped ones. Inputs are merged, handed to
their consumer and done with in about the order they were planned, so one input's buffer can serve a later one:
after the first few inputs, merges write into memory that is already mapped. numpy cannot do this itself (large
blocks go back to the OS when freed), and no maintained library offers a size-classed host pool for numpy arrays
outside a GPU framework, hence this small one.

Buffers are kept per (feature shape, dtype), sized up to a grid of 1/8-octave steps (at most 12.5% unused when fresh),
and a request takes the smallest idle buffer that holds it (of equal ones, the one given back last) if that is at most
twice its own size: a far larger buffer stays for a larger input. Idle memory beyond `idle_limit` bytes is let go (smallest
buffers first), so a run's host memory is bounded by the inputs in flight plus that limit, not by the whole corpus.

With `allocate`, buffers come from it instead of numpy: `run` passes page-locked memory, which the GPU's copy engine
writes merged outputs into (--copy-engine-merge); pinning is paid once per buffer, not per input.

`ReservedMemory` is such an allocator that page-locks one block before the timed loop and carves buffers out of it:
page-locking inside the loop (cudaHostAlloc, which CUDA synchronises with other threads' calls) stalls the loop's first
batches (figures: docs/performance.md#copy-engine-merge-defaults).
"""

from __future__ import annotations

import bisect
import threading
from typing import Any, Callable

import numpy as np

# allocate(nbytes) -> (a uint8 array of nbytes, a callable that frees it)
Allocator = Callable[[int], "tuple[np.ndarray, Callable[[], None]]"]


def capacity_for(length: int) -> int:
    """Positions a buffer for `length` gets: `length` rounded up to 1/8 of its power of two (pure)."""
    length = max(int(length), 1)
    step = max(1, 1 << max(length.bit_length() - 4, 0))
    return -(-length // step) * step


class OutputPool:
    """Arrays of [positions, *feature] handed out by `take` and returned by `give`; thread-safe."""

    def __init__(self, idle_limit: int = 1 << 30, allocate: Allocator | None = None):
        self.idle_limit = int(idle_limit)
        self.allocate = allocate
        self._idle: dict[tuple, list[tuple[int, int, np.ndarray]]] = {}  # key -> sorted (capacity, serial, buffer)
        self._live: dict[int, tuple[tuple, np.ndarray]] = {}  # address -> (key, buffer) of buffers handed out
        self._free: dict[int, Callable[[], None]] = {}  # address -> what frees it (buffers from `allocate`)
        self._serial = 0
        self._lock = threading.Lock()
        self.idle_bytes = 0
        self.counts = {"taken": 0, "reused": 0, "fresh": 0, "dropped": 0}
        self.fresh_bytes = 0
        self.peak_bytes = 0  # live + idle
        self.closed = False

    def take(self, length: int, feature: tuple[int, ...], dtype: Any) -> tuple[np.ndarray, bool]:
        """An array of `length` positions x `feature` (uninitialised), and whether its pages are already mapped
        (a reused buffer, or one from `allocate`: a first write pays no page faults)."""
        dtype = np.dtype(dtype)
        key = (tuple(int(f) for f in feature), dtype.str)
        with self._lock:
            if self.closed:
                raise RuntimeError("OutputPool.take after close(): the pool's memory was freed")
            self.counts["taken"] += 1
            idle = self._idle.get(key, [])
            at = bisect.bisect_left(idle, (int(length), -(1 << 62)))  # the smallest that fits, the latest given of those
            if at < len(idle) and idle[at][0] <= 2 * capacity_for(length):  # a far larger one is kept for a larger input
                _, _, buffer = idle.pop(at)
                self.idle_bytes -= buffer.nbytes
                self.counts["reused"] += 1
                self._live[_address(buffer)] = (key, buffer)
                return buffer[:length], True
        shape = (capacity_for(length),) + key[0]
        if self.allocate is None:  # outside the lock: other takes go on
            buffer = np.empty(shape, dtype=dtype)
        else:
            raw, free = self.allocate(int(np.prod(shape)) * dtype.itemsize)
            buffer = raw.view(dtype).reshape(shape)
        with self._lock:
            if self.allocate is not None:
                self._free[_address(buffer)] = free
            self.counts["fresh"] += 1
            self.fresh_bytes += buffer.nbytes
            self._live[_address(buffer)] = (key, buffer)
            self._note_peak()
        return buffer[:length], self.allocate is not None

    def give(self, array: np.ndarray) -> None:
        """Return an array `take` handed out (or a view of it starting at its first element, as [:length]) for reuse; its
        contents may change at once. After close() it is a no-op: the memory was freed."""
        with self._lock:
            if self.closed:  # after close() every buffer was freed: nothing to keep
                return
            entry = self._live.pop(_address(array), None)
            if entry is None:
                raise ValueError(
                    "OutputPool.give: this array was not taken from the pool (or does not start where the taken one does), or was given back already"
                )
            key, buffer = entry
            self._serial += 1  # negated: of equal sizes the one given back last is taken first (its pages are warmest)
            bisect.insort(self._idle.setdefault(key, []), (buffer.shape[0], -self._serial, buffer))
            self.idle_bytes += buffer.nbytes
            while self.idle_bytes > self.idle_limit:
                self._drop_smallest()

    def _drop_smallest(self) -> None:
        key = min((k for k, v in self._idle.items() if v), key=lambda k: self._idle[k][0][2].nbytes)
        _, _, buffer = self._idle[key].pop(0)
        self.idle_bytes -= buffer.nbytes
        self.counts["dropped"] += 1
        free = self._free.pop(_address(buffer), None)
        if free is not None:
            free()

    def close(self) -> None:
        """Free what `allocate` gave, idle or handed out (call once nothing reads the arrays any more); numpy's
        buffers are left to the garbage collector."""
        with self._lock:
            self.closed = True
            frees, self._free = list(self._free.values()), {}
            self._idle, self._live, self.idle_bytes = {}, {}, 0
        for free in frees:
            free()

    def _note_peak(self) -> None:
        live = sum(b.nbytes for _, b in self._live.values())
        self.peak_bytes = max(self.peak_bytes, live + self.idle_bytes)

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self.counts,
                "fresh_mb": round(self.fresh_bytes / 2**20, 3),
                "peak_mb": round(self.peak_bytes / 2**20, 3),
                "idle_limit_mb": round(self.idle_limit / 2**20, 3),
                "memory": "numpy" if self.allocate is None else "page-locked",
            }


def _address(array: np.ndarray) -> int:
    """Where an array's data starts: a buffer and the [:length] views `take` hands out share it."""
    return int(array.__array_interface__["data"][0])


class ReservedMemory:
    """An OutputPool allocator: buffers carved in order out of one block that `allocate` gave up front (page-aligned
    pieces; freeing one is a no-op, the block is freed by close()), and from `allocate` itself once the block is used
    up. Thread-safe."""

    def __init__(self, nbytes: int, allocate: Allocator, align: int = 4096):
        self.allocate, self.align = allocate, int(align)
        self.block, self._free_block = allocate(int(nbytes)) if nbytes > 0 else (None, None)
        self.reserved = self.block.nbytes if self.block is not None else 0
        self.used = 0
        self.counts = {"carved": 0, "beyond": 0}
        self.beyond_bytes = 0
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> tuple[np.ndarray, Callable[[], None]]:
        size = -(-int(nbytes) // self.align) * self.align
        with self._lock:
            if self.block is not None and self.used + size <= self.block.nbytes:
                piece = self.block[self.used : self.used + int(nbytes)]
                self.used += size
                self.counts["carved"] += 1
                return piece, _keep
            self.counts["beyond"] += 1
            self.beyond_bytes += int(nbytes)
        return self.allocate(int(nbytes))  # outside the lock: page-locking takes long

    def close(self) -> None:
        """Free the block (call after the pool's close(): its carved buffers are then unused)."""
        with self._lock:
            free, self._free_block, self.block = self._free_block, None, None
        if free is not None:
            free()

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self.counts,
                "reserved_mb": round(self.reserved / 2**20, 3),
                "used_mb": round(self.used / 2**20, 3),
                "beyond_mb": round(self.beyond_bytes / 2**20, 3),
            }


def _keep() -> None:
    """A carved buffer's free: its memory goes back with the whole block."""
