"""`trtforge run`: chunked inference on an engine (or ONNX), checked against ONNX Runtime, timed.

Inputs longer than the model takes are cut into chunks (chunking.py), packed into batches of equal
shape that fit a profile, run on the target backend (TensorRT engine, pipelined; or ONNX Runtime),
merged back per input, and checked twice:
- precision error: the target's outputs against ONNX Runtime fp32 on the reference ONNX, on the very
  same chunks (so chunking plays no part);
- chunking error: chunked-and-merged against one whole pass, both on ONNX Runtime fp32 (so precision
  plays no part). Where the whole input is longer than the model takes, the longest prefix it takes is
  used, and the report says so.
"""

from __future__ import annotations

import resource
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtforge import __version__
from trtforge.artifacts import read_sidecar, write_json_atomic
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.chunking import StreamingMerge, check_overlap, Window, merge_logits, merge_tiles, merge_windows, plan_tiles, plan_windows
from trtforge.config import AxisRange, InputSpec
from trtforge.errors import UserError
from trtforge.graph import io_specs
from trtforge.metrics import compare, rowwise_cosine, vectors
from trtforge.onnxio import load_onnx
from trtforge.report import SCHEMA, gate_failures, latency_stats, merge_metrics


@dataclass
class Document:
    name: str
    kind: str  # text | seq | image
    content: dict[str, np.ndarray]  # text: {"input_ids": ids (no specials)}; seq/image: full arrays, batch 1
    length: int  # tokens / positions / pixels (h*w)


@dataclass
class Chunk:
    doc: int
    index: int
    feeds: dict[str, np.ndarray]
    window: Any  # Window (1-D) or Tile (2-D)
    tokens: int


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
    max_rel_l2: float = 1e-2
    min_cosine: float = 0.99
    min_chunk_cosine: float | None = None
    providers: list[str] = field(default_factory=list)
    report: Path | None = None
    naive: bool = False  # one chunk per execute (for benchmarks)
    save_outputs: Path | None = None  # merged outputs per input, as .npz


# -- inputs --------------------------------------------------------------------------------------

def _seq_axis(specs: list[InputSpec]) -> str | None:
    for spec in specs:
        if len(spec.shape) >= 2 and isinstance(spec.shape[1], str):
            return spec.shape[1]
    return None


def load_documents(path: Path, specs: list[InputSpec], tokenizer_factory: Callable[[], Any] | None) -> list[Document]:
    from trtforge.calibrate import data as data_mod

    docs: list[Document] = []
    if path.is_file() and path.suffix == ".jsonl":
        files = [path]
        kind = "text"
        first = path.read_text().split("\n", 1)[0]
        if '"input_ids"' in first:  # pre-tokenized: {"name": ..., "input_ids": [...]} without special tokens
            import json as _json

            for line in path.read_text().splitlines():
                if line.strip():
                    item = _json.loads(line)
                    ids = np.asarray(item["input_ids"], dtype=np.int64)
                    docs.append(Document(item.get("name", f"text_{len(docs)}"), "text", {"input_ids": ids}, int(ids.size)))
            return docs
    else:
        dataset = data_mod.scan(path)
        files, kind = dataset.files, dataset.kind
    if kind == "text":
        if tokenizer_factory is None:
            raise UserError(f"{path} holds text, but this model has no tokenizer; give .npy/.npz inputs.")
        tokenizer = tokenizer_factory()
        fake = data_mod.Dataset(path if path.is_dir() else path.parent, files, "text", "")
        names = [f.stem for f in files] if all(f.suffix == ".txt" for f in files) else None
        for i, text in enumerate(data_mod.read_texts(fake)):
            ids = np.asarray(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=np.int64)
            docs.append(Document(names[i] if names else f"text_{i}", "text", {"input_ids": ids}, int(ids.size)))
        return docs
    if kind == "images":
        samples = data_mod.read_images(data_mod.Dataset(path, files, kind, ""), specs)
    else:
        samples = data_mod.read_arrays(data_mod.Dataset(path, files, kind, ""), specs)
    for i, sample in enumerate(samples):
        for name, array in sample.items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise UserError(f"input {files[i] if i < len(files) else i}: tensor '{name}' holds NaN or Inf; clean the input.")
        first = next(iter(sample.values()))
        image = first.ndim == 4 and first.dtype.kind == "f"
        length = first.shape[2] * first.shape[3] if image else first.shape[1]
        docs.append(Document(files[i].stem if i < len(files) else f"input_{i}", "image" if image else "seq", sample, int(length)))
    return docs


