"""Merging chunk outputs back into one output per document, by output kind."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from trtforge.core.errors import UserError
from trtforge.runtime.audio import FrameRate, frame_windows, merge_frames
from trtforge.runtime.chunking import (
    RowRun,
    StreamingMerge,
    Tile,
    Window,
    merge_logits,
    merge_pooled,
    merge_tiles,
    row_runs,
)
from trtforge.runtime.copymerge import Placed
from trtforge.runtime.documents import Chunk, Document, DocumentPlan
from trtforge.runtime.options import RunOptions
from trtforge.runtime.outpool import OutputPool
from trtforge.runtime.outputs import OutputKind
from trtforge.runtime.slicing import merge_slices


def chunk_part(kind: OutputKind, chunk: Chunk, value: np.ndarray) -> np.ndarray:
    """One chunk's share of one output, batch axis dropped: token outputs keep only the document's
    positions (no special tokens), moved to axis 0."""
    part = value[0]
    if kind.kind == "token":
        part = np.moveaxis(part, kind.seq_dim - 1, 0)
        if chunk.content is not None:
            part = part[chunk.content]
    return part


def kept_size(window: Any) -> int:
    """Positions (pixels) a window (tile) keeps under 'center': its weight in a pooled or logits merge. Its full
    length would count overlaps twice, and a full-length last window (mostly a repeat of its neighbour) as a
    whole window of the input's end."""
    if isinstance(window, Tile):
        return kept_size(window.rows) * kept_size(window.cols)
    return window.keep_end - window.keep_start


def merge_document(
    doc: Document,
    kind: OutputKind,
    parts: list[tuple[Chunk, np.ndarray]],
    options: RunOptions,
    scores: list[tuple[Chunk, np.ndarray]] | None = None,
) -> np.ndarray:
    """One input's output from its chunks' parts (chunk_part), by the output's kind. A boxes output takes its
    box_scores output's parts (`scores`) too, and gives the image's merged detections (runtime/slicing.py)."""
    if kind.kind == "boxes":
        assert kind.boxes is not None and scores is not None
        by_chunk = {c.index: v for c, v in scores}
        slices = [
            (c.window if isinstance(c.window, Tile) else None, v, by_chunk[c.index]) for c, v in sorted(parts, key=lambda p: p[0].index)
        ]
        return merge_slices(slices, kind.boxes, options.box_merge, options.iou)
    parts = sorted(parts, key=lambda p: p[0].index)
    chunks, values = [c for c, _ in parts], [v for _, v in parts]
    tokens = [kept_size(c.window) for c in chunks]  # positions each chunk alone speaks for: overlaps count once
    if kind.kind == "logits":  # a probability vector per input, however many chunks
        return merge_logits(values, tokens, "mean_softmax")
    if kind.kind == "token" and kind.stride:
        return merge_frames(kind, [c.window for c in chunks], values, doc.length, options.merge)
    if len(values) == 1:
        return values[0]
    if kind.kind == "token":
        merger = StreamingMerge([c.window for c in chunks], doc.length, options.merge)
        for i, v in enumerate(values):
            merger.add(i, v)
        return merger.result()
    if kind.kind == "pooled":
        return merge_pooled(values, tokens)
    if doc.kind != "image":
        raise UserError(f"output '{kind.name}' is dense but the input '{doc.name}' is not an image; declare the output's kind.")
    h, w = doc.hw
    return merge_tiles(values, h, w, options.chunk or max(h, w), options.overlap if options.chunk else 0, options.merge, kind.scale or 1.0)


def plan_windows_of(chunks: Sequence[Chunk]) -> list[Any]:
    """One input's windows (tiles), in chunk order: a DocumentPlan's from its blocks, without making its chunks."""
    return chunks.windows if isinstance(chunks, DocumentPlan) else [c.window for c in chunks]


def kept_sizes(windows: list[Any]) -> list[int]:
    """kept_size of each window, without a call per 1-D window."""
    if windows and isinstance(windows[0], Window):
        return [keep_end - keep_start for _, _, keep_start, keep_end in windows]
    return [kept_size(w) for w in windows]


