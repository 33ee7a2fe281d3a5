"""A model's own Hugging Face tokenizer from a local directory, through the `tokenizers` library.

Only `tokenizer.json` (+ `tokenizer_config.json` / `special_tokens_map.json` for the pad token) is
read, so this works where transformers is not installed (the GPU machine). Nothing is hard-coded:
the special tokens and their token types come from the tokenizer's own post-processor (BERT [CLS] x [SEP]
= 101 x 102, RoBERTa <s> x </s> = 0 x 2, GPT-2 none). `run` tokenizes a text once and cuts its ids into
windows itself (`wrap_spans`), the very windows the tokenizer's truncation with stride cuts (`windows`, kept
as the reference: tests/test_tokenize.py proves both equal on every shipped tokenizer), so planning threads
touch no tokenizer state and merged outputs stay exact.

Where the tokenizer is found: `--tokenizer DIR` / config `model.tokenizer`, else the `tokenizer`
directory the export sidecar names (relative to that ONNX's folder), following the sidecar chain
(calibrate/clean -> export); the built-in MiniLM uses its package's tokenizer.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.core.artifacts import sidecar_chain
from trtforge.core.errors import UserError


@dataclass(frozen=True)
class TextWindow:
    ids: np.ndarray  # token ids with the model's special tokens
    type_ids: np.ndarray
    content: slice  # positions of the document's tokens inside this window
    span: tuple[int, int]  # the document positions they are


class TextTokenizer:
    def __init__(self, directory: str | Path):
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise UserError(
                f"tokenizer directory {directory} has no tokenizer.json; save the tokenizer there with "
                "save_pretrained (a 'fast' tokenizer) or point --tokenizer / model.tokenizer elsewhere."
            )
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError("reading text needs the `tokenizers` package; `pip install tokenizers`.") from None
        try:
            self.tok = Tokenizer.from_file(str(path))
            self.tok.no_padding()
            self.tok.no_truncation()
            probe = self.tok.encode("a")
        except BaseException as exc:  # noqa: BLE001 - the Rust side panics with pyo3's PanicException (a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise UserError(f"{path} is not a readable tokenizer ({type(exc).__name__}); re-save it with save_pretrained.") from None
        self.directory = directory
        self.config = _read_config(directory)
        mask = list(probe.special_tokens_mask)
        content = [i for i, m in enumerate(mask) if not m]
        first, last = (content[0], content[-1] + 1) if content else (len(mask), len(mask))
        self.prefix = list(probe.ids[:first])
        self.suffix = list(probe.ids[last:])
        types = list(probe.type_ids)  # token types by position: the specials' may differ from the text's (XLNet: 2)
        self.prefix_types, self.suffix_types = types[:first], types[last:]
        self.content_type = types[first] if content else 0

    @property
    def specials(self) -> int:
        return len(self.prefix) + len(self.suffix)

    @property
    def pad_id(self) -> int | None:
        pad = self.config.get("pad_token")
        if isinstance(pad, dict):
            pad = pad.get("content")
        return self.tok.token_to_id(pad) if isinstance(pad, str) else None

    def document(self, text: str) -> np.ndarray:
        """The text's token ids without special tokens. A batch call, because it releases the GIL (encode holds it
        for the whole text), so planning threads tokenize while batches run; the `_fast` one where the installed
        tokenizers has it (>= 0.20): it skips the character offsets, which these ids do not need (same ids, 1.2x
        the tokens/s on MiniLM's documents; tokenizing is most of `run`'s planning time on text inputs)."""
        encode = getattr(self.tok, "encode_batch_fast", None) or self.tok.encode_batch
        return np.asarray(encode([text], add_special_tokens=False)[0].ids, dtype=np.int64)

    def wrap(self, ids: np.ndarray) -> TextWindow:
        """Document ids (no specials) with the model's special tokens around them."""
        full = np.concatenate([np.asarray(self.prefix, np.int64), np.asarray(ids, np.int64), np.asarray(self.suffix, np.int64)])
        return TextWindow(full, self.type_ids(full[None])[0], slice(len(self.prefix), len(self.prefix) + len(ids)), (0, len(ids)))

    def type_ids(self, block: np.ndarray) -> np.ndarray:
        """Token types for windows wrapped in the specials (rows of `block`): as the tokenizer's own encoding gives them."""
        types = np.full(block.shape, self.content_type, np.int64)
        types[:, : len(self.prefix_types)] = self.prefix_types
        types[:, block.shape[1] - len(self.suffix_types) :] = self.suffix_types
        return types

    def windows(self, text: str, chunk: int, overlap: int) -> list[TextWindow]:
        """Windows of at most `chunk` tokens (specials included) sharing `overlap` document tokens,
        planned by the tokenizer (truncation with stride), each mapped back to document positions.
        Changes the tokenizer's truncation setting while it runs: not for concurrent use."""
        self.capacity(chunk, overlap)
        doc = self.tok.encode(text, add_special_tokens=False)
        self.tok.enable_truncation(chunk, stride=overlap)
        try:
            first = self.tok.encode(text)
        finally:
            self.tok.no_truncation()
        return map_windows(
            doc.ids, doc.offsets, [(e.ids, e.type_ids, e.special_tokens_mask, e.offsets) for e in [first, *first.overflowing]]
        )

    def capacity(self, chunk: int, overlap: int) -> int:
        """Document tokens a window of `chunk` holds beside the specials; an error unless it exceeds `overlap`."""
        capacity = chunk - self.specials
        if capacity <= overlap:
            raise UserError(
                f"--chunk {chunk} leaves {capacity} tokens beside the model's {self.specials} special tokens, "
                f"which must exceed --overlap {overlap}; use a larger chunk or a smaller overlap."
            )
        return capacity

    def encode(self, text: str, max_length: int) -> dict[str, np.ndarray]:
        """One sample for calibration: ids with specials, truncated to max_length, and its masks. [1, n]."""
        self.tok.enable_truncation(max_length)
        try:
            enc = self.tok.encode(text)
        finally:
            self.tok.no_truncation()
        ids = np.asarray(enc.ids, np.int64)[None]
        return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.asarray(enc.type_ids, np.int64)[None]}


