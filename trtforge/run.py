"""`trtforge run`: chunked inference on an engine (or ONNX), checked against ONNX Runtime, timed.

Every output has a kind (outputs.py: declared in the export sidecar, or inferred where the shapes
leave no doubt), and the kind decides everything after inference:
- slicing follows each INPUT's axes: the chunk axis ('seq', or the image's height/width) is cut at
  whatever dim it sits in that input; inputs without it go whole to every chunk. Text is windowed by
  the model's own tokenizer (tokenize.py), with its own special tokens;
- merging follows each OUTPUT's kind: token -> windows along its sequence dim; pooled -> token-weighted
  mean (never softmaxed); logits -> token-weighted mean softmax; dense -> tiles at the output's scale;
- metrics follow the kind too (verify/compare.py). Two errors are measured, each only where it exists:
  precision (the target vs ONNX Runtime fp32 on the reference ONNX, on the very same chunks; not
  measured when the target is its own reference) and chunking (chunked-and-merged vs one whole pass,
  both ONNX Runtime fp32, on the longest prefix the model takes whole; measured only where that prefix
  is itself chunked). Gates: report.evaluate_gates.
"""

from __future__ import annotations

import bisect
import gc
import math
import os
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from trtforge import __version__
from trtforge.artifacts import (
    linked_path,
    onnx_graph_hash,
    read_sidecar,
    refuse_overwrite,
    sidecar_chain,
    write_json_atomic,
)
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.backends.stored import RecordingReference, StoredReference
from trtforge.chunking import (
    RowRun,
    StreamingMerge,
    Tile,
    Window,
    check_overlap,
    check_tile_scale,
    join_run,
    merge_logits,
    merge_pooled,
    merge_tiles,
    plan_tiles,
    plan_windows,
    row_runs,
    scaled_size,
)
from trtforge.config import AxisRange, InputSpec
from trtforge.copymerge import CopyEngineMerge, Placed, reserve_bytes
from trtforge.errors import UserError, exception_summary
from trtforge.feeds import random_feeds
from trtforge.graph import io_specs
from trtforge.layout import Layout, model_layout
from trtforge.onnxio import load_onnx
from trtforge.outpool import OutputPool, ReservedMemory
from trtforge.outputs import OutputKind, declared_frame_rates, merge_refusal, probe_sizes
from trtforge.outwriter import OutputWriter
from trtforge.probe import output_kinds
from trtforge.report import SCHEMA, latency_stats, target_precision
from trtforge.runloop import (
    Batcher,
    StageClock,
    batch_timeline,
    check_gpu_wait,
    stream_batches,
    wall_over_gpu,
)
from trtforge.runtime.audio import (
    FrameRate,
    audio_layout,
    check_aligned,
    fixed_window_part,
    frame_windows,
    merge_frames,
    plan_fixed_windows,
    plan_strided_windows,
    reading_specs,
)
from trtforge.tokenize import TextTokenizer, find_tokenizer_dir, wrap_spans
from trtforge.verify.compare import Comparator, worst
from trtforge.verify.gates import evaluate_gates, gate_notes, gates_from
from trtforge.verify.tolerances import (
    Tolerance,
    check_statistic,
    parse_tolerances,
    tolerances_for,
)


@dataclass
class Document:
    name: str
    kind: str  # text | seq | image
    feeds: dict[str, np.ndarray] = field(default_factory=dict)  # seq/image: the whole arrays, batch 1
    length: int = 0  # tokens / positions / pixels (h*w)
    ids: np.ndarray | None = None  # text: the document's token ids, no special tokens
    text: str | None = None  # text read from a file (None: pre-tokenized, or a prefix)

    @property
    def hw(self) -> tuple[int, int]:
        array = next(iter(v for v in self.feeds.values() if v.ndim == 4))
        return int(array.shape[2]), int(array.shape[3])


def length_unit(kinds: set[str]) -> str:
    """What a document's length counts, for the throughput's label: `tokens_per_s` holds pixels/s for images."""
    if kinds == {"text"}:
        return "tokens"
    return "pixels" if kinds == {"image"} else "positions"


@dataclass
class Chunk:
    doc: int
    index: int
    feeds: dict[str, np.ndarray]
    window: Any  # Window (1-D) or Tile (2-D)
    tokens: int
    content: slice | None = None  # text: where the document's tokens sit in the chunk (None: all of it)
    # text: the block of equal-length windows `feeds` are row views of, and this chunk's row in it, so a batch of
    # consecutive windows is staged from a few block slices (batch_parts) instead of one part per window
    block: dict[str, np.ndarray] | None = None
    row: int = 0
    key: tuple | None = None  # shape_key, set once where many chunks share it (a block's)


class BlockChunk(Chunk):
    """A text window that is row `row` of `block` (its document's equal-length windows, tokenize.wrap_spans): its
    feeds, that row's views, are made when read. `run` makes one per window on its planning threads, and building each
    window's dict of views there was ~a third of planning's Python (batches are staged from block slices: batch_parts)."""

    def __init__(
        self,
        doc: int,
        index: int,
        feeds: Any = None,
        window: Any = None,
        tokens: int = 0,
        content: slice | None = None,
        block: dict[str, np.ndarray] | None = None,
        row: int = 0,
        key: tuple | None = None,
    ):
        """Chunk's signature (dataclasses.replace passes every field); `feeds` is ignored: always the block row's views."""
        if block is None:
            raise ValueError("a BlockChunk is a row of a block: give block")
        self.doc, self.index, self.window, self.tokens, self.content = doc, index, window, tokens, content
        self.block, self.row, self.key = block, row, key

    def __eq__(self, other: object) -> bool:  # the same row of the same block (made afresh each time it is read)
        return isinstance(other, BlockChunk) and other.block is self.block and other.row == self.row

    def __hash__(self) -> int:
        return hash((id(self.block), self.row))

    @property  # type: ignore[override]
    def feeds(self) -> dict[str, np.ndarray]:  # noqa: D102
        return {k: v[self.row : self.row + 1] for k, v in self.block.items()}


@dataclass(eq=False)
class WindowBlock:
    """Consecutive text windows of one input, all of one length, planned at once: window first + r is row r of every
    array in `feeds` (tokenize.wrap_spans). `run`'s loop batches, stages, places and merges a block's rows a run at a
    time (Batch, batch_parts, chunking.row_runs), never one window at a time: Python per window on the threads that
    share the GIL with the one feeding the GPU held MiniLM's loop at 2.1-2.9x its GPU time on the H200 box (~3 ms of
    it per batch of 64 against 1.5 ms of GPU; benchmarks/RESULTS.md, 2026-12-04 w27)."""

    doc: int
    first: int
    windows: list[Window]
    feeds: dict[str, np.ndarray]
    content: slice  # where the document's tokens sit in every row
    key: tuple  # shape_key of every row

    def __len__(self) -> int:
        return len(self.windows)

    def chunk(self, r: int) -> BlockChunk:
        w = self.windows[r]
        return BlockChunk(self.doc, self.first + r, None, w, w.end - w.start, self.content, self.feeds, r, self.key)


def _sequence_index(i: Any, count: int, what: str) -> Any:
    """A sequence's index as list indexing reads it: a slice as the range it selects, a negative index from the end."""
    if isinstance(i, slice):
        return range(*i.indices(count))
    if i < 0:
        i += count
    if not 0 <= i < count:
        raise IndexError(f"{what} {i} of {count}")
    return i


class DocumentPlan(Sequence):
    """A text input's chunks, kept as its blocks: a sequence of BlockChunks made when read (the checks, the precision
    comparison, Ray), while `run`'s loop reads `blocks` (runloop.Batcher through `block_runs`, _Merger through `windows`)."""

    def __init__(self, blocks: list[WindowBlock]):
        self.blocks = blocks
        self._firsts = [b.first for b in blocks]
        self._count = sum(len(b) for b in blocks)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: Any) -> Any:
        i = _sequence_index(i, self._count, "chunk")
        if isinstance(i, range):
            return [self[j] for j in i]
        block = self.blocks[bisect.bisect_right(self._firsts, i) - 1]
        return block.chunk(i - block.first)

    @property
    def windows(self) -> list[Window]:
        return [w for b in self.blocks for w in b.windows]

    def block_runs(self) -> list[tuple[tuple, WindowBlock, int]]:
        """(shape key, block, rows) per block, for runloop.Batcher.add_many."""
        return [(b.key, b, len(b)) for b in self.blocks]