def _special_ids(tokenizer_factory: Callable[[], Any] | None) -> tuple[int, int]:
    """[CLS]/[SEP] ids from the model's tokenizer; BERT's 101/102 where no tokenizer is installed
    (pre-tokenized inputs on a machine without transformers)."""
    try:
        tok = tokenizer_factory() if tokenizer_factory else None
    except (UserError, ImportError):
        tok = None
    return (getattr(tok, "cls_token_id", 101) or 101, getattr(tok, "sep_token_id", 102) or 102)


def text_feeds(ids: np.ndarray, specs: list[InputSpec], cls: int, sep: int) -> dict[str, np.ndarray]:
    """[CLS] ids [SEP] with its attention mask (and zero token types), batch 1."""
    full = np.concatenate([[cls], ids, [sep]]).astype(np.int64)[None]
    feeds = {}
    for spec in specs:
        if spec.name == "input_ids":
            feeds[spec.name] = full.astype(spec.dtype)
        elif spec.name == "attention_mask":
            feeds[spec.name] = np.ones_like(full, dtype=spec.dtype)
        elif spec.name == "token_type_ids":
            feeds[spec.name] = np.zeros_like(full, dtype=spec.dtype)
        else:
            raise UserError(f"text inputs cannot fill model input '{spec.name}'; give .npz inputs instead.")
    return feeds


def make_chunks(docs: list[Document], specs: list[InputSpec], chunk: int | None, overlap: int, max_len: int,
                specials: tuple[int, int]) -> list[Chunk]:
    chunks: list[Chunk] = []
    for d, doc in enumerate(docs):
        if doc.kind == "text":
            capacity = (chunk or max_len) - 2
            if chunk is None and doc.length + 2 > max_len:
                raise UserError(f"input '{doc.name}' has {doc.length + 2} tokens but the model takes at most {max_len}; enable chunking with --chunk.")
            if capacity < 1:
                raise UserError(f"--chunk {chunk} leaves no room for the text beside [CLS] and [SEP]; use a larger chunk.")
            if chunk:
                check_overlap(chunk, overlap)
            ov = min(overlap, capacity - 1) if chunk else 0
            for i, w in enumerate(plan_windows(doc.length, capacity, ov)):
                ids = doc.content["input_ids"][w.start:w.end]
                chunks.append(Chunk(d, i, text_feeds(ids, specs, *specials), w, w.length))
        elif doc.kind == "seq":
            size = chunk or doc.length
            if chunk is None and doc.length > max_len:
                raise UserError(f"input '{doc.name}' has {doc.length} positions but the model takes at most {max_len}; enable chunking with --chunk.")
            for i, w in enumerate(plan_windows(doc.length, size, overlap if chunk else 0)):
                feeds = {k: v[:, w.start:w.end] for k, v in doc.content.items()}
                chunks.append(Chunk(d, i, feeds, w, w.length))
        else:
            array = next(iter(doc.content.values()))
            h, w_ = array.shape[2], array.shape[3]
            size = chunk or max(h, w_)
            for i, tile in enumerate(plan_tiles(h, w_, size, overlap if chunk else 0)):
                feeds = {k: v[..., tile.rows.start:tile.rows.end, tile.cols.start:tile.cols.end] for k, v in doc.content.items()}
                chunks.append(Chunk(d, i, feeds, tile, tile.rows.length * tile.cols.length))
    return chunks


def make_batches(chunks: list[Chunk], batch_size: int, naive: bool = False) -> list[list[Chunk]]:
    """Chunks of equal shape packed together, at most batch_size each; order kept within a shape."""
    if naive:
        return [[c] for c in chunks]
    groups: dict[tuple, list[Chunk]] = {}
    for c in chunks:
        groups.setdefault(tuple((k, v.shape) for k, v in sorted(c.feeds.items())), []).append(c)
    batches = []
    for group in groups.values():
        batches += [group[i:i + batch_size] for i in range(0, len(group), batch_size)]
    return batches