class Merger:
    """Every output of every input merged back from its chunks as batches arrive: token outputs
    stream into chunking.StreamingMerge, pooled and logits rows are kept a run at a time and merged per input, dense
    tiles are kept per tile and merged per input.

    With `on_done`, each input is finished as soon as its last chunk is merged: on_done(d, outputs, release) gets its
    merged outputs (views of pooled memory for streamed token outputs) and must call release() once it is done with
    them, which gives their memory back to `pool` for later inputs. Without it, `results()` returns every input at
    the end (the memory of all of them held until then). A batch is read as runs of consecutive windows of one input
    (chunking.row_runs), so a batch of a few inputs' windows costs a few steps, not one per window."""

    def __init__(
        self,
        docs: list[Document],
        chunks: Sequence[Chunk],
        kinds: dict[str, OutputKind],
        options: RunOptions,
        templates: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None,
        pool: OutputPool | None = None,
        on_done: Callable[[int, dict[str, np.ndarray], Callable[[], None]], None] | None = None,
    ):
        self.docs, self.kinds, self.options = docs, kinds, options
        self.templates = templates or {}  # token output -> (shape per position, dtype), seen in the warm-up
        self.pool, self.on_done = pool, on_done
        self.windows: dict[int, list[Any]] = {}
        self.counts = [0] * len(docs)
        self.remaining = [0] * len(docs)  # chunks of each input not merged yet (on_done fires at 0)
        self.finished = 0
        for c in chunks:
            self.windows.setdefault(c.doc, []).append(c.window)
            self.counts[c.doc] += 1
            self.remaining[c.doc] += 1
        self.streams: dict[tuple[int, str], StreamingMerge] = {}
        self.parts: dict[tuple[int, str], list[tuple[Chunk, np.ndarray]]] = {}  # dense tiles, single-window token rows
        self.rows: dict[tuple[int, str], list[tuple[int, np.ndarray]]] = {}  # pooled / logits: (first window, its run's rows)
        self._lock = threading.Lock()  # add() runs on several threads: creating a stream and counting are guarded

    def prepare(self, chunks: Sequence[Chunk]) -> None:
        """Allocate and page in one document's merged token outputs (StreamingMerge.preallocate), on the
        planning thread that just planned it, before any of its batches runs."""
        if len(chunks) < 2:
            return
        d = chunks[0].doc if not isinstance(chunks, DocumentPlan) else chunks.blocks[0].doc
        windows = plan_windows_of(chunks)
        for name, (feature, dtype) in self.templates.items():
            stream = StreamingMerge(*self._frames(d, name, windows), self.options.merge, self.pool)
            stream.preallocate(feature, dtype)
            with self._lock:
                self.streams[(d, name)] = stream

    def add_plan(self, chunks: Sequence[Chunk]) -> None:
        """One document's chunks, planned after construction (run() plans while batches run): call
        before any of its batches reaches `add`."""
        if not len(chunks):
            return
        d = chunks[0].doc if not isinstance(chunks, DocumentPlan) else chunks.blocks[0].doc
        self.windows.setdefault(d, []).extend(plan_windows_of(chunks))
        self.counts[d] += len(chunks)
        with self._lock:
            self.remaining[d] += len(chunks)

    def add(
        self,
        batch: Sequence[Chunk],
        out: dict[str, np.ndarray],
        rows: Iterable[int] | None = None,
        copy: bool = False,
        placed: dict[str, Placed] | None = None,
    ) -> None:
        """Merge a batch's rows (all of them, or `rows`) from its outputs. copy: the outputs are views that are
        reused after this call (TensorRT's pinned slots), so the parts kept for merging per input are copied.
        Token outputs under 'center' go in runs of consecutive windows of one input, one copy each
        (StreamingMerge.take); pooled and logits rows a run at a time; blends, single-window inputs and dense tiles
        row by row. `placed`: per output, the rows the GPU's copy engine already wrote into their merged outputs
        (copymerge.py, from the same runs): counted as added, not copied."""
        runs = row_runs(batch, None if rows is None else list(rows))
        for name, kind in self.kinds.items():
            value = out[name]
            left = runs
            if placed and name in placed:
                for d, first, count in placed[name].runs:  # the stream the copies wrote into: never a fresh one
                    self.streams[(d, name)].mark(first, count)
                done_rows = placed[name].rows
                left = [r for r in runs if r.row not in done_rows]
            if kind.kind == "token" and self.options.merge == "center" and not kind.stride:
                left = self._take_runs(left, name, value)
            if kind.kind in ("pooled", "logits"):  # a row per window: a run's rows kept as one array, merged when done
                kept = self.rows
                for r in left:
                    part = value[r.row : r.row + r.count]
                    kept.setdefault((r.doc, name), []).append((r.first, part.copy() if copy else part))
                continue
            self._add_row_by_row(batch, left, name, kind, value, copy)
        if self.on_done is not None:
            self._count_merged(runs)

    def _add_row_by_row(
        self, batch: Sequence[Chunk], runs: list[RowRun], name: str, kind: OutputKind, value: np.ndarray, copy: bool
    ) -> None:
        """The rows `add` merges one at a time: dense tiles, and token rows of blends and of single-window inputs."""
        for r in runs:
            for j in range(r.row, r.row + r.count):
                c = batch[j]
                if kind.kind != "token":
                    self.parts.setdefault((c.doc, name), []).append((c, value[j].copy() if copy else value[j]))
                    continue
                part = chunk_part(kind, c, value[j : j + 1])
                if self.counts[c.doc] > 1:
                    stream = self._stream(c.doc, name)
                    if kind.stride:  # a padded window's frames past the input's end are dropped
                        part = part[: stream.windows[c.index].length]
                    stream.add(c.index, part)
                else:
                    self.parts.setdefault((c.doc, name), []).append((c, part.copy() if copy else part))

    def _count_merged(self, runs: list[RowRun]) -> None:
        """Counts a batch's merged rows per input, then finishes each input whose last chunk this batch merged."""
        done = []
        with self._lock:  # after this thread's writes: the thread that merges an input's last chunk finishes it
            for r in runs:
                self.remaining[r.doc] -= r.count
                if self.remaining[r.doc] == 0:
                    done.append(r.doc)
        for d in done:
            self._finish(d)

    def _finish(self, d: int) -> None:
        """Input d's merged outputs to on_done; their pooled memory is given back when it calls release()."""
        outputs = self._merged(d)
        streams = [self.streams.pop((d, name)) for name in self.kinds if (d, name) in self.streams]
        for name in self.kinds:
            self.parts.pop((d, name), None)
            self.rows.pop((d, name), None)
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                for stream in streams:
                    stream.release()

        with self._lock:
            self.finished += 1
        self.on_done(d, outputs, release)  # type: ignore[misc]

    def _merged(self, d: int) -> dict[str, np.ndarray]:
        outs = {}
        for name, kind in self.kinds.items():
            if kind.kind == "box_scores":  # merged into its boxes output's detections
                continue
            if kind.kind == "boxes" and kind.boxes is not None:
                outs[name] = merge_document(self.docs[d], kind, self.parts[(d, name)], self.options, self.parts[(d, kind.boxes.scores)])
            elif (d, name) in self.streams:
                outs[name] = self.streams[(d, name)].result()
            elif (d, name) in self.rows:
                outs[name] = self._merged_rows(d, kind, self.rows[(d, name)])
            else:
                outs[name] = merge_document(self.docs[d], kind, self.parts[(d, name)], self.options)
        return outs

    def _merged_rows(self, d: int, kind: OutputKind, parts: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """A pooled or logits output from its runs' rows (what merge_document gives from one part per window)."""
        parts = sorted(parts, key=lambda part: part[0])
        values = parts[0][1] if len(parts) == 1 else np.concatenate([v for _, v in parts])
        windows = self.windows[d]
        if values.shape[0] != len(windows):
            raise ValueError(f"output '{kind.name}' of input {d} has {values.shape[0]} rows for {len(windows)} windows")
        if kind.kind == "logits":  # a probability vector per input, however many chunks
            return merge_logits(values, kept_sizes(windows), "mean_softmax")
        return values[0] if len(windows) == 1 else merge_pooled(values, kept_sizes(windows))

    def _take_runs(self, runs: list[RowRun], name: str, value: np.ndarray) -> list[RowRun]:
        """Runs of multi-window inputs merged a run at a time; returns the runs left (single-window inputs)."""
        length = value.shape[1]  # token outputs are [batch, positions, ...]: row j's positions start at j * length
        flat = value.reshape((-1,) + value.shape[2:])
        left = []
        for r in runs:
            if self.counts[r.doc] <= 1:
                left.append(r)
                continue
            longest = r.length if r.length is not None else max(w.length for w in self.windows[r.doc][r.first : r.first + r.count])
            if r.content_start + longest > length:  # take checks the batch's bounds only: a short row would read the next one
                raise ValueError(
                    f"output '{name}' has {length} positions per row, windows {r.first}..{r.first + r.count - 1} of "
                    f"input {r.doc} need {longest} from position {r.content_start}"
                )
            offsets = [(r.row + k) * length + r.content_start for k in range(r.count)]
            self._stream(r.doc, name).take(r.first, flat, offsets)
        return left

    def _stream(self, doc: int, name: str) -> StreamingMerge:
        stream = self.streams.get((doc, name))
        if stream is None:
            with self._lock:
                stream = self.streams.get((doc, name))
                if stream is None:
                    stream = StreamingMerge(*self._frames(doc, name, self.windows[doc]), self.options.merge, self.pool)
                    self.streams[(doc, name)] = stream
        return stream

    def _frames(self, doc: int, name: str, windows: list[Any]) -> tuple[list[Any], int]:
        """The windows and length an output of input `doc` merges over: its input windows, or for an output at a stride
        of the input, those windows in output frames."""
        kind = self.kinds[name]
        if kind.kind == "token" and kind.stride:
            return frame_windows(windows, FrameRate(kind.stride, kind.frame_offset), self.docs[doc].length, kind.fixed_window)
        return windows, self.docs[doc].length

    def results(self) -> list[dict[str, np.ndarray]]:
        """Every input's merged outputs (without on_done: with it, each went to on_done as it finished)."""
        return [self._merged(d) for d in range(len(self.docs))]


# -- the step ------------------------------------------------------------------------------------