class Batch(Sequence):
    """A batch's rows as runs (runloop.Batcher's groups): (block, first row, rows) for consecutive rows of a
    WindowBlock, (chunk, 0, 1) for any other chunk. A sequence of chunks for the slow paths (made when read); the loop
    reads `runs` and `row_runs()`."""

    def __init__(self) -> None:
        self.runs: list[tuple[Any, int, int]] = []
        self._starts: list[int] = []  # each run's first batch row
        self._rows = 0
        self._row_runs: list[RowRun] | None = None

    def append(self, chunk: Chunk) -> None:
        self.runs.append((chunk, 0, 1))
        self._starts.append(self._rows)
        self._rows += 1
        self._row_runs = None

    def extend(self, chunks: Iterable[Chunk]) -> None:
        for c in chunks:
            self.append(c)

    def add_rows(self, block: WindowBlock, row: int, count: int) -> None:
        """Rows row .. row + count - 1 of `block` after the batch's rows."""
        self._row_runs = None
        if self.runs:
            last, first, n = self.runs[-1]
            if last is block and first + n == row:
                self.runs[-1] = (block, first, n + count)
                self._rows += count
                return
        self.runs.append((block, row, count))
        self._starts.append(self._rows)
        self._rows += count

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, j: Any) -> Any:
        j = _sequence_index(j, self._rows, "row")
        if isinstance(j, range):
            return [self[k] for k in j]
        k = bisect.bisect_right(self._starts, j) - 1
        item, first, _ = self.runs[k]
        return item.chunk(first + j - self._starts[k]) if isinstance(item, WindowBlock) else item

    def __eq__(self, other: object) -> bool:  # as a list of its chunks (runloop's tests compare with make_batches)
        return isinstance(other, Sequence) and len(other) == self._rows and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def row_runs(self) -> list[RowRun]:
        """chunking.row_runs of every row, from the runs (no Python per row), made once."""
        if self._row_runs is None:
            out: list[RowRun] = []
            for (item, first, n), row in zip(self.runs, self._starts):
                if isinstance(item, WindowBlock):
                    join_run(out, RowRun(item.doc, item.first + first, row, n, item.content.start, item.windows[first].length))
                else:
                    window = item.window
                    join_run(
                        out,
                        RowRun(
                            item.doc,
                            item.index,
                            row,
                            1,
                            item.content.start if item.content is not None else 0,
                            window.length if isinstance(window, Window) else None,
                        ),
                    )
            self._row_runs = out
        return self._row_runs


@dataclass
class RunOptions:
    inputs: Path
    chunk: int | None = 256
    overlap: int = 32
    batch_size: int = 8
    merge: str = "center"
    warmup: int = 2
    reference: Path | None = None
    backend: str = "auto"
    # Gates: None = not set (max_rel_l2 and min_cosine then take their defaults; see report.py).
    max_rel_l2: float | None = None
    min_cosine: float | None = None
    min_chunk_cosine: float | None = None
    min_top1_agreement: float | None = None
    min_pixel_agreement: float | None = None
    providers: list[str] = field(default_factory=list)
    report: Path | None = None
    naive: bool = False  # one chunk per execute (for benchmarks)
    save_outputs: Path | None = None  # merged outputs per input and output, as .npz keys INPUT/OUTPUT
    tokenizer: Path | None = None  # a local HF tokenizer dir; else the one the export sidecar names
    output_kinds: dict[str, tuple[str, float | None]] = field(default_factory=dict)  # --output-kind overrides
    # The TensorRT loop (tensorrt_runtime.TrtRunner); off switches exist to measure what each buys.
    cuda_graphs: bool = True
    shared_device_memory: bool = True
    pad_batches: bool = True  # a partial batch runs padded to a batch size that ran (runloop.padded_batch)
    gpu_wait: str = "spin"  # how the collector waits for a batch: spin (CUDA's default here) or block (TrtRunner)
    slots: int = 3  # staging slots: batches in flight
    plan_workers: int | None = None  # threads tokenizing and planning documents while batches run (None: run.default_plan_workers;
    # 0: each input planned on the thread feeding the GPU)
    plan_ahead: int = 8  # batches planning may run ahead of the GPU loop (0: unbounded; runloop.stream_batches)
    merge_workers: int | None = None  # threads merging outputs back per input while batches run (None: min(2, CPUs))
    # on an engine without the precision check: each batch merged on one merge thread while the collector goes on to
    # the next batch (its slot is reused once the merge is done); False: a batch's rows split over the merge threads
    # and the collector waits for them
    overlap_merges: bool = True
    # with overlapped merges: the GPU's copy engine writes token outputs' kept windows straight into their inputs'
    # merged outputs (page-locked pooled memory, reserved before the clock), so the host copies none of those bytes
    # (copymerge.py). On by default: on the H200 at batch 64 it ran MiniLM at 1.06-1.12x the GPU's time where the host
    # merge ran 1.12-1.38x, BERT-base at 1.01-1.02x against 1.03-1.08x, with bit-equal outputs (RESULTS.md, 2026-12-02 w21)
    copy_engine_merge: bool = True
    # with the copy-engine merge: MB of page-locked memory reserved before the clock for the merged outputs (None: sized
    # by copymerge.reserve_bytes; 0: none, every pooled buffer page-locked when first needed, inside the loop)
    pinned_reserve_mb: float | None = None
    # worker processes tokenizing and planning text inputs (planning_processes.py; 0: the planning threads do it); they
    # are spawned, so a script calling run() with it must guard its top level with `if __name__ == "__main__":`
    plan_processes: int = 0
    # Python's GIL switch interval while the loop runs: a thread back from a GIL-free numpy copy or CUDA wait waits up to
    # this long for the GIL while another thread runs Python (benchmarks/gil_handoff.py); Python's default is 5000.
    # 20-500 ran alike on MiniLM on the H200 box (benchmarks/RESULTS.md, 2026-12-02 w15)
    switch_interval_us: int = 500
    # Python's cyclic garbage collector off while the loop runs, after one collection before the clock (_collect_garbage)
    gc_pause: bool = True
    last_window: str = "full"  # a sequence's last window: "full" (ends at the input's end, as long as the others) or "short"
    # False: no ONNX Runtime pass over every chunk after the loop, and no outputs kept for it (speed runs: it took
    # 148 s of CPU after a 0.8 s BERT-base run over 356k tokens on the H200 box); precision is reported not measured.
    precision_check: bool = True
    # False: no chunked-vs-whole ONNX Runtime fp32 pass per input after the loop (it took ~80 s of CPU after a ~1 s
    # BERT-base run over 192 inputs on the H200 box); the chunking error is reported not measured.
    chunking_check: bool = True
    plugin_libraries: list[str] = field(default_factory=list)  # override the engine sidecar's plugin libraries' paths
    # Per-output tolerances (verify/tolerances.py): 'NAME:VALUE' or 'VALUE', on the error statistic error_stat.
    atol: list[str] = field(default_factory=list)
    rtol: list[str] = field(default_factory=list)
    error_stat: str = "elemwise"
    save_reference: Path | None = None  # the precision check's reference outputs, kept for --load-reference
    load_reference: Path | None = None  # judge the target against stored reference outputs instead of running the reference

    def __post_init__(self) -> None:
        check_statistic(self.error_stat)
        if self.save_reference and self.load_reference:
            raise UserError(
                "--save-reference and --load-reference do not combine: a stored reference is saved from a run "
                "that computes it; pass one of them."
            )
        if (self.save_reference or self.load_reference) and not self.precision_check:
            raise UserError("--save-reference/--load-reference belong to the precision check; drop --no-precision-check.")
        if self.last_window not in ("full", "short"):
            raise UserError(f"unknown --last-window '{self.last_window}'; use full or short.")
        check_gpu_wait(self.gpu_wait)
        if self.plan_ahead < 0:
            raise UserError(f"--plan-ahead {self.plan_ahead} is negative; use 0 (no bound) or a number of batches.")
        if self.pinned_reserve_mb is not None and self.pinned_reserve_mb < 0:
            raise UserError(f"--pinned-reserve-mb {self.pinned_reserve_mb:g} is negative; use 0 (reserve nothing) or a size in MB.")
        if self.plan_workers is not None and self.plan_workers < 0:
            raise UserError(f"--plan-workers {self.plan_workers} is negative; use 0 (plan on the thread feeding the target) or more.")
        if self.merge_workers is not None and self.merge_workers < 0:
            raise UserError(f"--merge-workers {self.merge_workers} is negative; use 0 (merge on the collecting thread) or more.")
        if self.switch_interval_us < 1:
            raise UserError(f"--switch-interval-us {self.switch_interval_us} must be at least 1 (microseconds).")

    @property
    def full_last(self) -> bool:
        return self.last_window == "full"

    def gate_values(self) -> dict[str, float | None]:
        return {
            "max_rel_l2": self.max_rel_l2,
            "min_cosine": self.min_cosine,
            "min_chunk_cosine": self.min_chunk_cosine,
            "min_top1_agreement": self.min_top1_agreement,
            "min_pixel_agreement": self.min_pixel_agreement,
        }


