"""Cutting documents into chunks the model takes, and chunks into batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError
from trtforge.core.layout import Layout
from trtforge.runtime.audio import fixed_window_part, plan_fixed_windows, plan_strided_windows
from trtforge.runtime.chunking import (
    Tile,
    Window,
    check_tile_scale,
    plan_tiles,
    plan_windows,
    scaled_size,
)
from trtforge.runtime.documents import Batch, Chunk, Document, DocumentPlan, WindowBlock, text_feeds
from trtforge.runtime.slicing import slice_tiles
from trtforge.runtime.tokenize import TextTokenizer, wrap_spans


@dataclass
class Limits:
    """What the model (or the engine's profiles) takes: the longest sequence, the largest tile."""

    seq: int | None = None
    tile: int | None = None


def plan_document(
    d: int,
    doc: Document,
    specs: list[InputSpec],
    layout: Layout,
    chunk: int | None,
    overlap: int,
    limits: Limits,
    tokenizer: TextTokenizer | None,
    scales: list[float],
    full_last: bool = False,
    slices: bool = False,
) -> list[Chunk]:
    """Document d's chunks. full_last: a sequence's last window is as long as the others (chunking.plan_windows).
    slices: an image is cut into slices of one size, the last ones ending at its edges (runtime/slicing.py: for
    detectors, whose boxes merge by position, not by tile weights)."""
    if doc.kind == "text":
        assert tokenizer is not None
        return _plan_text(d, doc, specs, chunk, overlap, limits, tokenizer, full_last)
    if doc.kind == "seq":
        return _plan_sequence(d, doc, layout, chunk, overlap, limits, full_last)
    return _plan_image(d, doc, layout, chunk, overlap, limits, scales, slices)


def _plan_text(
    d: int,
    doc: Document,
    specs: list[InputSpec],
    chunk: int | None,
    overlap: int,
    limits: Limits,
    tokenizer: TextTokenizer,
    full_last: bool,
) -> list[Chunk]:
    """A text's windows as the tokenizer wraps them: one chunk without --chunk, else blocks of windows."""
    if doc.ids is None:  # tokenized here (load_documents(tokenize=False)), on a planning thread
        doc.ids = tokenizer.document(doc.text)
        doc.length = int(doc.ids.size)
    total = doc.length + tokenizer.specials
    if chunk is None:
        if limits.seq is not None and total > limits.seq:
            raise UserError(
                f"input '{doc.name}' has {total} tokens but the model takes at most {limits.seq}; enable chunking with --chunk."
            )
        w = tokenizer.wrap(doc.ids)
        return [Chunk(d, 0, text_feeds(w.ids, w.type_ids, specs), Window(0, doc.length, 0, doc.length), doc.length, w.content)]
    # from the ids alone: the windows the tokenizer's truncation with stride cuts (tests/test_tokenize.py), the
    # last one extended back to full length with full_last
    windows = plan_windows(doc.length, tokenizer.capacity(chunk, overlap), overlap, full_last)
    p = len(tokenizer.prefix)
    types = any(spec.name == "token_type_ids" for spec in specs)
    blocks, i = [], 0
    for block in wrap_spans(doc.ids, [(w.start, w.end) for w in windows], tokenizer.prefix, tokenizer.suffix):
        feeds = text_feeds(block, tokenizer.type_ids(block) if types else None, specs)  # an array per input per block: rows are views
        key = tuple((k, (1, *v.shape[1:])) for k, v in sorted(feeds.items()))  # shape_key of every row
        rows = block.shape[0]
        n = block.shape[1] - len(tokenizer.prefix) - len(tokenizer.suffix)
        blocks.append(WindowBlock(d, i, windows[i : i + rows], feeds, slice(p, p + n), key))
        i += rows
    return DocumentPlan(blocks)


def _plan_sequence(d: int, doc: Document, layout: Layout, chunk: int | None, overlap: int, limits: Limits, full_last: bool) -> list[Chunk]:
    """An array input's windows along its sequence axis (strided where its outputs advance at a stride of it)."""
    seq = layout.seq_axis
    if seq is None:
        if chunk is not None:
            raise no_chunk_axis(layout)
        return [Chunk(d, 0, doc.feeds, Window(0, 1, 0, 1), 1)]
    if layout.fixed_length or (layout.sample_stride and chunk):
        return strided_chunks(d, doc, layout, chunk, overlap, full_last)
    if chunk is None and limits.seq is not None and doc.length > limits.seq:
        raise UserError(
            f"input '{doc.name}' has {doc.length} positions but the model takes at most {limits.seq}; enable chunking with --chunk."
        )
    return [
        Chunk(d, i, layout.sliced(doc.feeds, {seq: (w.start, w.end)}), w, w.length)
        for i, w in enumerate(plan_windows(doc.length, chunk or doc.length, overlap if chunk else 0, full_last))
    ]


def _plan_image(
    d: int, doc: Document, layout: Layout, chunk: int | None, overlap: int, limits: Limits, scales: list[float], slices: bool
) -> list[Chunk]:
    """An image's tiles (or a detector's slices), each dense output's scale checked where there are several."""
    h, w_ = doc.hw
    if not layout.chunk_axes:
        if chunk is not None:
            raise no_chunk_axis(layout)
        return [Chunk(d, 0, doc.feeds, Tile(Window(0, h, 0, h), Window(0, w_, 0, w_)), h * w_)]
    if chunk is None and limits.tile is not None and max(h, w_) > limits.tile:
        raise UserError(
            f"image '{doc.name}' is {h}x{w_} but the model takes at most {limits.tile}x{limits.tile}; enable tiling with --chunk."
        )
    size = chunk or max(h, w_)
    tiles = slice_tiles(h, w_, size, overlap if chunk else 0) if slices else plan_tiles(h, w_, size, overlap if chunk else 0)
    if len(tiles) > 1:
        for scale in scales:
            check_tile_scale(size, overlap, scale)
            scaled_size(h, scale, f"image '{doc.name}' height")
            scaled_size(w_, scale, f"image '{doc.name}' width")
    ha, wa = layout.chunk_axes
    return [
        Chunk(
            d,
            i,
            layout.sliced(doc.feeds, {ha: (t.rows.start, t.rows.end), wa: (t.cols.start, t.cols.end)}),
            t,
            t.rows.length * t.cols.length,
        )
        for i, t in enumerate(tiles)
    ]


def strided_chunks(d: int, doc: Document, layout: Layout, chunk: int | None, overlap: int, full_last: bool) -> list[Chunk]:
    """An input's windows where outputs advance at a stride of it (runtime/audio.py): starting at multiples of the
    stride; for a model that takes a fixed length, windows of exactly that length, the last one padded with zeros."""
    seq = layout.seq_axis
    if layout.fixed_length:
        size = layout.fixed_length
        chunks = []
        for i, w in enumerate(plan_fixed_windows(doc.length, size, overlap if doc.length > size else 0)):
            feeds = layout.sliced(doc.feeds, {seq: (w.start, w.end)})
            padded = {k: fixed_window_part(v, layout.dims[k][seq], size) if seq in layout.dims.get(k, {}) else v for k, v in feeds.items()}
            chunks.append(Chunk(d, i, padded, w, w.length))
        return chunks
    windows = plan_strided_windows(doc.length, chunk, overlap, layout.sample_stride, full_last)
    return [Chunk(d, i, layout.sliced(doc.feeds, {seq: (w.start, w.end)}), w, w.length) for i, w in enumerate(windows)]


def no_chunk_axis(layout: Layout) -> UserError:
    if layout.ambiguous:
        return UserError(
            f"the model's inputs have several dynamic axes ({', '.join(layout.ambiguous)}), so which one to chunk "
            "is unclear; run without --chunk (--no-chunking)."
        )
    return UserError("the model's inputs have no dynamic sequence or image axis to chunk; run without --chunk (--no-chunking).")


def make_chunks(
    docs: list[Document],
    specs: list[InputSpec],
    layout: Layout,
    chunk: int | None,
    overlap: int,
    limits: Limits,
    tokenizer: TextTokenizer | None,
    scales: list[float],
    full_last: bool = False,
    slices: bool = False,
) -> list[Chunk]:
    chunks: list[Chunk] = []
    for d, doc in enumerate(docs):
        chunks += plan_document(d, doc, specs, layout, chunk, overlap, limits, tokenizer, scales, full_last, slices)
    return chunks


def make_batches(chunks: list[Chunk], batch_size: int, naive: bool = False) -> list[list[Chunk]]:
    """Chunks of equal shape packed together, at most batch_size each; order kept within a shape."""
    if naive:
        return [[c] for c in chunks]
    groups: dict[tuple, list[Chunk]] = {}
    for c in chunks:
        groups.setdefault(shape_key(c), []).append(c)
    batches = []
    for group in groups.values():
        batches += [group[i : i + batch_size] for i in range(0, len(group), batch_size)]
    return batches


def shape_key(chunk: Chunk) -> tuple:
    """Chunks with equal keys batch together."""
    key = getattr(chunk, "key", None)  # set by plan_document for a block's windows
    return key if key is not None else tuple((k, v.shape) for k, v in sorted(chunk.feeds.items()))


def stack(batch: Sequence[Chunk]) -> dict[str, np.ndarray]:
    return {k: np.concatenate(parts, axis=0) for k, parts in batch_parts(batch).items()}


def batch_parts(batch: Sequence[Chunk]) -> dict[str, list[np.ndarray]]:
    """A batch's feeds as the parts to stack along axis 0 (equal to stack(batch)): a run of chunks that are consecutive
    rows of one block is one slice of it, so a batch of windows of a few documents is a few parts, not one per window
    (the staging's per-part work was a per-window cost on the thread feeding the GPU). Pure."""
    if isinstance(batch, Batch):
        first = batch.runs[0][0]
        return {
            k: [item.feeds[k][r : r + n] if isinstance(item, WindowBlock) else item.feeds[k] for item, r, n in batch.runs]
            for k in first.feeds
        }
    runs: list[tuple[Chunk, int]] = []  # (first chunk, rows)
    for c in batch:
        if runs and c.block is not None:
            first, n = runs[-1]
            if first.block is c.block and first.row + n == c.row:
                runs[-1] = (first, n + 1)
                continue
        runs.append((c, 1))
    first = batch[0]
    return {
        k: [c.feeds[k] if c.block is None else c.block[k][c.row : c.row + n] for c, n in runs]
        for k in (first.block if first.block is not None else first.feeds)
    }


# -- targets -------------------------------------------------------------------------------------


def plan_limits(layout: Layout, axes: dict[str, AxisRange], engine_sidecar: dict | None) -> Limits:
    def largest(axis: str) -> int | None:
        if engine_sidecar:
            values = [p["axes"][axis][2] for p in engine_sidecar["profiles"] if axis in p["axes"]]
            if values:
                return max(values)
        return axes[axis].max if axis in axes else None

    if layout.kind == "image" and layout.chunk_axes:
        h, w = layout.chunk_axes
        if engine_sidecar:
            tiles = [min(p["axes"][h][2], p["axes"][w][2]) for p in engine_sidecar["profiles"] if h in p["axes"] and w in p["axes"]]
            return Limits(tile=max(tiles) if tiles else None)
        sizes = [v for v in (largest(h), largest(w)) if v is not None]
        return Limits(tile=min(sizes) if sizes else None)
    return Limits(seq=largest(layout.seq_axis) if layout.seq_axis else None)


def cut_into_windows(doc: Document, chunk: int) -> bool:
    """Whether --chunk cuts this input into more than one window (a text: assumed so, its special tokens count too)."""
    if doc.kind == "image":
        return max(doc.hw) > chunk
    return doc.kind == "text" or doc.length > chunk
