"""Host-side merge throughput of `trtforge run` (issue 11: wall per batch <= 1.1x GPU time): how long merging one
batch of outputs back into its documents takes, against the GPU time of that batch.

Two loops over the same synthetic outputs (BERT-base / MiniLM shapes: 16 windows of 256 tokens, hidden 768 / 384,
fp32, plus the pooled vector; 48 documents of ~7,000 tokens, chunk 256, overlap 32, 'center' merge):
- copy: the loop before 2026-12-01 w4: every batch copied out of the (pinned) output buffer into fresh arrays,
  then merged on one thread (what `run --reference` still does: it keeps each batch for ONNX Runtime);
- consume: merged straight out of the reused output buffer, each batch's rows split over K threads;
- prepared: consume, with every document's merged output allocated and paged in beforehand by 8 threads (what
  `run` now does on its planning threads while batches run; that time is reported apart, as prepare_ms).
Prints a table and writes JSON. No GPU needed; run it on the GPU box's host for the figure that matters there.

    python benchmarks/merge_throughput.py --out merge.json [--workers 1 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from trtforge.chunking import plan_windows
from trtforge.outputs import OutputKind
from trtforge.run import Chunk, Document, RunOptions, _Merger

MODELS = {"bert-base": 768, "minilm": 384}
GPU_MS_16x256 = {"bert-base": 2.43, "minilm": 1.38}  # H200, TensorRT 8.6 fp16 engines (conv+GELU), `run` GPU p50 (RESULTS.md, w4)


def _plan(docs: int, length: int, chunk: int, overlap: int):
    documents, chunks = [], []
    for d in range(docs):
        documents.append(Document(name=f"d{d}", kind="text", length=length))
        for i, w in enumerate(plan_windows(length, chunk - 2, overlap)):
            chunks.append(Chunk(doc=d, index=i, feeds={}, window=w, tokens=w.length, content=slice(1, 1 + w.length)))
    return documents, chunks


def measure(hidden: int, mode: str, workers: int, docs: int, length: int, batch: int) -> tuple[float, float]:
    """(ms per batch to merge every batch of the run, ms to prepare the outputs ahead); fresh buffers each time,
    as in a real run."""
    documents, chunks = _plan(docs, length, 256, 32)
    kinds = {"last_hidden_state": OutputKind("last_hidden_state", "token"), "pooler_output": OutputKind("pooler_output", "pooled")}
    templates = {"last_hidden_state": ((hidden,), np.dtype(np.float32))} if mode == "prepared" else None
    merger = _Merger(documents, chunks, kinds, RunOptions(inputs=Path(".")), templates=templates)
    batches = [chunks[i:i + batch] for i in range(0, len(chunks), batch)]
    prepare_ms = 0.0
    if templates:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=8) as planners:
            list(planners.map(merger.prepare, [[c for c in chunks if c.doc == d] for d in range(docs)]))
        prepare_ms = (time.perf_counter() - t) * 1e3
    rng = np.random.default_rng(0)
    slot = {"last_hidden_state": rng.standard_normal((batch, 256, hidden)).astype(np.float32),
            "pooler_output": rng.standard_normal((batch, hidden)).astype(np.float32)}
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        if mode == "copy":
            pending = []
            for b in batches:
                out = {k: v[:len(b)].copy() for k, v in slot.items()}  # copy_out into fresh arrays
                pending.append(pool.submit(merger.add, b, out))
            for f in pending:
                f.result()
        else:
            for b in batches:
                views = {k: v[:len(b)] for k, v in slot.items()}
                groups = [g.tolist() for g in np.array_split(np.arange(len(b)), workers) if len(g)]
                for f in [pool.submit(merger.add, b, views, g, True) for g in groups]:
                    f.result()
    merger.results()
    return (time.perf_counter() - start) * 1e3 / len(batches), prepare_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--docs", type=int, default=48)
    ap.add_argument("--length", type=int, default=7000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="median of this many passes")
    args = ap.parse_args()
    rows = []
    for model, hidden in MODELS.items():
        runs = [("copy", 1)] + [(mode, k) for mode in ("consume", "prepared") for k in args.workers]
        for mode, k in runs:
            got = [measure(hidden, mode, k, args.docs, args.length, args.batch) for _ in range(args.repeat)]
            ms, prepare_ms = float(np.median([g[0] for g in got])), float(np.median([g[1] for g in got]))
            gpu = GPU_MS_16x256[model]
            rows.append({"model": model, "hidden": hidden, "mode": mode, "workers": k, "ms_per_batch": round(ms, 3),
                         "prepare_ms": round(prepare_ms, 1), "gpu_ms_per_batch": gpu,
                         "merge_over_gpu": round(ms / gpu, 2) if gpu else None})
            print(f"{model:10s} {mode:8s} x{k}: {ms:7.2f} ms per batch" + (f"  ({ms / gpu:.2f}x the GPU's {gpu} ms)" if gpu else ""),
                  flush=True)
    print("\n| model | loop | merge threads | ms per batch | / GPU ms | prepare ms (8 threads, whole run) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['mode']} | {r['workers']} | {r['ms_per_batch']:.2f} | {r['merge_over_gpu'] or '-'} | "
              f"{r['prepare_ms'] or '-'} |")
    info = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "docs": args.docs, "length": args.length, "batch": args.batch, "rows": rows}
    args.out.write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