# -- inputs --------------------------------------------------------------------------------------


def load_documents(
    path: Path, specs: list[InputSpec], layout: Layout, tokenizer: TextTokenizer | None, tokenize: bool = True
) -> list[Document]:
    """Inputs read from `path`. With tokenize=False, texts stay untokenized (ids None, length 0) and
    plan_document tokenizes them, so that run() overlaps tokenization with execution."""
    from trtforge.calibrate import data as data_mod

    path = Path(path)
    if path.is_file() and path.suffix == ".jsonl" and '"input_ids"' in data_mod.read_utf8(path).split("\n", 1)[0]:
        return _pretokenized(path, tokenizer)
    if path.is_file() and path.suffix in (".jsonl", ".txt"):
        files, kind = [path], "text"
    elif path.is_file() and path.suffix.lower() == ".wav":
        files, kind = [path], "audio"
    else:
        dataset = data_mod.scan(path)
        files, kind = dataset.files, dataset.kind
    if kind == "text":
        if tokenizer is None:
            raise UserError(
                f"{path} holds text, but no tokenizer was found for this model; pass --tokenizer DIR "
                "(a Hugging Face tokenizer directory with tokenizer.json) or give .npy/.npz inputs."
            )
        fake = data_mod.Dataset(path if path.is_dir() else path.parent, files, "text", "")
        names = [f.stem for f in files] if all(f.suffix == ".txt" for f in files) else None
        docs = []
        for i, text in enumerate(data_mod.read_texts(fake)):
            ids = tokenizer.document(text) if tokenize else None
            docs.append(Document(names[i] if names else f"text_{i}", "text", {}, int(ids.size) if tokenize else 0, ids, text))
        return docs
    if kind == "images":
        samples = data_mod.read_images(data_mod.Dataset(path, files, kind, ""), specs)
    elif kind == "audio":
        samples = data_mod.read_audio(data_mod.Dataset(path, files, kind, ""), specs)
    else:
        samples = data_mod.read_arrays(data_mod.Dataset(path, files, kind, ""), specs)
    docs = []
    for i, sample in enumerate(samples):
        where = files[i] if i < len(files) else i
        for name, array in sample.items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise UserError(f"input {where}: tensor '{name}' holds NaN or Inf; clean the input.")
        name = files[i].stem if i < len(files) else f"input_{i}"
        if layout.kind == "image":
            image = sample[layout.image_input]
            docs.append(Document(name, "image", sample, int(image.shape[2] * image.shape[3])))
        else:
            seq = layout.seq_axis
            docs.append(Document(name, "seq", sample, layout.length(sample, seq) if seq else 1))
    return docs