def stack(batch: list[Chunk]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([c.feeds[k] for c in batch], axis=0) for k in batch[0].feeds}


# -- targets -------------------------------------------------------------------------------------

class OrtTarget:
    backend = "onnxruntime"

    def __init__(self, path: Path, providers: list[str]):
        self.runner = OrtRunner(path, providers or None)
        self.input_names, self.output_names = self.runner.input_names, self.runner.output_names
        self.label = f"onnxruntime {'/'.join(self.runner.providers)}"
        self.timings: list[tuple[str, float, float | None]] = []

    def run_many(self, batches: list[tuple[Any, dict[str, np.ndarray]]]):
        for tag, feeds in batches:
            start = time.perf_counter()
            out = self.runner.run(feeds)
            self.timings.append(("onnxruntime", (time.perf_counter() - start) * 1e3, None))
            yield tag, out

    def memory(self) -> dict[str, Any]:
        return {"device": "cpu", "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class TrtTarget:
    backend = "tensorrt"

    def __init__(self, engine: Path, backend: str):
        from trtforge.backends.tensorrt import load_trt, runtime_identity
        from trtforge.backends.tensorrt_runtime import TrtRunner
        from trtforge.build import check_engine_compat, read_engine_sidecar
        from trtforge.doctor import _gpu

        self.sidecar = read_engine_sidecar(engine, verify=True)
        built = f"{self.sidecar.get('backend')} {self.sidecar.get('tensorrt_version')}"
        try:
            mod = load_trt(backend if backend != "auto" else self.sidecar.get("backend", "auto"))
        except UserError:
            raise UserError(f"{engine.name} was built with {built}, which is not installed here; rebuild the engine on this machine.") from None
        check_engine_compat(engine, self.sidecar, runtime_identity(mod))
        if _gpu() is None:
            raise UserError(f"{engine.name} needs a GPU to run and this machine has none; run its ONNX ({self.sidecar.get('built_onnx')}) on ONNX Runtime instead.")
        self.runner = TrtRunner(mod, engine, self.sidecar)
        self.input_names, self.output_names = self.runner.input_names, self.runner.output_names
        self.label = f"{mod.flavour} {mod.version} ({self.sidecar.get('precision')})"
        self.timings: list[tuple[str, float, float | None]] = []

    def run_many(self, batches):
        start = len(self.runner.timings)
        for tag, out in self.runner.run_many(batches):
            yield tag, out
        for t in self.runner.timings[start:]:
            self.timings.append((f"profile {t.profile}", t.wall_ms, t.gpu_ms))

    def memory(self) -> dict[str, Any]:
        return {"device": "gpu", "peak_gpu_mb": self.runner.peak_bytes / 2**20}


# -- the step ------------------------------------------------------------------------------------

def _max_len(axes: dict[str, AxisRange], seq_axis: str | None, engine_sidecar: dict | None) -> int:
    if engine_sidecar and seq_axis:
        return max(p["axes"][seq_axis][2] for p in engine_sidecar["profiles"] if seq_axis in p["axes"])
    if seq_axis and seq_axis in axes:
        return axes[seq_axis].max
    return 1 << 30


def _max_tile(specs: list[InputSpec], axes: dict[str, AxisRange], engine_sidecar: dict | None) -> int | None:
    """The largest square tile an image model (input [N, C, H, W] with named H and W) takes."""
    for spec in specs:
        if len(spec.shape) == 4 and isinstance(spec.shape[2], str) and isinstance(spec.shape[3], str):
            h, w = spec.shape[2], spec.shape[3]
            if engine_sidecar:
                return max(min(p["axes"][h][2], p["axes"][w][2]) for p in engine_sidecar["profiles"])
            return min(axes[h].max, axes[w].max)
    return None


def _check_io(target: Any, reference: OrtRunner, target_path: Path, reference_path: Path) -> None:
    if sorted(target.input_names) != sorted(reference.input_names) or sorted(target.output_names) != sorted(reference.output_names):
        raise UserError(
            f"{target_path.name} has inputs {sorted(target.input_names)} / outputs {sorted(target.output_names)} but "
            f"{reference_path.name} has {sorted(reference.input_names)} / {sorted(reference.output_names)}; "
            "pass the ONNX the engine was built from as --reference."
        )


def _strip(doc: Document, output: np.ndarray) -> np.ndarray:
    """Token outputs of one chunk without [CLS]/[SEP]: [1, n+2, H] -> [n, H]."""
    return output[0, 1:-1] if doc.kind == "text" else output[0]


def _merge_doc(doc: Document, parts: list[tuple[Chunk, dict[str, np.ndarray]]], name: str, merge: str, chunk: int | None,
               overlap: int) -> np.ndarray | None:
    outs = [o[name] for _, o in parts]
    if outs[0].ndim == 3:  # token-level [1, n, H]
        windows: list[Window] = [c.window for c, _ in parts]
        return merge_windows([_strip(doc, o) for o in outs], windows, doc.length, merge)
    if outs[0].ndim == 2 and outs[0].shape[-1] > 1:  # sequence-level logits [1, classes]
        # Token-weighted mean of the chunks' softmax: a probability vector per input.
        return merge_logits([o[0] for o in outs], [c.tokens for c, _ in parts], "mean_softmax")
    if outs[0].ndim == 4 and doc.kind == "image":
        array = next(iter(doc.content.values()))
        h, w = array.shape[2], array.shape[3]
        size = chunk or max(h, w)
        return merge_tiles([o[0] for o in outs], h, w, size, overlap if chunk else 0, merge)
    return None


def run(target_path: Path, options: RunOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    target_path = Path(target_path)
    is_engine = target_path.suffix != ".onnx"
    engine_sidecar = None
    if is_engine:
        from trtforge.build import read_engine_sidecar

        engine_sidecar = read_engine_sidecar(target_path)
        reference_path = Path(options.reference or engine_sidecar.get("reference_onnx") or engine_sidecar["source_onnx"])
    else:
        reference_path = Path(options.reference or (read_sidecar(target_path, required=False) or {}).get("reference_onnx") or target_path)
    ref_model = load_onnx(reference_path)
    specs, axes, parent = io_specs(reference_path, ref_model)
    del ref_model
    seq_axis = _seq_axis(specs)
    max_len = _max_len(axes, seq_axis, engine_sidecar)
    if options.chunk is not None:
        check_overlap(options.chunk, options.overlap)
    if options.chunk is not None and seq_axis and options.chunk > max_len:
        where = f"engine {target_path.name}'s largest profile" if is_engine else f"the model's axis '{seq_axis}'"
        raise UserError(f"--chunk {options.chunk} is larger than {where} ({max_len}); rebuild with larger tiers or lower --chunk.")
    max_tile = _max_tile(specs, axes, engine_sidecar)
    if options.chunk is not None and max_tile is not None and options.chunk > max_tile:
        where = f"engine {target_path.name}'s largest profile" if is_engine else "the model's image axes"
        raise UserError(f"--chunk {options.chunk} (tile size) is larger than {where} ({max_tile}); rebuild with larger tiers or lower --chunk.")

    from trtforge.calibrate.step import _tokenizer_factory

    tokenizer_factory = _tokenizer_factory(parent)
    docs = load_documents(Path(options.inputs), specs, tokenizer_factory)
    if not docs:
        raise UserError(f"{options.inputs} holds no inputs; add documents or arrays.")
    specials = _special_ids(tokenizer_factory)  # loads the tokenizer: once per run
    chunks = make_chunks(docs, specs, options.chunk, options.overlap, max_len, specials)
    batch_cap = options.batch_size
    if "batch" in axes:
        batch_cap = min(batch_cap, max(p["axes"]["batch"][2] for p in engine_sidecar["profiles"]) if engine_sidecar else axes["batch"].max)
    batches = make_batches(chunks, batch_cap, options.naive)

    reference = OrtRunner(reference_path)
    target = TrtTarget(target_path, options.backend) if is_engine else OrtTarget(target_path, options.providers)
    _check_io(target, reference, target_path, reference_path)
    progress(f"{len(docs)} inputs -> {len(chunks)} chunks -> {len(batches)} batches on {target.label}")

    # Warm-up (untimed): the first batch of every shape, `warmup` times.
    seen, warm = set(), []
    for b in batches:
        key = (len(b), tuple(v.shape for v in b[0].feeds.values()))  # a batch's shape, without stacking it
        if key not in seen:
            seen.add(key)
            warm.append(b)
    for _ in range(options.warmup):
        list(target.run_many([(None, stack(b)) for b in warm]))
    target.timings.clear()

    results: dict[int, dict[str, np.ndarray]] = {}
    start = time.perf_counter()
    merger = _Merger(docs, chunks, target.output_names[0], options)
    # Merging runs on one worker thread (numpy copies release the GIL), so it overlaps the submission
    # and inference of the next batches instead of stalling the pipeline between them.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = []
        for tag, out in target.run_many((i, stack(b)) for i, b in enumerate(batches)):
            results[tag] = out
            pending.append(pool.submit(merger.add, batches[tag], out))
        for future in pending:
            future.result()
    merged_outputs = merger.results()
    wall = time.perf_counter() - start
    if options.save_outputs:
        save = {f"{d.name}": m for d, m in zip(docs, merged_outputs) if m is not None}
        from trtforge.artifacts import atomic_path

        with atomic_path(options.save_outputs) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **save)

    # Precision error: target vs ORT fp32 on the same batches.
    ref_rows: dict[str, list[np.ndarray]] = {}
    tgt_rows: dict[str, list[np.ndarray]] = {}
    same_model = (not is_engine) and target_path.resolve() == reference_path.resolve()
    for i, b in enumerate(batches):
        ref_out = results[i] if same_model else reference.run(stack(b))
        for name in reference.output_names:
            r, t = ref_out[name], results[i][name].astype(np.float32)
            ref_rows.setdefault(name, []).append(vectors(r))
            tgt_rows.setdefault(name, []).append(vectors(t))
    precision = {name: compare(np.concatenate(ref_rows[name]), np.concatenate(tgt_rows[name])) for name in reference.output_names}

    # Merge per input, and the chunking error (ORT fp32 on both sides).
    chunk_err = _chunking_error(docs, reference, specs, options, max_len, specials)
    report = {
        "schema": SCHEMA, "trtforge_version": __version__,
        "target": str(target_path), "backend": target.label, "reference": str(reference_path),
        "chunking": {"chunk": options.chunk, "overlap": options.overlap, "merge": options.merge, "batch_size": batch_cap,
                     "max_length": max_len if max_len < 1 << 30 else None, "naive": options.naive},
        "inputs": [{"name": d.name, "kind": d.kind, "length": d.length,
                    "chunks": sum(1 for c in chunks if c.doc == i)} for i, d in enumerate(docs)],
        "batches": len(batches),
        "precision_error": {"scope": "target vs ONNX Runtime fp32 on identical chunks", "per_output": precision,
                            "worst": merge_metrics(precision)},
        "chunking_error": chunk_err,
        "latency": _latency(target.timings),
        "throughput": {"seconds": wall, "inputs_per_s": len(docs) / wall, "tokens_per_s": sum(d.length for d in docs) / wall,
                       "chunks_per_s": len(chunks) / wall},
        "memory": target.memory(),
    }
    failures = gate_failures(report, options.max_rel_l2, options.min_cosine, options.min_chunk_cosine)
    report["gates"] = {"max_rel_l2": options.max_rel_l2, "min_cosine": options.min_cosine,
                       "min_chunk_cosine": options.min_chunk_cosine, "passed": not failures, "failures": failures}
    if options.report:
        write_json_atomic(options.report, report)
    return report


class _Merger:
    """The product of a run: each input's first output merged back from its chunks, as batches arrive.

    Token outputs of text and sequence inputs stream into chunking.StreamingMerge; image tiles and
    other outputs are collected and merged once their input is complete."""

    def __init__(self, docs: list[Document], chunks: list[Chunk], name: str, options: RunOptions):
        self.docs, self.name, self.options = docs, name, options
        self.expected = [0] * len(docs)
        self.windows: dict[int, list[Window]] = {}
        for c in chunks:
            self.expected[c.doc] += 1
            self.windows.setdefault(c.doc, []).append(c.window)
        self.streams: dict[int, StreamingMerge] = {}
        self.parts: dict[int, list[tuple[Chunk, dict[str, np.ndarray]]]] = {}

    def add(self, batch: list[Chunk], out: dict[str, np.ndarray]) -> None:
        value = out[self.name]
        for j, c in enumerate(batch):
            doc = self.docs[c.doc]
            if value.ndim == 3 and doc.kind in ("text", "seq"):
                if c.doc not in self.streams:
                    self.streams[c.doc] = StreamingMerge(self.windows[c.doc], doc.length, self.options.merge)
                self.streams[c.doc].add(c.index, _strip(doc, value[j:j + 1]))
            else:
                self.parts.setdefault(c.doc, []).append((c, {self.name: value[j:j + 1]}))

    def results(self) -> list[np.ndarray | None]:
        merged: list[np.ndarray | None] = []
        for d, doc in enumerate(self.docs):
            if d in self.streams:
                merged.append(self.streams[d].result())
            elif d in self.parts:
                ordered = sorted(self.parts[d], key=lambda p: p[0].index)
                merged.append(_merge_doc(doc, ordered, self.name, self.options.merge, self.options.chunk, self.options.overlap))
            else:
                merged.append(None)
        return merged


def _latency(timings: list[tuple[str, float, float | None]]) -> dict[str, Any]:
    groups: dict[str, list[tuple[float, float | None]]] = {}
    for label, wall, gpu in timings:
        groups.setdefault(label, []).append((wall, gpu))
    out: dict[str, Any] = {"all": {"wall": latency_stats([w for _, w, _ in timings])}}
    for label, values in sorted(groups.items()):
        entry = {"wall": latency_stats([w for w, _ in values])}
        gpus = [g for _, g in values if g is not None]
        if gpus:
            entry["gpu_compute"] = latency_stats(gpus)
        out[label] = entry
    return out


def _chunking_error(docs: list[Document], reference: OrtRunner, specs: list[InputSpec], options: RunOptions,
                    max_len: int, specials: tuple[int, int]) -> dict[str, Any]:
    """Chunked+merged vs whole, both on ORT fp32; inputs longer than the model takes use their longest prefix."""
    token_rows_a, token_rows_b, pooled, scopes = [], [], [], []
    first = reference.output_names[0]
    for d, doc in enumerate(docs):
        if doc.kind == "text":
            limit = max_len - 2
            n = min(doc.length, limit)
            scopes.append("whole" if n == doc.length else f"prefix of {n} tokens")
            sub = Document(doc.name, "text", {"input_ids": doc.content["input_ids"][:n]}, n)
        elif doc.kind == "seq":
            n = min(doc.length, max_len)
            scopes.append("whole" if n == doc.length else f"prefix of {n} positions")
            sub = Document(doc.name, "seq", {k: v[:, :n] for k, v in doc.content.items()}, n)
        else:
            scopes.append("whole")
            sub = doc
        sub_chunks = make_chunks([sub], specs, options.chunk, options.overlap, max_len, specials)
        parts = [(c, reference.run(c.feeds)) for c in sub_chunks]
        merged = _merge_doc(sub, parts, first, options.merge, options.chunk, options.overlap)
        whole_feeds = text_feeds(sub.content["input_ids"], specs, *specials) if sub.kind == "text" else sub.content
        whole = reference.run(whole_feeds)[first]
        if merged is None:
            continue
        if whole.ndim == 2:  # logits: the merged result is a probability vector, so compare probabilities
            whole = merge_logits([whole[0]], [1])[None]
            merged = merged[None]
        whole = _strip(sub, whole) if whole.ndim == 3 else whole
        merged = merged if whole.ndim != 4 else merged[None]
        token_rows_a.append(vectors(whole))
        token_rows_b.append(vectors(merged))
        if whole.ndim == 2 and sub.kind != "image" and whole.shape[0] > 1:
            pooled.append(float(rowwise_cosine(whole.mean(axis=0)[None], merged.mean(axis=0)[None])[0]))
    if not token_rows_a:
        return {"scope": "not applicable to these outputs"}
    metrics = compare(np.concatenate(token_rows_a), np.concatenate(token_rows_b))
    return {"scope": "chunked+merged vs one whole pass, both ONNX Runtime fp32", "per_input_scope": scopes,
            "output": first, **metrics,
            "min_pooled_cosine": min(pooled) if pooled else None, "mean_pooled_cosine": float(np.mean(pooled)) if pooled else None}
