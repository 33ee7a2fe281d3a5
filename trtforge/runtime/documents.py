"""What `run` reads: documents (text, token ids, images, arrays) and their chunks and batches."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from trtforge.core.config import InputSpec
from trtforge.core.errors import UserError
from trtforge.core.layout import Layout
from trtforge.runtime.chunking import (
    RowRun,
    Window,
    join_run,
)
from trtforge.runtime.tokenize import TextTokenizer


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
    share the GIL with the one feeding the GPU keeps the GPU waiting (figures: docs/performance.md#run-loop-defaults)."""

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
    comparison, Ray), while `run`'s loop reads `blocks` (runloop.Batcher through `block_runs`, Merger through `windows`)."""

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