def _pretokenized(path: Path, tokenizer: TextTokenizer | None) -> list[Document]:
    """{"name": ..., "input_ids": [...]} per line: document ids WITHOUT special tokens. The model's
    own specials are added from its tokenizer, so one is required (no ids are ever assumed)."""
    import json

    if tokenizer is None:
        raise UserError(
            f"{path} holds pre-tokenized ids, but no tokenizer was found to add this model's special tokens; "
            "pass --tokenizer DIR (a Hugging Face tokenizer directory with tokenizer.json)."
        )
    from trtforge.calibrate.data import read_utf8

    docs = []
    for lineno, line in enumerate(read_utf8(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            ids = np.asarray(item["input_ids"], dtype=np.int64)
        except (ValueError, KeyError, TypeError):
            raise UserError(f'{path}:{lineno} is not {{"input_ids": [ints]}}; fix the line.') from None
        docs.append(Document(item.get("name", f"text_{len(docs)}"), "text", {}, int(ids.size), ids))
    return docs


def text_feeds(ids: np.ndarray, type_ids: np.ndarray | None, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """Windows as model inputs: ids (with specials) and token types of one window (1-D: batch 1) or of a block of
    equal-length windows (2-D, a row each), with an all-ones mask. `type_ids` may be None where no input takes them.
    The ids are used as they are where their type is the input's (no copy), and the masks are read-only views of one
    shared block of ones: `run` plans every input on the thread feeding the GPU, so each copy and fill there is its time."""
    ids = np.atleast_2d(ids)
    feeds = {}
    for spec in specs:
        if spec.name == "input_ids":
            feeds[spec.name] = ids.astype(spec.dtype, copy=False)
        elif spec.name == "attention_mask":
            feeds[spec.name] = _ones(ids.shape, spec.dtype)
        elif spec.name == "token_type_ids":
            if type_ids is None:
                raise ValueError("text_feeds: the model takes token_type_ids; give type_ids")
            feeds[spec.name] = np.atleast_2d(type_ids).astype(spec.dtype, copy=False)
        else:
            raise UserError(f"text inputs cannot fill model input '{spec.name}'; give .npz inputs instead.")
    return feeds


_ONES: dict[tuple[int, str], np.ndarray] = {}  # (width, dtype) -> a read-only block of ones, grown to the most rows asked
_ONES_KEPT = 1 << 22  # elements of ones kept per (width, dtype) (32 MB of int64): a larger block is made, not kept


def _ones(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A read-only [rows, width] array of ones: a view of a shared block (threads may race to grow it: each makes a
    valid block, the last one stays); one beyond _ONES_KEPT elements is made for the call and not kept."""
    rows, width = shape
    key = (width, np.dtype(dtype).str)
    block = _ONES.get(key)
    if block is None or block.shape[0] < rows:
        block = np.ones((max(rows, 64), width), dtype)
        block.flags.writeable = False
        if block.size <= _ONES_KEPT:
            _ONES[key] = block
    return block[:rows]


# -- chunk plans ---------------------------------------------------------------------------------


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
) -> list[Chunk]:
    """Document d's chunks. full_last: a sequence's last window is as long as the others (chunking.plan_windows)."""
    if doc.kind == "text":
        assert tokenizer is not None
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
    if doc.kind == "seq":
        seq = layout.seq_axis
        if seq is None:
            if chunk is not None:
                raise _no_chunk_axis(layout)
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
    h, w_ = doc.hw
    if not layout.chunk_axes:
        if chunk is not None:
            raise _no_chunk_axis(layout)
        return [Chunk(d, 0, doc.feeds, Tile(Window(0, h, 0, h), Window(0, w_, 0, w_)), h * w_)]
    if chunk is None and limits.tile is not None and max(h, w_) > limits.tile:
        raise UserError(
            f"image '{doc.name}' is {h}x{w_} but the model takes at most {limits.tile}x{limits.tile}; enable tiling with --chunk."
        )
    size = chunk or max(h, w_)
    tiles = plan_tiles(h, w_, size, overlap if chunk else 0)
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
        windows = plan_fixed_windows(doc.length, size, overlap if doc.length > size else 0)
        chunks = []
        for i, w in enumerate(windows):
            feeds = layout.sliced(doc.feeds, {seq: (w.start, w.end)})
            padded = {k: fixed_window_part(v, layout.dims[k][seq], size) if seq in layout.dims.get(k, {}) else v for k, v in feeds.items()}
            chunks.append(Chunk(d, i, padded, w, w.length))
        return chunks
    windows = plan_strided_windows(doc.length, chunk, overlap, layout.sample_stride, full_last)
    return [Chunk(d, i, layout.sliced(doc.feeds, {seq: (w.start, w.end)}), w, w.length) for i, w in enumerate(windows)]


def _no_chunk_axis(layout: Layout) -> UserError:
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
) -> list[Chunk]:
    chunks: list[Chunk] = []
    for d, doc in enumerate(docs):
        chunks += plan_document(d, doc, specs, layout, chunk, overlap, limits, tokenizer, scales, full_last)
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


class OrtTarget:
    backend = "onnxruntime"
    accepts_parts = False  # feeds must be stacked arrays
    warm_batches = 1  # batches per warm-up round

    def __init__(self, path: Path, providers: list[str], threads: int | None = None):
        self.runner = OrtRunner(path, providers or None, threads)
        self.input_names, self.output_names = self.runner.input_names, self.runner.output_names
        self.label = f"onnxruntime {'/'.join(self.runner.providers)}"
        self.timings: list[tuple[str, float, float | None]] = []

    def run_many(self, batches: list[tuple[Any, dict[str, np.ndarray]]], consume=None):
        """As TrtTarget.run_many; with `consume` the outputs (ORT's own arrays) go to consume(tag, outputs), which
        finishes its work before returning (run overlaps merges only on an engine, whose outputs are a reused slot)."""
        for tag, feeds in batches:
            start = time.perf_counter()
            out = self.runner.run(feeds)
            self.timings.append(("onnxruntime", (time.perf_counter() - start) * 1e3, None))
            yield tag, (out if consume is None else consume(tag, out))

    def memory(self) -> dict[str, Any]:
        return {"device": "cpu", "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def reset_host_clock(self) -> None:
        pass  # ONNX Runtime runs in the loop's own thread: its time is the loop's

    def runtime(self) -> dict[str, Any]:
        return {}


class TrtTarget:
    backend = "tensorrt"
    accepts_parts = True  # a batch's feeds may be its chunks' arrays: stacked straight into pinned memory

    def __init__(
        self,
        engine: Path,
        backend: str,
        slots: int = 3,
        cuda_graphs: bool = True,
        shared_device_memory: bool = True,
        plugin_libraries: list[str] | None = None,
        pad_batches: bool = True,
        gpu_wait: str = "spin",
    ):
        from trtforge.backends.tensorrt import load_trt, runtime_identity
        from trtforge.backends.tensorrt_runtime import TrtRunner
        from trtforge.build import check_engine_compat, read_engine_sidecar
        from trtforge.doctor import _gpu

        self.sidecar = read_engine_sidecar(engine, verify=True)
        if plugin_libraries:  # --plugin-library: where the build's plugin libraries are on this machine
            self.sidecar = {**self.sidecar, "plugin_libraries": [{"path": str(p)} for p in plugin_libraries]}
        built = f"{self.sidecar.get('backend')} {self.sidecar.get('tensorrt_version')}"
        try:
            mod = load_trt(backend if backend != "auto" else self.sidecar.get("backend", "auto"))
        except UserError:
            raise UserError(
                f"{engine.name} was built with {built}, which is not installed here; rebuild the engine on this machine."
            ) from None
        check_engine_compat(engine, self.sidecar, runtime_identity(mod))
        if _gpu() is None:
            raise UserError(
                f"{engine.name} needs a GPU to run and this machine has none; run its ONNX ({self.sidecar.get('built_onnx')}) on ONNX Runtime instead."
            )
        self.runner = TrtRunner(
            mod,
            engine,
            self.sidecar,
            slots=slots,
            cuda_graphs=cuda_graphs,
            shared_device_memory=shared_device_memory,
            pad_batches=pad_batches,
            gpu_wait=gpu_wait,
        )
        self.warm_batches = len(self.runner.slots) + 1  # a plain enqueue, then one graph capture per slot
        self.input_names, self.output_names = self.runner.input_names, self.runner.output_names
        self.label = f"{mod.flavour} {mod.version} ({self.sidecar.get('precision')})"
        self.timings: list[tuple[str, float, float | None]] = []

    @classmethod
    def for_options(cls, engine: Path, options: RunOptions) -> "TrtTarget":
        """The engine as `run`'s options set up its loop (run, scaleout/ray_run.py)."""
        return cls(
            engine,
            options.backend,
            options.slots,
            options.cuda_graphs,
            options.shared_device_memory,
            options.plugin_libraries,
            options.pad_batches,
            options.gpu_wait,
        )

    def run_many(self, batches, consume=None, place=None):
        """consume, place: see TrtRunner.run_many (the outputs are views of pinned memory, valid inside the call)."""
        start = len(self.runner.timings)
        for tag, out in self.runner.run_many(batches, consume=consume, place=place):
            yield tag, out
        for t in self.runner.timings[start:]:
            self.timings.append((f"profile {t.profile}", t.wall_ms, t.gpu_ms))

    def memory(self) -> dict[str, Any]:
        return {
            "device": "gpu",
            "peak_gpu_mb": self.runner.peak_bytes / 2**20,
            "sampled": "after every batch that was not a CUDA-graph replay (replays allocate nothing)",
        }

    def reset_host_clock(self) -> None:
        self.runner.host = StageClock()

    def runtime(self) -> dict[str, Any]:
        return self.runner.runtime_report()


# -- merging by output kind ----------------------------------------------------------------------


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


def merge_document(doc: Document, kind: OutputKind, parts: list[tuple[Chunk, np.ndarray]], options: RunOptions) -> np.ndarray:
    """One input's output from its chunks' parts (chunk_part), by the output's kind."""
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


class _Merger:
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
            for r in left:  # row by row: dense tiles, and token rows of blends and of single-window inputs
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
        if self.on_done is None:
            return
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
            if (d, name) in self.streams:
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


def _limits(layout: Layout, axes: dict[str, AxisRange], engine_sidecar: dict | None) -> Limits:
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


def _check_io(target: Any, reference: OrtRunner, target_path: Path, reference_path: Path) -> None:
    if sorted(target.input_names) != sorted(reference.input_names) or sorted(target.output_names) != sorted(reference.output_names):
        raise UserError(
            f"{target_path.name} has inputs {sorted(target.input_names)} / outputs {sorted(target.output_names)} but "
            f"{reference_path.name} has {sorted(reference.input_names)} / {sorted(reference.output_names)}; "
            "pass the ONNX the engine was built from as --reference."
        )


@dataclass
class Prepared:
    """Everything a run needs before inference: paths, specs, output kinds, documents and chunks."""

    target_path: Path
    is_engine: bool
    engine_sidecar: dict | None
    reference_path: Path
    specs: list[InputSpec]
    layout: Layout
    limits: Limits
    kinds: dict[str, OutputKind]
    tokenizer: TextTokenizer | None
    docs: list[Document]
    chunks: list[Chunk]
    batch_cap: int
    reference: OrtRunner
    tolerances: dict[str, Tolerance] = field(default_factory=dict)

    @property
    def scales(self) -> list[float]:
        return [k.scale for k in self.kinds.values() if k.kind == "dense" and k.scale]


def prepare(target_path: Path, options: RunOptions, plan: bool = True) -> Prepared:
    """With plan=False, texts are not tokenized and `chunks` is empty: run() plans them while it runs."""
    target_path = Path(target_path)
    refuse_overwrite(
        "run",
        [target_path, options.reference, options.inputs, options.tokenizer, options.load_reference],
        files=[options.report, options.save_outputs, options.save_reference],
    )
    is_engine = target_path.suffix != ".onnx"
    engine_sidecar = None
    if is_engine:
        from trtforge.build import read_engine_sidecar

        engine_sidecar = read_engine_sidecar(target_path)
        recorded = engine_sidecar.get("reference_onnx") or engine_sidecar["source_onnx"]
    else:
        recorded = (read_sidecar(target_path, required=False) or {}).get("reference_onnx")
    # A recorded path relative to the folder its step ran in (older sidecars) is looked for from here too.
    if options.reference:
        reference_path = Path(options.reference)
    elif recorded:
        reference_path = linked_path(target_path, str(recorded))
    else:
        reference_path = target_path
    ref_model = load_onnx(reference_path)
    specs, axes, _ = io_specs(reference_path, ref_model)
    del ref_model
    chain = sidecar_chain(reference_path)
    probe_layout = model_layout(specs)  # output kinds are inferred on the model's own axes
    strides = output_strides(chain, options.output_kinds)
    layout = audio_layout(probe_layout, specs, strides)
    strided = "output " + ", ".join(f"'{n}'" for n in strides)
    if layout.fixed_length:
        check_aligned(layout.sample_stride, options.overlap, layout.sample_stride, strided)
    limits = Limits(seq=layout.fixed_length) if layout.fixed_length else _limits(layout, axes, engine_sidecar)
    if options.chunk is not None:
        check_overlap(options.chunk, options.overlap)
        if not layout.chunk_axes:
            raise _no_chunk_axis(layout)
        if layout.fixed_length and options.chunk != layout.fixed_length:
            raise UserError(
                f"--chunk {options.chunk}: {reference_path.name} takes exactly {layout.fixed_length} positions per window; "
                f"pass --chunk {layout.fixed_length} (or leave --chunk out)."
            )
        if layout.sample_stride and not layout.fixed_length:
            check_aligned(options.chunk, options.overlap, layout.sample_stride, strided)
        limit = limits.seq if layout.kind == "sequence" else limits.tile
        if limit is not None and options.chunk > limit:
            where = (
                f"engine {target_path.name}'s largest profile"
                if is_engine
                else (f"the model's axis '{layout.seq_axis}'" if layout.kind == "sequence" else "the model's image axes")
            )
            what = f"--chunk {options.chunk}" + ("" if layout.kind == "sequence" else " (tile size)")
            raise UserError(f"{what} is larger than {where} ({limit}); rebuild with larger tiers or lower --chunk.")
    reference = OrtRunner(reference_path)
    kinds = output_kinds(reference, reference_path, specs, axes, probe_layout, options.output_kinds, chain)
    if layout.fixed_length:
        kinds = {n: replace(k, fixed_window=layout.fixed_length) if k.stride else k for n, k in kinds.items()}
    for kind in kinds.values():  # windows that leave frames uncovered, refused before any runs
        if kind.stride and (options.chunk or layout.fixed_length):
            size = layout.fixed_length or options.chunk
            rate = FrameRate(kind.stride, kind.frame_offset)
            frame_windows(plan_fixed_windows(3 * size, size, options.overlap), rate, 3 * size, kind.fixed_window)
    tok_dir = options.tokenizer or find_tokenizer_dir(reference_path, chain)
    tokenizer = TextTokenizer(tok_dir) if tok_dir else None
    docs = load_documents(Path(options.inputs), reading_specs(specs, layout), layout, tokenizer, tokenize=plan)
    if not docs:
        raise UserError(f"{options.inputs} holds no inputs; add documents or arrays.")
    if is_engine:  # an engine whose fused attention dropped the mask must never see padding
        from trtforge.fusion.attention import refuse_padding

        for doc in docs:
            refuse_padding(engine_sidecar, doc.name, doc.feeds, target_path.name)
    if options.chunk is not None:
        refuse_unmergeable(kinds, docs, options.chunk, reference, reference_path, specs, axes, layout)
    scales = [k.scale for k in kinds.values() if k.kind == "dense" and k.scale]
    chunks = make_chunks(docs, specs, layout, options.chunk, options.overlap, limits, tokenizer, scales, options.full_last) if plan else []
    batch_cap = options.batch_size
    if layout.batch_axis:
        b = layout.batch_axis
        cap = max(p["axes"][b][2] for p in engine_sidecar["profiles"]) if engine_sidecar else (axes[b].max if b in axes else None)
        batch_cap = min(batch_cap, cap) if cap else batch_cap
    else:
        batch_cap = 1
    tolerances = tolerances_for(
        list(kinds), parse_tolerances(options.atol, "--atol"), parse_tolerances(options.rtol, "--rtol"), options.error_stat
    )
    return Prepared(
        target_path,
        is_engine,
        engine_sidecar,
        reference_path,
        specs,
        layout,
        limits,
        kinds,
        tokenizer,
        docs,
        chunks,
        batch_cap,
        reference,
        tolerances,
    )


def output_strides(chain: list[tuple[Path, dict]], overrides: dict[str, tuple[str, float | None]]) -> dict[str, int]:
    """The strides export measured for token outputs (the nearest sidecar wins), less outputs --output-kind redeclares
    as another kind."""
    rates: dict[str, tuple[int, int]] = {}
    for _, side in reversed(chain):
        rates.update(declared_frame_rates(side.get("outputs")))
    return {n: stride for n, (stride, _) in rates.items() if overrides.get(n, ("token", None))[0] == "token"}


def cut_into_windows(doc: Document, chunk: int) -> bool:
    """Whether --chunk cuts this input into more than one window (a text: assumed so, its special tokens count too)."""
    if doc.kind == "image":
        return max(doc.hw) > chunk
    return doc.kind == "text" or doc.length > chunk


def refuse_unmergeable(
    kinds: dict[str, OutputKind],
    docs: list[Document],
    chunk: int,
    reference: OrtRunner,
    reference_path: Path,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    layout: Layout,
) -> None:
    """Before any window runs: an output whose windows cannot be merged back (outputs.merge_refusal) is a UserError,
    where --chunk cuts some input into several windows. The outputs' shapes come from one reference run at a probe
    size of the chunk axis (batch 1)."""
    if not any(cut_into_windows(doc, chunk) for doc in docs):
        return
    sizes = probe_sizes(layout, axes)[0]
    try:
        shapes = {name: tuple(value.shape) for name, value in reference.run(random_feeds(specs, sizes, seed=0)).items()}
    except Exception as exc:
        raise UserError(
            f"ONNX Runtime fails on {reference_path.name} at {', '.join(f'{k}={v}' for k, v in sizes.items())} "
            f"({exception_summary(exc, 200)}); check the model's axis ranges."
        ) from None
    positions = layout.fixed_length or (sizes.get(layout.seq_axis) if layout.seq_axis else None)
    for name, kind in kinds.items():
        why = merge_refusal(kind, layout.kind == "image", shapes.get(name), positions, layout.seq_axis)
        if why:
            raise UserError(why)


def run(target_path: Path, options: RunOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    p = prepare(target_path, options, plan=False)
    _check_save_outputs(p.docs, options.save_outputs)
    # Overlapping pays only where a batch's outputs are a pinned slot the next batches wait for (an engine without
    # the precision check); ONNX Runtime's outputs are the batch's own, so its rows are split over the threads.
    overlap = options.overlap_merges and not options.precision_check and p.is_engine
    if options.merge_workers == 0 and not overlap:
        raise UserError(
            "--merge-workers 0 (merging on the collecting thread) needs an engine run without the precision "
            "check and with --overlap-merges; give 1 or more merge workers."
        )
    if p.is_engine:
        target: Any = TrtTarget.for_options(p.target_path, options)
    else:
        target = OrtTarget(p.target_path, options.providers)
    _check_io(target, p.reference, p.target_path, p.reference_path)
    progress(
        f"{len(p.docs)} inputs on {target.label}; outputs "
        + ", ".join(f"{k.name} ({k.kind}{f' x{k.scale:g}' if k.scale not in (None, 1.0) else ''})" for k in p.kinds.values())
    )
    warm = _warm_up(p, options, target)
    untokenized = {d for d, doc in enumerate(p.docs) if doc.kind == "text" and doc.ids is None}
    texts = {d: doc for d, doc in enumerate(p.docs) if doc.kind == "text"}
    planning = None
    if options.plan_processes and texts and p.tokenizer is not None:
        from trtforge.planning_processes import PlanningProcesses, PlanSettings

        planning = PlanningProcesses(
            p.tokenizer.directory,
            options.plan_processes,
            PlanSettings(p.specs, p.layout, options.chunk, options.overlap, p.limits, options.full_last),
        )
        planning.start()  # spawned and loaded before the clock, like the engine (closes itself if it fails)

    copy_names, copy_off = _copy_merge_outputs(p, options, warm, overlap)
    # Each input's merged outputs are handed on as soon as it is finished (written by --save-outputs, else dropped),
    # and their memory serves later inputs (outpool.py): a run holds the inputs in flight, not the corpus. With the
    # copy-engine merge that memory is page-locked (the GPU writes into it).
    reserved: ReservedMemory | None = None
    reserve_s = 0.0
    try:
        if copy_names:  # page-locked once here, before the clock: page-locking inside the loop stalled it (copymerge.py)
            from trtforge.backends.tensorrt_runtime import allocate_pinned

            reserve_start = time.perf_counter()
            reserved = ReservedMemory(_pinned_reserve(p, options, warm, copy_names), allocate_pinned)
            reserve_s = time.perf_counter() - reserve_start
            output_pool = OutputPool(allocate=reserved)
        else:
            output_pool = OutputPool()
        writer = OutputWriter(Path(options.save_outputs)) if options.save_outputs else None
    except BaseException:
        if planning is not None:
            planning.close()
        if reserved is not None:
            reserved.close()
        raise

    def on_done(d: int, outputs: dict[str, np.ndarray], release: Callable[[], None]) -> None:
        if writer is None:
            release()
        else:
            writer.put(p.docs[d].name, outputs, release)

    # Timed: tokenizing and planning (worker threads, document by document), batching as chunks arrive,
    # running (the target's pipelined loop) and merging (worker threads) all overlap under one clock.
    gc_before_s = _collect_garbage() if options.gc_pause else None  # before the clock: the loop then starts with none
    start, cpu_start, faults_start = time.perf_counter(), time.process_time(), _minor_faults()
    merger = _Merger(p.docs, [], p.kinds, options, templates=warm, pool=output_pool, on_done=on_done)
    host = StageClock()  # this loop's stages; the target reports its own (staging, GPU waits, copies)

    def plan(d: int) -> list[Chunk]:
        if planning is not None and d in texts:
            with host.stage("wait_plans"):  # a planning thread waiting for a worker process's plan
                chunks, ids, seconds, cpu_seconds = planning.plan(d)
            host.add("plan_in_workers", seconds, cpu_seconds)  # the worker's own time on it (not this process's)
            if ids is not None:  # tokenized there
                p.docs[d].ids, p.docs[d].length = ids, int(ids.size)
        else:
            with host.stage("plan"):  # tokenize + chunk one document (worker threads: summed over them)
                chunks = plan_document(
                    d, p.docs[d], p.specs, p.layout, options.chunk, options.overlap, p.limits, p.tokenizer, p.scales, options.full_last
                )
        if not chunks:  # it would never be finished (nor merged)
            raise UserError(f"input '{p.docs[d].name}' is empty (no tokens or positions); remove it or give it content.")
        if merger.templates:
            with host.stage("prepare_outputs"):  # its merged outputs allocated and paged in, off the merge's path
                merger.prepare(chunks)
        return chunks

    # 2 by default: BERT-base and MiniLM ran fastest with 2 on the H200 box (16 CPUs), ahead of 4
    # 0: on the thread that collects each batch (no merging threads); valid only where merging overlaps (below)
    merge_workers = options.merge_workers if options.merge_workers is not None else min(2, os.cpu_count() or 2)

    def merge(
        batch: list[Chunk],
        out: dict[str, np.ndarray],
        rows: Iterable[int] | None = None,
        copy: bool = False,
        placed: dict[str, Placed] | None = None,
    ) -> None:
        with host.stage("merge"):  # worker threads: summed over them
            merger.add(batch, out, rows, copy, placed)

    copy_merge = (
        CopyEngineMerge(
            copy_names, {n: warm[n][1] for n in copy_names}, lambda d, n: merger.streams.get((d, n)), lambda d: merger.counts[d]
        )
        if copy_names
        else None
    )
    placements: dict[int, dict[str, Placed]] = {}

    def place(tag: int, shapes: dict[str, tuple[int, ...]]) -> Any:
        """On the submitting thread, before the batch's copies are queued: which rows the copy engine writes."""
        assert copy_merge is not None
        copies, placements[tag] = copy_merge.place(batches[tag], shapes)
        return copies

    def on_plan(d: int, chunks: list[Chunk]) -> None:
        merger.add_plan(chunks)  # counts them (merger.counts); the chunks themselves are not kept (see `release` below)

    batches: list[list[Chunk] | None] = []  # by tag; without the precision check each is dropped once merged (consume)
    parts = getattr(target, "accepts_parts", False)
    # Tokenizing releases the GIL: documents in parallel. With plans from worker processes as well (the threads wait
    # for them): 2 planning threads starved the loop on the H200 box (their page-in of merged outputs under GIL
    # contention, with ids from tokenizing processes; 2026-12-02 w11).
    workers = (
        options.plan_workers
        if options.plan_workers is not None
        else default_plan_workers(bool(untokenized) or planning is not None, os.cpu_count() or 2, p.is_engine)
    )

    def feeds() -> Any:
        stream = stream_batches(
            len(p.docs), plan, Batcher(p.batch_cap, shape_key, options.naive, Batch), workers, on_plan, options.plan_ahead
        )
        while True:
            # the submitting thread waiting for planned chunks; planning here instead, its time is the plan stages'
            with host.stage("wait_plan") if workers else nullcontext():
                b = next(stream, None)
            if b is None:
                return
            batches.append(b)
            yield len(batches) - 1, (batch_parts(b) if parts else stack(b))

    results: dict[int, dict[str, np.ndarray]] = {}
    # Merging runs on `merge_workers` threads (numpy copies release the GIL), overlapping the submission and
    # inference of the next batches. Without the precision check nothing keeps a batch's outputs, so they
    # are merged straight out of the target's pinned output memory, each batch's rows split over the
    # threads (no per-batch copy or allocation: on the H200 box copying out and merging 1 GB of BERT-base
    # outputs on one thread took 3.6x the GPU time). With planning, merging and collecting threads about,
    # the thread feeding the GPU must not wait Python's default 5 ms for the GIL: a shorter switch
    # interval while the loop runs.
    stream = feeds()
    try:
        try:
            with interpreter_for_loop(options):  # the GIL switch interval, the collector paused
                if planning is not None:
                    planning.submit(texts)
                with ThreadPoolExecutor(max_workers=max(1, merge_workers), thread_name_prefix="trtforge-merge") as pool:
                    if not options.precision_check:

                        def consume(tag: int, views: dict[str, np.ndarray]) -> Any:
                            # release: nothing reads a batch's chunks after its merge here, so the list lets go of them
                            # and their windows' arrays are freed once merged. Kept to the end of the loop, every input's
                            # planned arrays were fresh memory, page-faulted in by the planning threads: 1.2-1.6 faults
                            # and ~2-3 us of planning CPU per window on the dev machine (4.9-5.8 against 2.8-3.2 us).
                            b, batches[tag] = batches[tag], None
                            if overlap and merge_workers == 0:  # here, on the collecting thread, before the slot is restaged
                                merge(b, views, None, True, placements.pop(tag, None))
                                return None
                            if overlap:  # one merge thread per batch; the slot waits for it, the collector does not
                                return pool.submit(merge, b, views, None, True, placements.pop(tag, None))
                            groups = [g for g in np.array_split(np.arange(len(b)), merge_workers) if len(g)]
                            for future in [pool.submit(merge, b, views, g.tolist(), True) for g in groups]:
                                future.result()
                            return None

                        for _ in (
                            target.run_many(stream, consume=consume, place=place)
                            if copy_merge is not None
                            else target.run_many(stream, consume=consume)
                        ):
                            pass
                    else:
                        pending = []
                        for tag, out in target.run_many(stream):
                            results[tag] = out  # kept for the ONNX Runtime comparison after the loop
                            pending.append(pool.submit(merge, batches[tag], out))
                        for future in pending:
                            future.result()
        finally:
            stream.close()  # on an error: no document is planned after this
            if planning is not None:
                planning.close()
        if merger.finished != len(p.docs):
            raise RuntimeError(f"{len(p.docs) - merger.finished} of {len(p.docs)} inputs were never finished by the merge")
        wall, loop_cpu, loop_faults = time.perf_counter() - start, time.process_time() - cpu_start, _minor_faults() - faults_start
        saving: dict[str, Any] = {"path": None}
        if writer is not None:
            close_start = time.perf_counter()
            closing, writer = writer, None  # close() removes the file itself if it fails
            closing.close()
            saving = {
                "path": str(options.save_outputs),
                "write_s": round(closing.seconds, 6),
                "after_loop_s": round(time.perf_counter() - close_start, 6),
            }
    except BaseException:
        if writer is not None:
            writer.abort()  # the temp file removed; what was queued is released, not written
        raise
    finally:
        output_pool.close()  # page-locked memory freed (nothing reads the merged outputs any more); numpy's: left to GC
        if reserved is not None:
            reserved.close()
    chunk_counts = list(merger.counts)
    progress(f"{len(p.docs)} inputs -> {sum(chunk_counts)} chunks -> {len(batches)} batches")

    report = {
        "schema": SCHEMA,
        "trtforge_version": __version__,
        "target": str(p.target_path),
        "backend": target.label,
        "reference": str(p.reference_path),
        "outputs": {name: k.to_json() for name, k in p.kinds.items()},
        "tokenizer": str(p.tokenizer.directory) if p.tokenizer else None,
        "chunking": {
            "chunk": options.chunk,
            "overlap": options.overlap,
            "merge": options.merge,
            "batch_size": p.batch_cap,
            "max_length": p.limits.seq,
            "max_tile": p.limits.tile,
            "naive": options.naive,
            "last_window": options.last_window,
        },
        "inputs": [{"name": d.name, "kind": d.kind, "length": d.length, "chunks": chunk_counts[i]} for i, d in enumerate(p.docs)],
        "batches": len(batches),
        "precision_error": _precision_error(p, batches, results, options)
        if options.precision_check
        else {"measured": False, "reason": "--no-precision-check"},
        "chunking_error": _chunking_error(p, options, chunk_counts),
        "latency": _latency(target.timings),
        "throughput": {
            "seconds": wall,
            "inputs_per_s": len(p.docs) / wall,
            "tokens_per_s": sum(d.length for d in p.docs) / wall,
            "unit": length_unit({d.kind for d in p.docs}),
            "chunks_per_s": sum(chunk_counts) / wall,
            "clock": "tokenize, chunk, batch, run, merge (warm-up excluded; --save-outputs writes overlap it, the rest after the loop is runtime.saved_outputs.after_loop_s)",
        },
        "memory": target.memory(),
        "runtime": {
            **_runtime(workers, merge_workers, target.runtime(), host, wall, loop_cpu, target.timings, loop_faults),
            "plan_processes": planning.processes if planning is not None else 0,
            "plan_ahead": options.plan_ahead,
            "overlap_merges": overlap,
            "switch_interval_us": options.switch_interval_us,
            "gc": {"paused_in_loop": options.gc_pause, "collect_before_loop_s": gc_before_s},
            "copy_engine_merge": copy_merge.report() if copy_merge is not None else {"enabled": False, "reason": copy_off},
            "output_pool": {
                **output_pool.report(),
                **(
                    {"reserved": {**reserved.report(), "seconds": round(reserve_s, 6), "note": "page-locked before the clock"}}
                    if reserved is not None
                    else {}
                ),
            },
            "saved_outputs": saving,
        },
    }
    report["gates"] = gates_for(report, p, options)
    if options.report:
        write_json_atomic(options.report, report)
    return report


def default_plan_workers(mostly_waiting: bool, cpus: int, engine: bool = False) -> int:
    """Planning threads when --plan-workers is not given: min(8, CPUs) where they mostly wait without the GIL, on the
    tokenizer (it releases the GIL, so documents tokenize in parallel) or on planning processes (which plan even
    pre-tokenized ids; with tokenizing processes 2 planning threads starved the loop, 2026-12-02 w11). Else planning is
    Python that contends for the GIL with the thread feeding the GPU: on an engine none (0: each input planned on that
    thread when its batches are needed), for ONNX Runtime 2 (its run releases the GIL, and the threads plan meanwhile).
    MiniLM from ids on the H100 box (w31, 3 rotated rounds over 768 inputs): 5.8-7.7M tokens/s, wall/GPU 1.17-1.58,
    planned on the thread feeding the GPU against 3.8-4.9M, 1.85-2.38 with 2 threads; BERT-base 1.002 against
    1.004-1.009 (benchmarks/RESULTS.md, 2026-12-05 w31). Earlier, with threads only, 2 beat 8 and 1 (2026-12-03 w26)."""
    if mostly_waiting:
        return min(8, max(1, cpus))
    return 0 if engine else min(2, max(1, cpus))


def _copy_merge_outputs(
    p: Prepared, options: RunOptions, warm: dict[str, tuple[tuple[int, ...], np.dtype]] | None, overlap: bool
) -> tuple[list[str], str | None]:
    """The token outputs the copy engine merges (copymerge.py), or none and why."""
    if not options.copy_engine_merge:
        return [], "off (--no-copy-engine-merge)"
    if not overlap:
        return [], "needs an engine, --no-precision-check and overlapped merges"
    if options.merge != "center":
        return [], f"--merge {options.merge} blends windows; only 'center' windows are copied"
    if not warm:
        return [], "no warm-up (--warmup 0): the merged outputs' layout is not known ahead"
    names = [n for n, k in p.kinds.items() if k.kind == "token" and k.seq_dim == 1 and not k.stride and n in warm]
    return (names, None) if names else ([], "no token output laid out [batch, positions, ...]")


def _pinned_reserve(p: Prepared, options: RunOptions, warm: dict[str, tuple[tuple[int, ...], np.dtype]] | None, names: list[str]) -> int:
    """Bytes of page-locked memory to reserve for the copy-engine merge's outputs: --pinned-reserve-mb, else
    copymerge.reserve_bytes over the batches in flight (queued ahead, in the slots, one merging)."""
    if options.pinned_reserve_mb is not None:
        return int(options.pinned_reserve_mb * 2**20)
    assert warm is not None
    per_position = sum(math.prod(warm[n][0]) * np.dtype(warm[n][1]).itemsize for n in names)
    bounds = [doc.length if doc.ids is not None or doc.text is None else len(doc.text.encode("utf-8")) for doc in p.docs]
    in_flight = (options.plan_ahead + options.slots + 1) * p.batch_cap if options.plan_ahead > 0 else None  # 0: unbounded
    return reserve_bytes(bounds, per_position, in_flight, options.chunk or p.limits.seq or max(bounds, default=1))


def _check_save_outputs(docs: list[Document], path: Path | None) -> None:
    """Before any work: --save-outputs keys are INPUT/OUTPUT, so inputs sharing a name would overwrite each other."""
    if path is None:
        return
    from trtforge.artifacts import ensure_writable_dir

    ensure_writable_dir(Path(path))
    seen: dict[str, int] = {}
    for d, doc in enumerate(docs):
        if doc.name in seen:
            raise UserError(
                f"inputs {seen[doc.name]} and {d} are both named '{doc.name}', so --save-outputs {path} would keep "
                "only one of them; give the inputs distinct names."
            )
        seen[doc.name] = d


@contextmanager
def interpreter_for_loop(options: RunOptions) -> Iterator[None]:
    """The interpreter as an inference loop wants it, restored after: the GIL switch interval at
    --switch-interval-us, and, with --gc-pause, the cyclic garbage collector off (_collect_garbage says why;
    left off if the caller had it off). Used by the one-process loop and by each Ray actor's units."""
    interval, gc_was_on = sys.getswitchinterval(), gc.isenabled()
    sys.setswitchinterval(options.switch_interval_us * 1e-6)
    try:
        if options.gc_pause:
            gc.disable()
        yield
    finally:
        sys.setswitchinterval(interval)
        if gc_was_on:
            gc.enable()


def _collect_garbage() -> float:
    """One full collection (seconds it took), before `run`'s clock: the loop then runs with the collector off.

    Why: Python's cyclic collector runs a full pass, over every object of the process, when enough objects have
    piled up, on whichever thread allocates; that thread holds the GIL meanwhile, so every thread of the loop stops.
    A full pass took 16-34 ms on the dev machine (~56k objects); on the GPU box MiniLM batches of 1.5 ms of GPU took
    10-47 ms of wall in bursts (benchmarks/RESULTS.md, 2026-12-05 w31/w32). The loop makes no reference cycles to speak
    of (30 cyclic objects over a whole MiniLM run, all from setting up ctypes), so nothing piles up while it is off."""
    begin = time.perf_counter()
    gc.collect()
    return round(time.perf_counter() - begin, 6)


def _minor_faults() -> int:
    """This process's minor page faults so far: memory touched for the first time (fresh allocations) costs one per page,
    charged to the thread that touches it."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _runtime(
    workers: int,
    merge_workers: int,
    target_runtime: dict[str, Any],
    host: StageClock,
    wall: float,
    cpu: float,
    timings: list[tuple[str, float, float | None]],
    faults: int,
) -> dict[str, Any]:
    """The target's runtime figures plus where the host's time went: the loop's wall and this process's CPU seconds
    (every thread's; planning processes' not), seconds per stage of the loop (plan, wait_plan, merge) and of the target
    (submit incl. stage_inputs, wait_slot, wait_gpu, copy_out), and each batch's wall and GPU ms in order (the timeline)."""
    target_runtime = dict(target_runtime)
    stages = {**host.report(), **target_runtime.pop("host_seconds", {})}
    return {
        "plan_workers": workers,
        "merge_workers": merge_workers,
        **target_runtime,
        "host": {
            "loop_wall_s": round(wall, 6),
            "loop_cpu_s": round(cpu, 6),
            "loop_minor_faults": faults,
            "stages": stages,
            "note": "seconds each stage took, summed over the threads that ran it (threads overlap); cpu_seconds: "
            "the CPU time those threads used meanwhile (the rest is waiting: for the GIL, a core, or the GPU where "
            "its synchronisation blocks; a spinning wait for the GPU counts as CPU time)",
        },
        "timeline": batch_timeline([w for _, w, _ in timings], [g for _, _, g in timings]),
    }


def gates_for(report: dict[str, Any], p: Prepared, options: RunOptions) -> dict[str, Any]:
    """The report's gates, with the defaults of the target's precision (verify/gates.py), which the report names."""
    onnx_sidecar = None if p.is_engine else read_sidecar(p.target_path, required=False)
    precision = target_precision(p.engine_sidecar if p.is_engine else None, onnx_sidecar, None if p.is_engine else p.target_path)
    gates = evaluate_gates(report, gates_from(options.gate_values(), precision), tolerated=frozenset(p.tolerances))
    notes = gate_notes(options.gate_values(), precision)
    if p.tolerances:
        notes = [*notes, f"--atol/--rtol replace the default gates for {', '.join(p.tolerances)}"]
        if not (report.get("precision_error") or {}).get("measured"):
            why = (report.get("precision_error") or {}).get("reason", "not measured")
            gates = {
                **gates,
                "passed": False,
                "failures": [*gates["failures"], f"--atol/--rtol could not be evaluated: precision error not measured: {why}"],
            }
    gates = {"precision": precision, **gates}
    return {**gates, "notes": notes} if notes else gates


def _warm_up(p: Prepared, options: RunOptions, target: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    """Untimed: the full-size batch of the first document's first chunk shape, `warmup` rounds of the
    target's warm_batches (TensorRT: one plain enqueue, then a graph capture per staging slot). The
    document is planned on a copy, so the timed run still tokenizes and plans it. Returns each token
    output's shape per position and dtype (what the merge can allocate ahead), None without a warm-up."""
    if options.warmup <= 0 or not p.docs:
        return None
    doc = replace(p.docs[0], feeds=dict(p.docs[0].feeds))
    chunks = plan_document(0, doc, p.specs, p.layout, options.chunk, options.overlap, p.limits, p.tokenizer, p.scales, options.full_last)
    first = [c for c in chunks if shape_key(c) == shape_key(chunks[0])]
    size = 1 if options.naive else p.batch_cap
    batch = stack([first[i % len(first)] for i in range(size)])
    outs = list(target.run_many([(None, batch)] * (options.warmup * target.warm_batches)))
    target.timings.clear()
    target.reset_host_clock()  # runtime.host covers the timed loop only, like loop_wall_s
    templates = {}
    for name, kind in p.kinds.items():
        if kind.kind == "token" and outs and name in outs[-1][1]:
            part = chunk_part(kind, first[0], outs[-1][1][name][0:1])
            templates[name] = (tuple(part.shape[1:]), part.dtype)
    return templates


def _precision_error(
    p: Prepared, batches: list[list[Chunk]], results: dict[int, dict[str, np.ndarray]], options: RunOptions
) -> dict[str, Any]:
    """The target against ONNX Runtime fp32 on the reference ONNX (or the outputs --load-reference stored), batch by
    batch on identical chunks; with --save-reference, the reference's outputs are kept for a later run."""
    if self_referenced(p) and not options.load_reference:
        return {"measured": False, "reason": "target is its own reference; pass --reference or run an engine"}
    reference: Any = p.reference
    if options.load_reference:
        reference = StoredReference(options.load_reference)
        reference.check_outputs(list(p.kinds))
    elif options.save_reference:
        reference = RecordingReference(p.reference, p.reference_path, onnx_graph_hash(load_onnx(p.reference_path)))
    comparator = Comparator({name: k.kind for name, k in p.kinds.items()}, p.tolerances)
    try:
        for i, b in enumerate(batches):
            add_precision(comparator, reference, b, results[i])
    finally:
        if isinstance(reference, StoredReference):
            reference.close()
    summary = precision_summary(comparator)
    if isinstance(reference, RecordingReference):
        reference.save(options.save_reference)
        summary["saved_reference"] = str(options.save_reference)
    if isinstance(reference, StoredReference):
        summary["scope"] = (
            f"target vs the reference outputs stored in {options.load_reference} "
            f"(from {reference.meta.get('reference_onnx')}, {reference.meta.get('made')}) on identical chunks"
        )
    return summary


def self_referenced(p: Prepared) -> bool:
    return not p.is_engine and p.target_path.resolve() == p.reference_path.resolve()


def add_precision(comparator: Comparator, reference: Any, batch: list[Chunk], out: dict[str, np.ndarray]) -> None:
    """One batch's target outputs judged against the reference ONNX run on the same stacked chunks."""
    feeds = stack(batch)
    comparator.add(reference.run(feeds), {k: v.astype(np.float32) for k, v in out.items()}, feeds.get("attention_mask"))


def precision_summary(comparator: Comparator) -> dict[str, Any]:
    per_output = comparator.result()
    return {
        "measured": True,
        "scope": "target vs ONNX Runtime fp32 on identical chunks",
        "per_output": per_output,
        "worst": worst(per_output),
    }


def _latency(timings: list[tuple[str, float, float | None]]) -> dict[str, Any]:
    groups: dict[str, list[tuple[float, float | None]]] = {}
    for label, wall, gpu in timings:
        groups.setdefault(label, []).append((wall, gpu))
    out: dict[str, Any] = {}
    for label, values in [("all", [(w, g) for _, w, g in timings])] + sorted(groups.items()):
        entry: dict[str, Any] = {"wall": latency_stats([w for w, _ in values])}
        gpus = [g for _, g in values if g is not None]
        ratio = wall_over_gpu([w for w, _ in values], [g for _, g in values])
        if ratio is not None:
            entry["gpu_compute"] = latency_stats(gpus)
            # how busy the GPU was: the wall time the batches cost over their GPU compute (1.0: never idle)
            entry["wall_over_gpu"] = ratio
            entry["wall_over_gpu_p50"] = entry["wall"]["p50_ms"] / entry["gpu_compute"]["p50_ms"]
        out[label] = entry
    return out


def _whole_limit(size: int, limit: int | None, scales: list[float]) -> int:
    """The largest size <= limit the model takes whole whose output maps to whole pixels at every scale."""
    n = min(size, limit) if limit else size
    while n > 1 and any(abs(n * s - round(n * s)) > 1e-6 for s in scales):
        n -= 1
    return n


def _measurement_input(doc: Document, p: Prepared) -> tuple[Document, str]:
    """The longest prefix (top-left crop for images) of `doc` that the model takes in one pass."""
    if doc.kind == "text":
        assert p.tokenizer is not None
        n = min(doc.length, p.limits.seq - p.tokenizer.specials) if p.limits.seq else doc.length
        return Document(doc.name, "text", {}, n, doc.ids[:n]), "whole" if n == doc.length else f"prefix of {n} tokens"
    if doc.kind == "seq":
        n = min(doc.length, p.limits.seq or doc.length)
        sub = Document(doc.name, "seq", p.layout.sliced(doc.feeds, {p.layout.seq_axis: (0, n)}), n)
        return sub, "whole" if n == doc.length else f"prefix of {n} positions"
    h, w = doc.hw
    hh, ww = _whole_limit(h, p.limits.tile, p.scales), _whole_limit(w, p.limits.tile, p.scales)
    ha, wa = p.layout.chunk_axes
    sub = Document(doc.name, "image", p.layout.sliced(doc.feeds, {ha: (0, hh), wa: (0, ww)}), hh * ww)
    return sub, "whole" if (hh, ww) == (h, w) else f"top-left {hh}x{ww} crop"


def _chunking_error(p: Prepared, options: RunOptions, counts: list[int]) -> dict[str, Any]:
    """Chunked+merged vs one whole pass, both ONNX Runtime fp32, where chunking happens: on the longest
    prefix of each chunked input that the model takes whole, with that prefix itself chunked. counts: each input's
    chunks in the run."""
    return chunking_summary([chunking_error_of(doc, counts[d], p, options) for d, doc in enumerate(p.docs)], p.kinds)


def chunking_error_of(doc: Document, count: int, p: Prepared, options: RunOptions) -> tuple[dict[str, Any], Comparator | None]:
    """One input's share of the chunking error (`count`: its chunks in the run): its per_input entry and
    a comparator holding only this input (None when not measured). Per-input comparators merged in input
    order give the sums one comparator fed input by input gives, so the error does not depend on where
    (which process, which Ray actor) each input was measured."""
    if count == 1:
        return {"name": doc.name, "scope": "not chunked (fits one chunk)", "measured": False}, None
    if not options.chunking_check:
        return {"name": doc.name, "scope": "--no-chunking-check", "measured": False}, None
    if p.layout.fixed_length:
        return {
            "name": doc.name,
            "scope": f"not measurable: the model takes exactly {p.layout.fixed_length} positions, so no whole pass exists",
            "measured": False,
        }, None
    sub, scope = _measurement_input(doc, p)
    sub_chunks = plan_document(
        0, sub, p.specs, p.layout, options.chunk, options.overlap, p.limits, p.tokenizer, p.scales, options.full_last
    )
    if len(sub_chunks) < 2:
        longest = p.limits.seq if doc.kind != "image" else p.limits.tile
        return {
            "name": doc.name,
            "scope": f"not measurable: chunk ({options.chunk}) is not smaller than the longest input the model takes whole ({longest})",
            "measured": False,
        }, None
    comparator = Comparator({name: k.kind for name, k in p.kinds.items()})
    whole_chunk = plan_document(0, sub, p.specs, p.layout, None, 0, Limits(), p.tokenizer, p.scales)[0]
    whole = p.reference.run(whole_chunk.feeds)
    parts: dict[str, list[tuple[Chunk, np.ndarray]]] = {}
    for c in sub_chunks:
        out = p.reference.run(c.feeds)
        for name, kind in p.kinds.items():
            parts.setdefault(name, []).append((c, chunk_part(kind, c, out[name])))
    for name, kind in p.kinds.items():
        merged = merge_document(sub, kind, parts[name], options)
        reference = merge_document(sub, kind, [(whole_chunk, chunk_part(kind, whole_chunk, whole[name]))], options)
        comparator.add_output(name, reference[None], merged[None])
    return {"name": doc.name, "scope": scope, "chunks": len(sub_chunks), "measured": True}, comparator


def chunking_summary(parts: list[tuple[dict[str, Any], Comparator | None]], kinds: dict[str, OutputKind]) -> dict[str, Any]:
    """The report's chunking_error from chunking_error_of's results, in input order."""
    per_input = [entry for entry, _ in parts]
    if not any(i["measured"] for i in per_input):
        reasons = sorted({i["scope"] for i in per_input})
        return {"measured": False, "reason": "; ".join(reasons), "per_input": per_input}
    comparator = Comparator({name: k.kind for name, k in kinds.items()})
    for _, part in parts:
        if part is not None:
            comparator.merge(part)
    per_output = comparator.result()
    return {
        "measured": True,
        "scope": "chunked+merged vs one whole pass, both ONNX Runtime fp32",
        "per_input": per_input,
        "per_output": per_output,
        "worst": worst(per_output),
    }
