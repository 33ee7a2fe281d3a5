"""The copy-engine merge: the GPU's copy engine writes each window's kept slice of a token output straight into its
input's merged output, so the host never copies those bytes (`run` on an engine with --no-precision-check;
--no-copy-engine-merge turns it off).

Why: `run`'s host merge copied every batch's token output twice (the D2H copy into a staging slot, then np.take
into the merged output): 5.5 MB per MiniLM batch, 11 MB per BERT-base one. That merge took a merge thread longer than
the batch's GPU time, and the staging slot stayed held until it finished, so the GPU waited (figures:
docs/performance.md#copy-engine-merge-defaults). Under 'center' merging, a batch's consecutive windows of one input keep
slices that tile one range of its merged output, one slice per row at the same offset for the interior windows:
one strided (2-D) copy per run of like windows (StreamingMerge.run_copies). The merged outputs come from page-locked
pooled memory (outpool.OutputPool with tensorrt_runtime.allocate_pinned), so the copies are asynchronous and
pinning is paid once per pooled buffer. The earlier `--direct-merge` page-locked every input's output and copied row
by row: a copy per row and a cudaHostRegister per input cost more than the merge it removed.

Its outputs are bit-equal to the host merge's. With each pooled buffer page-locked when first needed, inside the timed
loop, it ran slower than the host merge, the time going to the page-locking. So `run` page-locks one block before the
clock (outpool.ReservedMemory, sized by `reserve_bytes`) and carves the pool's buffers out of it. That way it runs
closer to the GPU's time than the host merge, and it is on by default. Reserving takes time before the clock, reported
as runtime.output_pool.reserved. Figures: docs/performance.md#copy-engine-merge-defaults.

Pure: plans addresses and byte counts from the merger's state; the runtime issues the copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from trtforge.runtime.chunking import RowRun, StreamingMerge, row_runs
from trtforge.runtime.outpool import capacity_for


@dataclass
class OutputCopies:
    """Where one output of a batch goes (TrtRunner.run_many's `place`): `strided` copies straight into page-locked
    memory, each (host address, host pitch, offset in the output, output pitch, width, rows) in bytes, one 2-D copy
    each; the staging slot gets only the `slot_rows` ranges (first row, rows) instead of the whole output."""

    strided: list[tuple[int, int, int, int, int, int]]
    slot_rows: list[tuple[int, int]]


@dataclass
class Placed:
    """What the copies of one output of a batch wrote: the batch rows, and (input, first window, windows) runs,
    which the merge then counts as added (StreamingMerge.mark) instead of copying them from the slot."""

    rows: set[int]
    runs: list[tuple[int, int, int]]


def reserve_bytes(
    position_bounds: list[int], bytes_per_position: int, windows_in_flight: int | None, chunk: int, factor: float = 2.5
) -> int:
    """Page-locked bytes to reserve before the loop for the merged token outputs (pure): `factor` x the positions of the
    windows in flight (queued, on the GPU, merging) x their bytes per position, at most what every input's merged
    output could take (each input's upper bound of positions, rounded up as the pool rounds it). factor 2.5: the pool's
    fresh memory was about 2x those bytes on MiniLM and BERT-base (docs/performance.md#copy-engine-merge-defaults), since
    inputs planned ahead hold their buffers and idle ones of other sizes stay pooled. windows_in_flight None: planning
    is unbounded (every input may be in flight)."""
    whole = sum(capacity_for(n) for n in position_bounds if n > 0) * bytes_per_position
    if windows_in_flight is None:
        return whole
    return max(0, min(whole, int(factor * windows_in_flight * chunk * bytes_per_position)))


class CopyEngineMerge:
    """Plans, per batch, the copies of each token output `names` into the merged outputs `stream(input, name)` gives
    (None where an input has no prepared merged output: those rows go through the slot and the host merge).

    `windows_of(doc)` is how many windows an input has (single-window inputs are not streamed: host merge)."""

    def __init__(
        self,
        names: list[str],
        dtypes: dict[str, np.dtype],
        stream: Callable[[int, str], StreamingMerge | None],
        windows_of: Callable[[int], int],
    ):
        self.names, self.dtypes, self.stream, self.windows_of = names, dtypes, stream, windows_of
        self.counts = {"batches": 0, "copies": 0, "rows": 0, "host_rows": 0, "bytes": 0}

    def place(self, batch: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, OutputCopies], dict[str, Placed]]:
        """`batch`: a run.Batch, or chunks with .doc, .index, .content (chunking.row_runs)."""
        copies: dict[str, OutputCopies] = {}
        placed: dict[str, Placed] = {}
        runs = row_runs(batch)
        rows = len(batch)
        for name in self.names:
            shape = shapes.get(name)
            if shape is None or len(shape) < 2 or shape[0] != rows:
                continue
            row_bytes = math.prod(shape[2:]) * np.dtype(self.dtypes[name]).itemsize
            strided: list[tuple[int, int, int, int, int, int]] = []
            done = Placed(set(), [])
            left: list[tuple[int, int]] = []  # (first row, rows) through the slot
            for run in runs:
                if self.windows_of(run.doc) > 1 and self._place_run(run, name, shape, row_bytes, strided):
                    done.rows.update(range(run.row, run.row + run.count))
                    done.runs.append((run.doc, run.first, run.count))
                elif left and left[-1][0] + left[-1][1] == run.row:
                    left[-1] = (left[-1][0], left[-1][1] + run.count)
                else:
                    left.append((run.row, run.count))
            copies[name] = OutputCopies(strided, left)
            placed[name] = done
            self.counts["copies"] += len(strided)
            self.counts["rows"] += len(done.rows)
            self.counts["host_rows"] += rows - len(done.rows)
            self.counts["bytes"] += sum(c[4] * c[5] for c in strided)
        self.counts["batches"] += 1
        return copies, placed

    def _place_run(
        self, run: RowRun, name: str, shape: tuple[int, ...], row_bytes: int, strided: list[tuple[int, int, int, int, int, int]]
    ) -> bool:
        """Copies for one run into its input's merged output; False (host merge) where there is none to write into (none
        yet, or not from a page-locked pool), of this output's layout, or a window would need positions past its row
        (the host merge then says so)."""
        stream = self.stream(run.doc, name)
        pinned = stream is not None and getattr(stream.pool, "allocate", None) is not None  # async copies need page-locked memory
        merged = stream.merged if pinned else None
        if merged is None or merged.dtype != np.dtype(self.dtypes[name]) or merged.shape[1:] != tuple(shape[2:]):
            return False
        length = shape[1]
        longest = run.length if run.length is not None else max(w.length for w in stream.windows[run.first : run.first + run.count])
        if run.content_start + longest > length:
            return False
        base = int(merged.__array_interface__["data"][0])
        for src, dst, width, rows, src_step, dst_step in stream.run_copies(
            run.first, run.count, run.row * length + run.content_start, length
        ):
            strided.append(
                (
                    base + dst * row_bytes,
                    max(dst_step, width) * row_bytes,
                    src * row_bytes,
                    max(src_step, width) * row_bytes,
                    width * row_bytes,
                    rows,
                )
            )
        return True

    def report(self) -> dict[str, Any]:
        return {"enabled": True, "outputs": list(self.names), **self.counts, "mb": round(self.counts["bytes"] / 2**20, 3)}
