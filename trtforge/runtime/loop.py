"""The run loop's decisions, kept free of any runtime so they are tested on a CPU.

- `GraphCache`: when a batch may replay a captured CUDA graph, when to capture one, and when it must
  run as a plain enqueue. TensorRT bakes shape-dependent state into a context at its first enqueue
  after a shape change (its docs: enqueue once after a shape change, then capture), so a graph of
  (profile, shape) is only replayed while that profile's context last ran that very shape; a graph
  also bakes its buffer addresses in, so graphs are kept per staging slot.
- `Batcher` / `stream_batches`: chunks planned by a worker pool, document by document, batched as
  they arrive (the same batches `run.make_batches` forms, in the order they fill), so tokenization
  and chunk planning overlap execution, a bounded lead ahead of it; or, with no workers, planned on the
  consumer's thread when its batches are needed (no thread contends with it for the GIL).
- `slot_bytes`, `completion_intervals`, `wall_over_gpu`, `batch_timeline`: staging-buffer sizes and the clock.
- `StageClock`: seconds per host stage (planning, staging, waiting on the GPU, copying out, merging),
  summed over threads, so a run whose wall time exceeds its GPU time says where the rest went.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Sequence

from trtforge.core.errors import UserError

ENQUEUE, CAPTURE, LAUNCH = "enqueue", "capture", "launch"


@dataclass
class GraphCache:
    """Per (profile, shape, slot) CUDA graphs; `action` says what the next batch does, `done` records it."""

    enabled: bool = True
    graphs: dict[tuple[int, Hashable, int], Any] = field(default_factory=dict)
    current: dict[int, Hashable] = field(default_factory=dict)  # shape each profile's context last enqueued
    failed: dict[tuple[int, Hashable], str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {ENQUEUE: 0, CAPTURE: 0, LAUNCH: 0})
    disabled_reason: str | None = None

    def action(self, profile: int, shape: Hashable, slot: int) -> str:
        if not self.enabled or (profile, shape) in self.failed or self.current.get(profile) != shape:
            return ENQUEUE  # a shape change needs one plain enqueue before TensorRT's state may be captured
        return LAUNCH if (profile, shape, slot) in self.graphs else CAPTURE

    def done(self, profile: int, shape: Hashable, slot: int, action: str, graph: Any = None, error: str | None = None) -> None:
        """After the batch ran: `graph` is the captured one (CAPTURE), `error` why capture failed (then it ran plainly)."""
        if action == CAPTURE and error is not None:
            self.failed[(profile, shape)] = error
            action = ENQUEUE
        elif action == CAPTURE:
            self.graphs[(profile, shape, slot)] = graph
        if action == ENQUEUE:
            self.current[profile] = shape
        self.counts[action] += 1

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "enabled": self.enabled,
            "graphs": len(self.graphs),
            "captured": self.counts[CAPTURE],
            "replayed": self.counts[LAUNCH],
            "plain_enqueues": self.counts[ENQUEUE],
            "fallbacks": [{"profile": p, "shape": _jsonable(s), "reason": r} for (p, s), r in self.failed.items()],
        }
        if self.disabled_reason:
            out["reason"] = self.disabled_reason
        return out


class StageClock:
    """Thread-safe seconds per named stage. Stages on different threads overlap, so their sum may exceed
    the loop's wall time; a stage's own figure is what that thread spent on it. Each stage also sums the CPU time its
    thread used meanwhile (time.thread_time): wall seconds far above CPU seconds in a stage that waits on nothing of its
    own (a merge) are time spent waiting for the GIL or a core, which the wall clock alone cannot tell from work."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu_seconds
            self.counts[name] = self.counts.get(name, 0) + 1

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start, time.thread_time() - cpu)

    def report(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {
                k: {"seconds": round(v, 6), "cpu_seconds": round(self.cpu[k], 6), "count": self.counts[k]} for k, v in self.seconds.items()
            }


def _jsonable(shape: Any) -> Any:
    return [list(s) if isinstance(s, tuple) else s for s in shape] if isinstance(shape, tuple) else shape


def slot_bytes(profile_bytes: dict[int, dict[str, int]]) -> dict[str, int]:
    """One staging slot holds any profile's batch: per tensor, the largest size over the profiles. Sized
    once, so buffer addresses never change and captured graphs stay valid."""
    sizes: dict[str, int] = {}
    for tensors in profile_bytes.values():
        for name, nbytes in tensors.items():
            sizes[name] = max(sizes.get(name, 0), int(nbytes))
    return sizes


def completion_intervals(start: float, done: Sequence[float]) -> list[float]:
    """Wall time each batch cost: the gap since the previous batch completed (the first: since start).
    They sum to the loop's wall time, so their mean against GPU time says how busy the GPU was."""
    out, last = [], start
    for t in done:
        out.append(t - last)
        last = t
    return out


def wall_over_gpu(wall_ms: Sequence[float], gpu_ms: Sequence[float | None]) -> float | None:
    gpu = [g for g in gpu_ms if g is not None]
    if not gpu or len(gpu) != len(wall_ms) or sum(gpu) <= 0:
        return None
    return float(sum(wall_ms) / sum(gpu))


TIMELINE_LIMIT = 20_000  # batches listed in a report's timeline (~0.3 MB of JSON)


def batch_timeline(wall_ms: Sequence[float], gpu_ms: Sequence[float | None], limit: int = TIMELINE_LIMIT) -> dict[str, Any]:
    """Each batch's wall and GPU ms in collection order (the first `limit`): shows when the loop stalled
    (start-up, drain, periodic), which the percentiles cannot."""
    shown = min(len(wall_ms), max(0, int(limit)))
    return {
        "batches": len(wall_ms),
        "shown": shown,
        "wall_ms": [round(float(w), 3) for w in wall_ms[:shown]],
        "gpu_ms": [None if g is None else round(float(g), 3) for g in gpu_ms[:shown]],
    }


GPU_WAITS = ("spin", "block")  # how the collector waits for a batch (tensorrt_runtime.TrtRunner)


def check_gpu_wait(value: str) -> None:
    if value not in GPU_WAITS:
        raise UserError(f"unknown --gpu-wait '{value}'; use {' or '.join(GPU_WAITS)}.")


def padded_batch(shapes: dict[str, tuple[int, ...]], ran: set[int]) -> int | None:
    """The rows to pad a batch to: the fewest of those that already ran (`ran`, at the same dims after the batch axis)
    above its own, None where it has a size that ran, none is larger, or its inputs disagree on the batch axis. Pure.

    Why: a stream's last batch is partial, and a batch size the engine has not run is a new shape, which costs many
    full batches' GPU time (TensorRT's first run of a shape, trtforge's plugins' per-shape cuDNN graphs and GEMM choice,
    a CUDA-graph capture; figures: docs/performance.md#run-loop-defaults). Padded with copies of its last row, it
    replays a captured graph; rows never mix in these models, and the padding rows are dropped before anything reads
    the outputs."""
    sizes = {dims[0] for dims in shapes.values() if dims}
    if len(sizes) != 1:
        return None
    own = sizes.pop()
    if own in ran:
        return None
    larger = [r for r in ran if r > own]
    return min(larger) if larger else None


class Batcher:
    """Chunks grouped by shape key into batches of at most `size`: a batch is emitted when its group
    fills, the rest by `flush` in group order. Same batches as run.make_batches, in the order they fill.
    `group()` makes an empty batch (a list, or run.Batch, which keeps a block's rows as runs)."""

    def __init__(self, size: int, key: Callable[[Any], Hashable], naive: bool = False, group: Callable[[], Any] = list):
        self.size, self.key, self.naive, self.group = max(int(size), 1), key, naive, group
        self.groups: dict[Hashable, Any] = {}

    def _group(self, key: Hashable) -> Any:
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = self.group()
        return group  # kept where it filled (a fresh one in its place): flush keeps the groups' first-seen order

    def add(self, chunk: Any) -> list[Any]:
        if self.naive:
            return [[chunk]]
        key = self.key(chunk)
        group = self._group(key)
        group.append(chunk)
        if len(group) == self.size:
            self.groups[key] = self.group()  # replaced, not removed: flush keeps the groups' first-seen order
            return [group]
        return []

    def add_many(self, chunks: Sequence[Any]) -> list[Any]:
        """add() of each chunk in turn (the same batches), a run of equal keys at a time: a document's windows mostly
        share one key, so they join their group by slices rather than one append and length check each. Chunks that
        come as runs of rows (`chunks.block_runs()`: (key, block, rows) each, run.DocumentPlan) join as runs, never
        one chunk at a time (their groups need `add_rows(block, first row, rows)`: run.Batch)."""
        if self.naive:
            return [[c] for c in chunks]
        runs = chunks.block_runs() if hasattr(chunks, "block_runs") else None
        if runs is None:
            keys = [self.key(c) for c in chunks]
            runs, i = [], 0
            while i < len(chunks):
                j = i + 1
                while j < len(chunks) and keys[j] == keys[i]:
                    j += 1
                runs.append((keys[i], (i, j), j - i))
                i = j
        out: list[Any] = []
        for key, item, rows in runs:
            done = 0
            while done < rows:
                group = self._group(key)
                take = min(rows - done, self.size - len(group))
                if isinstance(item, tuple):  # a slice of the plain chunks
                    group.extend(chunks[item[0] + done : item[0] + done + take])
                else:
                    group.add_rows(item, done, take)
                done += take
                if len(group) == self.size:
                    out.append(group)
                    self.groups[key] = self.group()
        return out

    def flush(self) -> list[Any]:
        out = [g for g in self.groups.values() if len(g)]
        self.groups = {}
        return out


def put_while(q: queue.Queue, item: Any, going: Callable[[], bool], poll_s: float = 0.05) -> bool:
    """Put `item` into the bounded queue `q` once there is room, as long as going() holds (checked before each try,
    every `poll_s` while full); False if it stopped holding first. A blocking put would hang on a consumer that left."""
    while going():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False


_END = object()
_PLANNING = "trtforge-plan"  # the planning threads' names


def stream_batches(
    n_docs: int,
    plan: Callable[[int], list[Any]],
    batcher: Batcher,
    workers: int = 2,
    on_plan: Callable[[int, list[Any]], None] = lambda d, chunks: None,
    ahead: int = 0,
) -> Iterator[list[Any]]:
    """Batches as documents are planned on `workers` threads (document order kept): `on_plan(d, chunks)`
    runs before any chunk of document d is handed out, so a consumer may rely on it. A planning error
    is raised in the consumer. Closing the iterator early stops planning: documents not yet started are
    never planned, and it returns once those under way are done.

    ahead > 0 bounds how far planning runs ahead of the consumer: at most `ahead` batches wait to be taken and
    2 x `workers` documents are handed to the threads at a time. Unbounded (0), planning that outpaces the GPU
    (texts tokenized elsewhere) ran every document at once at the start, its threads contending for the GIL
    with the thread feeding the GPU, which then stalled (figures: docs/performance.md#run-loop-defaults).

    workers == 0: no threads; each document is planned on the consumer's thread when the batches before it are taken
    (`ahead` does not apply), and a planning error is raised there."""
    if workers == 0:
        yield from _planned_inline(n_docs, plan, batcher, on_plan)
        return
    out: queue.Queue = queue.Queue(maxsize=max(0, int(ahead)))
    window = 2 * max(1, workers) if ahead > 0 else max(1, n_docs)
    producer = _PlanningProducer(n_docs, plan, batcher, workers, on_plan, window, out)
    thread = threading.Thread(target=producer.produce, name=_PLANNING, daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        producer.stop.set()
        # An iterator nobody closed is finalized by the garbage collector on whichever thread runs it, maybe a
        # planning one: joining there would wait for itself (found as a hang after a failed loop).
        if not threading.current_thread().name.startswith(_PLANNING):
            thread.join()


@dataclass
class _PlanningProducer:
    """The planning thread of stream_batches: documents planned on a pool of threads in document order, their batches
    put into the bounded queue the consumer reads, until it stops (`stop`)."""

    n_docs: int
    plan: Callable[[int], list[Any]]
    batcher: Batcher
    workers: int
    on_plan: Callable[[int, list[Any]], None]
    window: int  # documents handed to the threads at a time
    out: queue.Queue
    stop: threading.Event = field(default_factory=threading.Event)

    def put(self, item: Any) -> bool:
        """Into the queue once there is room; False if the consumer has gone."""
        return put_while(self.out, item, lambda: not self.stop.is_set())

    def produce(self) -> None:
        """Every document's batches, then the batcher's rest and the end; an error is handed to the consumer."""
        pool = ThreadPoolExecutor(max_workers=max(1, self.workers), thread_name_prefix=_PLANNING)
        try:
            pending: deque = deque()
            for d in range(self.n_docs):
                while len(pending) < self.window and d + len(pending) < self.n_docs:
                    pending.append(pool.submit(self.plan, d + len(pending)))
                chunks = pending.popleft().result()
                if self.stop.is_set():
                    return
                self.on_plan(d, chunks)
                for b in self.batcher.add_many(chunks):
                    if not self.put(b):
                        return
            for b in self.batcher.flush():
                if not self.put(b):
                    return
            self.put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            self.put(exc)
        finally:  # documents not yet started are never planned; those under way finish
            pool.shutdown(wait=True, cancel_futures=True)


def _planned_inline(
    n_docs: int, plan: Callable[[int], list[Any]], batcher: Batcher, on_plan: Callable[[int, list[Any]], None]
) -> Iterator[list[Any]]:
    """stream_batches with no planning threads: each document planned on the consumer's thread when its batches are
    needed, so no thread contends with it for the GIL."""
    for d in range(n_docs):
        chunks = plan(d)
        on_plan(d, chunks)
        yield from batcher.add_many(chunks)
    yield from batcher.flush()
