"""Pure pieces of the Ray scale-out: how work is cut into units, and which unit is where.

A unit is a run of whole consecutive documents (run) or of whole batches (calibrate): documents are
never split across actors, so each document's chunk plan and merge stay those of one process. The
ledger moves each unit pending -> in flight on one worker -> done, exactly once; a unit whose worker
died goes back to pending and is retried elsewhere, so no document is lost or counted twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


def unit_size(total_chunks: int, workers: int, batch_size: int, per_worker: int = 4, max_batches: int = 32) -> int:
    """Chunks per unit: about `per_worker` units per worker (so a slow or lost worker's share spreads
    out), at least one full batch, at most `max_batches` batches (bounded memory per call)."""
    wanted = -(-total_chunks // max(1, workers * per_worker))
    return max(batch_size, min(wanted, batch_size * max_batches))


def plan_units(doc_chunks: list[int], size: int) -> list[list[int]]:
    """Consecutive documents grouped until a group holds >= `size` chunks; a long document is its own unit."""
    units: list[list[int]] = []
    current: list[int] = []
    count = 0
    for d, n in enumerate(doc_chunks):
        current.append(d)
        count += n
        if count >= size:
            units.append(current)
            current, count = [], 0
    if current:
        units.append(current)
    return units


def split_evenly(n: int, parts: int) -> list[range]:
    """range(n) cut into `parts` contiguous pieces whose sizes differ by at most one (empty ones dropped)."""
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append(range(start, stop))
        start = stop
    return [r for r in out if len(r)]


class WorkerLost(RuntimeError):
    """A unit failed on `max_attempts` workers in a row: something in the unit kills workers."""


@dataclass
class Ledger:
    """Where each unit is. `affinity[u] = w`: only worker w takes u while w lives (it holds u's outputs)."""

    units: int
    max_attempts: int = 3
    affinity: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pending: deque[int] = deque(range(self.units))
        self.inflight: dict[int, int] = {}
        self.done: dict[int, int] = {}  # unit -> the worker whose result was committed
        self.attempts = [0] * self.units
        self.dead: set[int] = set()

    def take(self, worker: int) -> int | None:
        """The next unit for `worker` (None: nothing it may take now)."""
        for i, u in enumerate(self.pending):
            owner = self.affinity.get(u)
            if owner is None or owner == worker or owner in self.dead:
                del self.pending[i]
                self.inflight[u] = worker
                self.attempts[u] += 1
                return u
        return None

    def finish(self, unit: int, worker: int) -> None:
        """Commit `unit`'s result from `worker`; anything but the one in-flight copy is a bug."""
        if self.inflight.get(unit) != worker:
            raise RuntimeError(
                f"unit {unit} finished on worker {worker}, but it is in flight on {self.inflight.get(unit)} (done: {unit in self.done})"
            )
        del self.inflight[unit]
        self.done[unit] = worker

    def lost(self, worker: int) -> list[int]:
        """`worker` died: its in-flight units go back to the front of the queue (they were next)."""
        self.dead.add(worker)
        units = sorted(u for u, w in self.inflight.items() if w == worker)
        for u in units:
            del self.inflight[u]
            if self.attempts[u] >= self.max_attempts:
                raise WorkerLost(
                    f"unit {u} was lost with its Ray worker {self.attempts[u]} times; see the Ray logs "
                    "(/tmp/ray/session_latest/logs) for why the workers died."
                )
        self.pending.extendleft(reversed(units))
        return units

    def loads(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for w in self.inflight.values():
            out[w] = out.get(w, 0) + 1
        return out

    @property
    def complete(self) -> bool:
        return len(self.done) == self.units


def worker_figures(tokens: int, busy_s: float, chunks: int, batches: int) -> dict[str, Any]:
    """A worker's throughput over the time it spent inferring (its own clock, warm-up excluded)."""
    return {
        "tokens": tokens,
        "chunks": chunks,
        "batches": batches,
        "busy_s": busy_s,
        "tokens_per_s": tokens / busy_s if busy_s > 0 else 0.0,
        "chunks_per_s": chunks / busy_s if busy_s > 0 else 0.0,
    }
