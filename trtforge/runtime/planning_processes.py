"""Text inputs tokenized and cut into windows in worker processes, for `run` (`--plan-processes N`).

Why processes: in `run` every millisecond a thread of the loop's process holds the GIL is one the thread feeding
the GPU may wait for. Tokenizing releases the GIL, but turning its ids into an array does not, and planning a text
input's windows (tokenize.wrap_spans, run.text_feeds) is a few dozen numpy calls driven from Python per input, a large
share of what holds the GIL in the loop's process (figures: docs/performance.md#run-loop-defaults). A worker plans a
whole input (run.plan_document) and returns its plan in one pickle: a few arrays per block of equal-length windows
(run.DocumentPlan), so the loop's process only unpickles it. concurrent.futures' process pool does the transport;
nothing here is a hand-written pool.

Workers are spawned (tokenizers' own threads do not survive a fork), load the tokenizer and the planning settings
once, plan one input per call on their own thread (a tokenizers thread pool per process would only add threads) and
ignore Ctrl-C, which the parent handles; `start` returns once every worker is up, so that a caller can do it before
its clock starts.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from trtforge.core.errors import UserError


@dataclass(frozen=True)
class PlanSettings:
    """What run.plan_document needs besides the input: the same for every input of a run."""

    specs: list[Any]  # config.InputSpec
    layout: Any  # layout.Layout
    chunk: int | None
    overlap: int
    limits: Any  # run.Limits
    full_last: bool


class PlanningProcesses:
    """Text inputs (from text or pre-tokenized ids) planned in `processes` worker processes: `submit` them, then
    `plan(d)` gives input d's chunks (a run.DocumentPlan, or one Chunk where it needs no chunking), the ids the
    worker tokenized (None where the input came as ids) and the worker's wall and CPU seconds on it, or raises the
    worker's error (a UserError stays one). `ahead` inputs are with the workers at a time (default 2 per process)."""

    def __init__(self, directory: str | Path, processes: int, settings: PlanSettings, ahead: int | None = None):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.processes = max(1, int(processes))
        self.pool = ProcessPoolExecutor(
            self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init, initargs=(str(directory), settings)
        )
        self.ahead = max(1, int(ahead or 2 * self.processes))
        self.futures: dict[int, Any] = {}  # handed to the workers, not yet taken by plan()
        self.queued: deque[tuple[int, Any]] = deque()  # submitted, not yet handed to the workers
        self.ready: set[int] = set()  # process ids of the workers seen up
        self._lock = threading.Lock()  # plan() runs on several planning threads

    def start(self) -> None:
        """Every worker up, its tokenizer loaded. A pool spawns a worker per task while none is idle, so one round
        of tasks spawns them all; but a worker up early may run several of them while another is still importing
        (~0.5 s), so rounds go on until every worker has answered: returning after one round leaves workers
        starting while the clock runs, and the run's first batches wait on them."""
        from concurrent.futures.process import BrokenProcessPool

        from trtforge.core.interrupts import ignored_while_spawning

        try:
            while len(self.ready) < self.processes:
                with ignored_while_spawning():  # submitting spawns the workers: they start with Ctrl-C ignored
                    answers = [self.pool.submit(_worker_ready, 0.05) for _ in range(self.processes)]
                self.ready.update(f.result() for f in answers)
        except BrokenProcessPool as exc:
            self.close()
            raise UserError(
                f"the {self.processes} planning processes could not start ({exc}; their error is printed above); "
                "run without --plan-processes."
            ) from None

    def submit(self, docs: dict[int, Any]) -> None:
        """Inputs by index (run.Document of kind text: its text, or its ids), planned in that order, `ahead` at a
        time: more go to the workers as plan() takes plans, so the finished plans held in this process stay bounded
        (handed over all at once, every input's windows would sit here: ~33 bytes per token of the corpus)."""
        with self._lock:
            self.queued.extend(docs.items())
            self._hand_over(None)

    def plan(self, d: int) -> tuple[Sequence[Any], np.ndarray | None, float, float]:
        """Input d's chunks, the ids its worker tokenized (None: it came as ids), and the worker's wall and CPU
        seconds planning it; a worker's error is raised here."""
        from concurrent.futures.process import BrokenProcessPool

        with self._lock:
            self._hand_over(d)
            future = self.futures.pop(d)
            self._hand_over(None)  # the next one to the workers in its place
        try:
            return future.result()
        except BrokenProcessPool:
            raise _died() from None

    def _hand_over(self, d: int | None) -> None:
        """Queued inputs to the workers, in order, until `ahead` are with them and (d given) d is among them."""
        from concurrent.futures.process import BrokenProcessPool

        while self.queued and (len(self.futures) < self.ahead or (d is not None and d not in self.futures)):
            k, doc = self.queued.popleft()
            try:
                self.futures[k] = self.pool.submit(_worker_plan, k, doc)
            except BrokenProcessPool:
                raise _died() from None

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _died() -> UserError:
    # the input named would be a guess: a dead worker fails every input the pool holds
    return UserError(
        "a planning process died (out of memory?) while inputs were being planned; run without --plan-processes, or with fewer."
    )


_WORKER: dict[str, Any] = {}


def _worker_init(directory: str, settings: PlanSettings) -> None:
    import os

    from trtforge.runtime.tokenize import TextTokenizer

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one input per call: no use for a thread pool
    _WORKER.update(tokenizer=TextTokenizer(directory), settings=settings)


def _worker_ready(seconds: float) -> int:
    import os
    import time

    assert "tokenizer" in _WORKER
    time.sleep(seconds)  # held long enough that the other start-up tasks find no idle worker
    return os.getpid()


def _worker_plan(d: int, doc: Any) -> tuple[Sequence[Any], np.ndarray | None, float, float]:
    import time

    from trtforge.runtime.planning import plan_document

    start, cpu = time.perf_counter(), time.thread_time()
    s: PlanSettings = _WORKER["settings"]
    tokenized_here = doc.ids is None
    chunks = plan_document(d, doc, s.specs, s.layout, s.chunk, s.overlap, s.limits, _WORKER["tokenizer"], [], s.full_last)
    return chunks, (doc.ids if tokenized_here else None), time.perf_counter() - start, time.thread_time() - cpu