def wrap_spans(ids: np.ndarray, spans: list[tuple[int, int]], prefix: list[int], suffix: list[int]) -> list[np.ndarray]:
    """Each (start, end) span of a document's ids (no specials) wrapped in the model's special tokens, as rows of
    2-D int64 blocks: one block per run of consecutive spans of one length, in span order. Consecutive windows
    are then adjacent in memory, so `run` stages a batch of them with one copy instead of one per window, and
    builds a document's windows with a few numpy calls instead of several per window (the Python work of the thread
    feeding the GPU, which plans every input). A span outside the ids is an IndexError. Pure."""
    ids = np.asarray(ids, np.int64)
    if len(spans) == 0:
        return []
    p, s = len(prefix), len(suffix)
    starts = np.fromiter(map(operator.itemgetter(0), spans), np.int64, len(spans))
    lengths = np.fromiter(map(operator.itemgetter(1), spans), np.int64, len(spans)) - starts
    if starts.min() < 0 or lengths.min() < 0 or int((starts + lengths).max()) > len(ids):
        raise IndexError(f"a span lies outside the document's {len(ids)} ids")
    cuts = (np.flatnonzero(lengths[1:] != lengths[:-1]) + 1).tolist()  # where a run of one length ends
    blocks = []
    for i, j in zip([0, *cuts], [*cuts, len(spans)]):
        n = int(lengths[i])
        block = np.empty((j - i, p + n + s), np.int64)
        block[:, :p] = prefix
        if n:  # row k of the strided view: the n ids from position k, so the rows are gathered by one indexing
            windows = np.lib.stride_tricks.as_strided(ids, (len(ids) - n + 1, n), (ids.strides[0], ids.strides[0]), writeable=False)
            block[:, p : p + n] = windows[starts[i:j]]
        block[:, p + n :] = suffix
        blocks.append(block)
    return blocks


def map_windows(
    doc_ids: list[int], doc_offsets: list[tuple[int, int]], encodings: list[tuple[list[int], list[int], list[int], list[tuple[int, int]]]]
) -> list[TextWindow]:
    """Windows (ids, type ids, special mask, offsets) -> document spans, found by the offset of each
    window's first content token and checked token by token against the document. Pure."""
    windows, cursor = [], 0
    for ids, type_ids, mask, offsets in encodings:
        content = [i for i, m in enumerate(mask) if not m]
        if not content:
            continue
        lo, hi = content[0], content[-1] + 1
        if hi - lo != len(content):
            raise ValueError("a window's document tokens are not contiguous")
        body = list(ids[lo:hi])
        start = next(
            (
                s
                for s in range(cursor, len(doc_ids))
                if tuple(doc_offsets[s]) == tuple(offsets[lo]) and list(doc_ids[s : s + len(body)]) == body
            ),
            None,
        )
        if start is None:
            raise ValueError("a tokenizer window does not match the document's tokens")
        windows.append(TextWindow(np.asarray(ids, np.int64), np.asarray(type_ids, np.int64), slice(lo, hi), (start, start + len(body))))
        cursor = start
    return windows


def _read_config(directory: Path) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / name
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError, RecursionError):
                raise UserError(f"{path} is not valid JSON; re-save the tokenizer with save_pretrained.") from None
            if not isinstance(data, dict):
                raise UserError(f"{path} does not hold a JSON object; re-save the tokenizer with save_pretrained.")
            config.update({k: v for k, v in data.items() if v is not None})
    return config


# -- where a model's tokenizer lives ---------------------------------------------------------------


def find_tokenizer_dir(onnx_path: str | Path | None, chain: list[tuple[Path, dict[str, Any]]] | None = None) -> Path | None:
    """The tokenizer directory the nearest sidecar names (relative to its ONNX), or the built-in MiniLM's.

    A pointer whose directory is gone (an ONNX and its sidecar copied elsewhere without the tokenizer) is
    passed over for the next sidecar up the chain (the export's, where the tokenizer was saved); only when
    no sidecar leads to one is it an error, naming the first missing directory."""
    chain = chain if chain is not None else (sidecar_chain(onnx_path) if onnx_path else [])
    missing: tuple[Path, Path] | None = None
    for path, side in chain:
        named = side.get("tokenizer")
        if named:
            directory = Path(named) if Path(named).is_absolute() else path.parent / named
            if (directory / "tokenizer.json").is_file():
                return directory
            missing = missing or (path, directory)
    for _, side in chain:
        if side.get("source") == "minilm":
            from trtforge.models.minilm import model_dir

            return model_dir()
    if missing:
        raise UserError(
            f"sidecar {missing[0]}.json names tokenizer directory {missing[1]}, which has no tokenizer.json; "
            "copy the tokenizer folder beside the ONNX, re-run trtforge export, or pass --tokenizer DIR."
        )
    return None


def load_tokenizer(directory: str | Path | None) -> TextTokenizer | None:
    return TextTokenizer(directory) if directory else None
