"""Chunk plans and merges: inputs longer than the model takes, cut into overlapping pieces and put back.

Pure numpy, no runtime. 1-D windows over a sequence; 2-D tiles over an image. Every position is
covered; where windows overlap, `center` keeps each position from the window it is most central in
(hard boundary at the middle of the overlap), and `linear` / `cosine` blend with weights that ramp
across the overlap and sum to 1 at every position.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from trtforge.core.errors import UserError

MERGES = ("center", "linear", "cosine", "gaussian")


class Window(NamedTuple):
    """A window over positions [start, end). A named tuple, not a frozen dataclass: `run` makes one per window of every
    input on its planning threads, and a frozen dataclass took ~3x as long to construct (their Python contends for the
    GIL with the thread feeding the GPU)."""

    start: int
    end: int
    keep_start: int  # the part this window contributes under 'center' merging
    keep_end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def check_overlap(chunk: int, overlap: int) -> None:
    if chunk < 1:
        raise UserError(f"chunk size must be >= 1, got {chunk}.")
    if not 0 <= overlap < chunk:
        raise UserError(f"overlap ({overlap}) must be >= 0 and smaller than the chunk size ({chunk}); lower --overlap.")


def plan_windows(length: int, chunk: int, overlap: int, full_last: bool = False) -> list[Window]:
    """Windows of `chunk` positions advancing by chunk - overlap; the last one is shorter, not padded. full_last:
    the last one ends at `length` with `chunk` positions all the same (it overlaps its neighbour by more), so a
    sequence longer than a chunk is cut into windows of one shape: they batch with every other such window
    instead of running as a batch of their own, of a shape of their own."""
    check_overlap(chunk, overlap)
    if length < 1:
        return []
    stride = chunk - overlap
    count = 1 + max(0, -(-(length - chunk) // stride))  # windows until one reaches the end
    starts = list(range(0, count * stride, stride))  # no Python per window: `run` plans every input's windows
    if full_last and len(starts) > 1:
        starts[-1] = length - chunk  # > starts[-2], since starts[-2] + chunk < length
    ends = list(range(chunk, count * stride + chunk, stride))  # every window but the last ends before `length`
    ends[-1] = min(starts[-1] + chunk, length)
    return _windows(starts, ends)


def windows_from_spans(spans: list[tuple[int, int]]) -> list[Window]:
    """Windows over given (start, end) spans (ordered, overlapping or touching), with 'center' keep
    ranges at the middle of each overlap: for windows a tokenizer planned, or tiles at an output scale."""
    if not spans:
        return []
    return _windows(list(map(operator.itemgetter(0), spans)), list(map(operator.itemgetter(1), spans)))


def _windows(starts: list[int], ends: list[int]) -> list[Window]:
    """Windows from their starts and ends (non-negative, in order), keeping from the middle of each overlap: built by C
    calls only (tuple.__new__ is namedtuple's _make without its Python frame), since `run` makes every input's windows on
    the thread feeding the GPU. Pure."""
    middles = list(map(operator.rshift, map(operator.add, starts[1:], ends[:-1]), itertools.repeat(1)))  # (s + e) // 2
    return list(map(tuple.__new__, itertools.repeat(Window), zip(starts, ends, [starts[0], *middles], [*middles, ends[-1]])))


def check_center_cover(windows: list[Window], length: int) -> None:
    """'center' keep ranges must tile [0, length): each position kept by exactly one window (pure)."""
    if windows:  # windows in order (every plan's): checked column-wise, without Python per window
        _, _, keep_starts, keep_ends = zip(*windows)
        if (
            keep_starts[0] == 0
            and keep_ends[-1] == length
            and keep_starts[1:] == keep_ends[:-1]
            and all(map(operator.le, keep_starts, keep_ends))
        ):
            return
    at = 0
    for w in sorted(windows, key=lambda w: (w.keep_start, w.keep_end)):
        if w.keep_start != at or w.keep_end < w.keep_start:
            raise ValueError(f"windows' kept ranges do not tile the {length} positions (gap or overlap at {at})")
        at = w.keep_end
    if at != length:
        raise ValueError(f"windows' kept ranges end at {at}, not at the {length} positions")


def _ramp(n: int, kind: str) -> np.ndarray:
    """Weights rising over n positions, strictly inside (0, 1]."""
    t = (np.arange(n, dtype=np.float64) + 1.0) / (n + 1.0)
    return t if kind == "linear" else 0.5 - 0.5 * np.cos(np.pi * t)


def window_weights(windows: list[Window], length: int, merge: str) -> list[np.ndarray]:
    """Per-window weights (one per position of the window), normalised so they sum to 1 everywhere."""
    if merge not in MERGES:
        raise UserError(f"unknown merge '{merge}'; use one of {', '.join(MERGES)}.")
    raw = []
    for i, w in enumerate(windows):
        weights = np.zeros(w.length)
        if merge == "center":
            weights[w.keep_start - w.start : w.keep_end - w.start] = 1.0
        elif merge == "gaussian":  # a Gaussian bump per window (sigma = length / 4), normalised below
            x = np.arange(w.length, dtype=np.float64)
            weights[:] = np.exp(-0.5 * ((x - (w.length - 1) / 2.0) / max(w.length / 4.0, 1.0)) ** 2)
        else:
            weights[:] = 1.0
            if i > 0:
                left = windows[i - 1].end - w.start
                weights[:left] = np.minimum(weights[:left], _ramp(left, merge))
            if i < len(windows) - 1:
                right = w.end - windows[i + 1].start
                weights[w.length - right :] = np.minimum(weights[w.length - right :], _ramp(right, merge)[::-1])
        raw.append(weights)
    total = np.zeros(length)
    for w, weights in zip(windows, raw):
        total[w.start : w.end] += weights
    if np.any(total <= 0):
        raise ValueError("windows leave positions uncovered")
    return [weights / total[w.start : w.end] for w, weights in zip(windows, raw)]


class StreamingMerge:
    """Merges window outputs as they arrive, in any order, so that merging overlaps inference.

    'center' copies each window's kept slice (no arithmetic: this is on the hot path of every run);
    blends accumulate weighted windows (weights precomputed, summing to 1), in float32 (float64 for
    float64 outputs). Positions run along axis 0 of every part.

    `add` may be called from several threads at once (run merges a batch's rows in parallel): kept slices
    are disjoint and copied without a lock (numpy drops the GIL for the copy); blended windows overlap, so
    their accumulation takes the lock.
    """

    def __init__(self, windows: list[Window], length: int, merge: str = "center", pool: Any = None):
        self.windows, self.length, self.merge = windows, length, merge
        self.weights = None if merge == "center" else window_weights(windows, length, merge)
        self.pool = pool  # an outpool.OutputPool: the merged array is taken from it and given back by release()
        if pool is not None and self.weights is None:
            check_center_cover(windows, length)  # pooled memory is not zeroed: every position must be written
        self.merged: np.ndarray | None = None
        self.dtype: np.dtype | None = None
        self.seen: set[int] = set()
        self._lock = threading.Lock()
        self._stretches: list[tuple[int, int, int, int, int, int]] | None = None  # run_copies' (kept_stretches), made once
        self._stretch_firsts: list[int] = []

    def _allocate(self, feature_shape: tuple[int, ...], dtype: np.dtype, page_in: bool = False) -> np.ndarray:
        """The merged array, zeroed where it must be (blends accumulate) and, with page_in, written once so that its
        pages are mapped before the windows arrive."""
        self.dtype = np.dtype(dtype)  # 'center' only copies: kept in the outputs' own type; blends sum in float32+
        merged_type = self.dtype if self.weights is None else np.result_type(self.dtype, np.float32)
        shape = (self.length,) + tuple(feature_shape)
        if self.pool is None:
            merged = np.zeros(shape, dtype=merged_type)  # maps no page until written
            mapped = dirty = False
        else:
            merged, mapped = self.pool.take(self.length, tuple(feature_shape), merged_type)
            dirty = self.weights is not None  # blends add into it: pooled memory holds an earlier input's values
        if dirty or (page_in and not mapped):
            merged[...] = 0
        return merged

    def preallocate(self, feature_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Allocate the merged array with its pages in memory before the windows arrive: run calls this on the
        planning threads, where it overlaps the GPU instead of slowing the merge's copies (first-touch page faults
        can be most of the merge's cost; np.zeros alone maps no page; a pooled buffer that served an
        earlier input is mapped already)."""
        self.merged = self._allocate(feature_shape, dtype, page_in=True)

    def release(self) -> None:
        """Give the merged array back to the pool (its contents then change): call once its consumer is done."""
        if self.pool is not None and self.merged is not None:
            self.pool.give(self.merged)
        self.merged = None

    def _merged_for(self, part: np.ndarray) -> np.ndarray:
        """The merged output, allocated for the first part's feature shape and dtype; another shape is an error."""
        if self.merged is None:
            with self._lock:
                if self.merged is None:
                    self.merged = self._allocate(part.shape[1:], part.dtype)
        if self.merged.shape[1:] != part.shape[1:]:
            raise ValueError(f"window output has shape {part.shape[1:]} per position, the merged output {self.merged.shape[1:]}")
        return self.merged

    def add(self, index: int, part: np.ndarray) -> None:
        w = self.windows[index]
        if part.shape[0] != w.length:
            raise ValueError(f"window output has {part.shape[0]} positions, the window {w.length}")
        merged = self._merged_for(part)
        if self.weights is None:
            merged[w.keep_start : w.keep_end] = part[w.keep_start - w.start : w.keep_end - w.start]
        else:
            wt = self.weights[index].astype(merged.dtype).reshape((-1,) + (1,) * (part.ndim - 1))
            with self._lock:
                merged[w.start : w.end] += part * wt
        self.seen.add(index)

    def segments(self, first: int, offsets: list[int], source_positions: int) -> list[tuple[int, int, int]]:
        """Where windows first, first + 1, ... (window first + k at position offsets[k] of a source of
        `source_positions` positions) put their kept slices, 'center' only: (source position, merged position,
        positions) per window. Their kept slices tile one contiguous range of the merged output (pure)."""
        if self.weights is not None:
            raise ValueError("only 'center' windows are placed by copies; blends accumulate with add")
        windows = self.windows[first : first + len(offsets)]
        if len(windows) != len(offsets) or first < 0:
            raise ValueError(f"windows {first}..{first + len(offsets) - 1} are not all in this merge of {len(self.windows)}")
        if any(o < 0 or o + w.length > source_positions for o, w in zip(offsets, windows)):
            raise ValueError(f"window outputs run past the {source_positions} positions given")
        return [(o + w.keep_start - w.start, w.keep_start, w.keep_end - w.keep_start) for o, w in zip(offsets, windows)]

    def run_copies(self, first: int, count: int, source_start: int, source_step: int) -> list[tuple[int, int, int, int, int, int]]:
        """Windows first .. first + count - 1, window first + k's output at source position source_start + k *
        source_step (a batch's rows, one window each), as strided copies of their kept slices into the merged output:
        (source, destination, length, count, source step, destination step), 'center' only. What strided_copies makes of
        `segments`, from the windows' stretches (kept_stretches, once per merge): no Python per window. Pure."""
        if self.weights is not None:
            raise ValueError("only 'center' windows are placed by copies; blends accumulate with add")
        if first < 0 or count < 0 or first + count > len(self.windows):
            raise ValueError(f"windows {first}..{first + count - 1} are not all in this merge of {len(self.windows)}")
        if self._stretches is None:
            self._stretches = kept_stretches(self.windows)
            self._stretch_firsts = [st[0] for st in self._stretches]
        out = []
        at = bisect.bisect_right(self._stretch_firsts, first) - 1
        end = first + count
        while first < end:
            lo, n, offset, length, destination, step = self._stretches[at]
            take = min(end, lo + n) - first
            if length > 0:
                out.append(
                    (
                        source_start + offset,
                        destination + (first - lo) * step,
                        length,
                        take,
                        source_step if take > 1 else 0,
                        step if take > 1 else 0,
                    )
                )
            source_start += take * source_step
            first += take
            at += 1
        return out

    def mark(self, first: int, count: int) -> None:
        """Windows first .. first + count - 1 were written into the merged output by someone else (the GPU's copy
        engine, from `segments`): counted as added."""
        if first < 0 or first + count > len(self.windows):
            raise ValueError(f"windows {first}..{first + count - 1} are not all in this merge of {len(self.windows)}")
        self.seen.update(range(first, first + count))

    def take(self, first: int, source: np.ndarray, offsets: list[int]) -> None:
        """Windows first, first + 1, ... (one per offset) added at once, 'center' only: window first + k starts at
        position offsets[k] of `source` (positions along axis 0, e.g. a batch's token outputs with batch and
        sequence flattened). Their kept slices tile one contiguous range of the merged output, so one np.take
        fills it: one GIL release and no Python per window, where `add` costs both per window."""
        if self.weights is not None:
            raise ValueError("take merges 'center' windows only; blends accumulate with add")
        if not offsets:
            return
        placed = self.segments(first, offsets, source.shape[0])
        starts = np.fromiter((src for src, _, _ in placed), np.int64, len(placed))
        lengths = np.fromiter((n for _, _, n in placed), np.int64, len(placed))
        merged = self._merged_for(source)
        lo, hi = placed[0][1], placed[-1][1] + placed[-1][2]
        index = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(hi - lo)
        target = merged[lo:hi]
        if source.dtype == target.dtype:
            np.take(source, index, axis=0, out=target, mode="clip")  # 'raise' would buffer a copy; bounds checked above
        else:
            target[...] = source[index]
        self.seen.update(range(first, first + len(offsets)))

    def result(self) -> np.ndarray:
        if len(self.seen) != len(self.windows):
            raise ValueError(f"{len(self.windows) - len(self.seen)} windows were never added")
        assert self.merged is not None and self.dtype is not None
        return self.merged.astype(self.dtype, copy=False)


class RowRun(NamedTuple):
    """Batch rows row .. row + count - 1: windows first .. first + count - 1 of input `doc`, each window's positions
    from `content_start` in its row, at most `length` positions each (None: not known here)."""

    doc: int
    first: int
    row: int
    count: int  # type: ignore[assignment]  # the rows it spans; tuple.count is never called on a RowRun
    content_start: int
    length: int | None


def join_run(runs: list[RowRun], run: RowRun) -> None:
    """Append `run` to `runs`, or extend the last one where `run` continues it (the next windows of one input in the
    next rows, the same content offset). Pure."""
    if runs:
        last = runs[-1]
        if (
            last.doc == run.doc
            and last.first + last.count == run.first
            and last.row + last.count == run.row
            and last.content_start == run.content_start
        ):
            length = None if last.length is None or run.length is None else max(last.length, run.length)
            runs[-1] = last._replace(count=last.count + run.count, length=length)
            return
    runs.append(run)


def row_runs(batch: Any, rows: list[int] | None = None) -> list[RowRun]:
    """A batch's rows (all, or `rows` in order) as runs of consecutive windows of one input in consecutive rows: a
    'center' merge copies each run with one np.take (run's host merge) or a few strided copies (the copy-engine merge).
    A batch that keeps its rows as runs (run.Batch: a block's rows) gives them without Python per row; others are
    chunks with .doc, .index, .content and .window. Pure."""
    if rows is None and hasattr(batch, "row_runs"):
        return batch.row_runs()
    out: list[RowRun] = []
    for j in range(len(batch)) if rows is None else rows:
        c = batch[j]
        window = getattr(c, "window", None)
        join_run(
            out,
            RowRun(
                c.doc, c.index, j, 1, c.content.start if c.content is not None else 0, window.length if isinstance(window, Window) else None
            ),
        )
    return out


def kept_stretches(windows: list[Window]) -> list[tuple[int, int, int, int, int, int]]:
    """Windows in order as stretches of like ones: (first window, windows, kept slice's offset in its window, kept
    length, first kept position, step between kept slices), each maximal run of windows that keep slices of one length
    at one offset, advancing by one step of at least that length (a plan's interior windows: one stretch). Pure."""
    out: list[list[int]] = []
    for i, (start, _, keep_start, keep_end) in enumerate(windows):
        offset, length = keep_start - start, keep_end - keep_start
        if out:
            last = out[-1]
            if last[2] == offset and last[3] == length:
                if last[1] == 1 and keep_start - last[4] >= length:
                    last[1], last[5] = 2, keep_start - last[4]
                    continue
                if last[1] > 1 and keep_start == last[4] + last[1] * last[5]:
                    last[1] += 1
                    continue
        out.append([i, 1, offset, length, keep_start, 0])
    return [tuple(st) for st in out]  # type: ignore[misc]


def pooled_mean(chunk_means: list[np.ndarray], token_counts: list[int]) -> np.ndarray:
    """A sequence embedding from per-chunk mean embeddings, weighted by each chunk's (kept) token count."""
    counts = np.asarray(token_counts, dtype=np.float64)
    if isinstance(chunk_means, np.ndarray):  # the rows stacked already (run's merge keeps a batch's rows as one array)
        return (chunk_means.astype(np.float64) * counts[:, None]).sum(axis=0) / counts.sum()
    # stack in the parts' own dtype, then one cast (the same values): np.array(chunk_means, dtype=np.float64) in one call
    # converts element by element, and a cast per part costs more than this one (figures:
    # docs/performance.md#run-loop-defaults)
    stacked = np.stack(chunk_means).astype(np.float64)
    return (stacked * counts[:, None]).sum(axis=0) / counts.sum()


def merge_pooled(chunk_vectors: list[np.ndarray], token_counts: list[int]) -> np.ndarray:
    """A pooled (sequence-level) vector from chunks: the token-weighted mean, never softmaxed."""
    return pooled_mean(chunk_vectors, token_counts).astype(np.asarray(chunk_vectors[0]).dtype)


def merge_logits(chunk_logits: list[np.ndarray], token_counts: list[int], mode: str = "mean_softmax") -> np.ndarray:
    """Sequence-level logits from chunks: token-weighted mean of the softmax, or a max (majority) vote."""
    logits = (chunk_logits if isinstance(chunk_logits, np.ndarray) else np.stack(chunk_logits)).astype(np.float64)  # one cast (pooled_mean)
    if mode == "vote":
        votes = np.bincount(logits.argmax(axis=-1), weights=np.asarray(token_counts, float), minlength=logits.shape[-1])
        return votes / votes.sum()
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = exp / exp.sum(axis=-1, keepdims=True)
    counts = np.asarray(token_counts, dtype=np.float64)
    return (probs * counts[:, None]).sum(axis=0) / counts.sum()


# -- 2-D tiles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tile:
    rows: Window
    cols: Window


def plan_tiles(height: int, width: int, tile: int, overlap: int) -> list[Tile]:
    return [Tile(r, c) for r in plan_windows(height, tile, overlap) for c in plan_windows(width, tile, overlap)]


def merge_tiles(
    outputs: list[np.ndarray], height: int, width: int, tile: int, overlap: int, merge: str = "linear", scale: float = 1.0
) -> np.ndarray:
    """Tile outputs [..., h*scale, w*scale] back into [..., height*scale, width*scale].

    A dense output at `scale` (0.25 for a 1/4 segmentation map, 2 for super-resolution) covers each
    input tile with a tile `scale` times its size: tile coordinates are scaled, then merged as usual.
    """
    tiles = scaled_tiles(plan_tiles(height, width, tile, overlap), scale)
    out_h, out_w = scaled_size(height, scale, "image height"), scaled_size(width, scale, "image width")
    rows = windows_from_spans(sorted({(t.rows.start, t.rows.end) for t in tiles}))
    cols = windows_from_spans(sorted({(t.cols.start, t.cols.end) for t in tiles}))
    row_w = dict(zip([(w.start, w.end) for w in rows], window_weights(rows, out_h, merge)))
    col_w = dict(zip([(w.start, w.end) for w in cols], window_weights(cols, out_w, merge)))
    merged = np.zeros(outputs[0].shape[:-2] + (out_h, out_w), dtype=np.float64)
    for out, t in zip(outputs, tiles):
        if out.shape[-2:] != (t.rows.length, t.cols.length):
            raise ValueError(f"tile output is {out.shape[-2:]}, expected {(t.rows.length, t.cols.length)} at scale {scale}")
        wt = np.outer(row_w[(t.rows.start, t.rows.end)], col_w[(t.cols.start, t.cols.end)])
        merged[..., t.rows.start : t.rows.end, t.cols.start : t.cols.end] += out.astype(np.float64) * wt
    return merged.astype(outputs[0].dtype)


def scaled_size(size: int, scale: float, what: str = "size") -> int:
    """size * scale when that is a whole number of output pixels, else UserError."""
    value = size * scale
    if abs(value - round(value)) > 1e-6:
        step = 1 / scale if scale < 1 else 1
        raise UserError(
            f"{what} {size} at output scale {scale:g} is {value:g} output pixels, not a whole number; "
            f"use chunk and overlap sizes (and images) that are multiples of {step:g}."
        )
    return int(round(value))


def scaled_tiles(tiles: list[Tile], scale: float) -> list[Tile]:
    """Input tiles mapped to an output at `scale`; every edge must land on a whole output pixel."""
    if scale == 1:
        return tiles

    def span(w: Window) -> tuple[int, int]:
        return scaled_size(w.start, scale, "a tile edge"), scaled_size(w.end, scale, "a tile edge")

    rows = {(t.rows.start, t.rows.end): span(t.rows) for t in tiles}
    cols = {(t.cols.start, t.cols.end): span(t.cols) for t in tiles}
    row_w = dict(zip(sorted(rows.values()), windows_from_spans(sorted(rows.values()))))
    col_w = dict(zip(sorted(cols.values()), windows_from_spans(sorted(cols.values()))))
    return [Tile(row_w[rows[(t.rows.start, t.rows.end)]], col_w[cols[(t.cols.start, t.cols.end)]]) for t in tiles]


def check_tile_scale(chunk: int, overlap: int, scale: float) -> None:
    """Tiles, overlaps and strides must map to whole output pixels at this scale."""
    for value, what in ((chunk, "--chunk"), (overlap, "--overlap"), (chunk - overlap, "the tile stride (chunk - overlap)")):
        scaled_size(value, scale, what)
