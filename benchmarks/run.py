"""benchmarks/run.py: what chunked batching buys, and what trtforge's orchestration costs.

(a) batched pipeline vs the naive loop (one chunk per execute), same documents, chunk and overlap:
    throughput ratio (target >= 3x).
(b) orchestration overhead: end-to-end throughput (chunk, batch, run, merge) over bare backend
    throughput on the very same pre-stacked batches (target >= 0.90).
Works on an ONNX (ONNX Runtime) or an engine (TensorRT). Prints a table, writes JSON.

    python benchmarks/run.py TARGET --inputs DOCS.jsonl|folder --chunk 512 --overlap 64 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trtforge.runtime.options import RunOptions  # noqa: E402
from trtforge.runtime.planning import make_batches, stack  # noqa: E402
from trtforge.runtime.step import run  # noqa: E402


def bare_throughput(target_path: Path, options: RunOptions, repeats: int = 3) -> tuple[float, int]:
    """Chunks/s of the backend alone on pre-stacked batches (no chunking, merging or checks)."""
    import trtforge.runtime.step as R

    p = R.prepare(target_path, options)
    batches = [stack(b) for b in make_batches(p.chunks, p.batch_cap, options.naive)]
    target = R.TrtTarget(p.target_path, options.backend) if p.is_engine else R.OrtTarget(p.target_path, options.providers)
    list(target.run_many([(None, b) for b in batches[:2]]))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        list(target.run_many([(i, b) for i, b in enumerate(batches)]))
        best = min(best, time.perf_counter() - start)
    return len(p.chunks) / best, len(p.chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--overlap", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("out/bench/run_results.json"))
    args = parser.parse_args()

    common = dict(
        inputs=args.inputs,
        chunk=args.chunk,
        overlap=args.overlap,
        batch_size=args.batch_size,
        reference=args.reference,
        warmup=1,
        min_cosine=-1.0,
        max_rel_l2=1e9,
    )
    batched, naive = [], []
    for _ in range(args.repeats):
        batched.append(run(args.target, RunOptions(**common))["throughput"])
        naive.append(run(args.target, RunOptions(**common, naive=True))["throughput"])
    best = lambda xs, k: max(x[k] for x in xs)  # noqa: E731
    bare_chunks_per_s, n_chunks = bare_throughput(args.target, RunOptions(**common), args.repeats)
    e2e_chunks_per_s = best(batched, "chunks_per_s")
    result = {
        "target": str(args.target),
        "inputs": str(args.inputs),
        "chunk": args.chunk,
        "overlap": args.overlap,
        "batch_size": args.batch_size,
        "chunks": n_chunks,
        "batched_tokens_per_s": best(batched, "tokens_per_s"),
        "naive_tokens_per_s": best(naive, "tokens_per_s"),
        "a_batched_over_naive": best(batched, "tokens_per_s") / best(naive, "tokens_per_s"),
        "end_to_end_chunks_per_s": e2e_chunks_per_s,
        "bare_chunks_per_s": bare_chunks_per_s,
        "b_end_to_end_over_bare": e2e_chunks_per_s / bare_chunks_per_s,
    }
    rows = [
        ("batched tokens/s", result["batched_tokens_per_s"]),
        ("naive tokens/s", result["naive_tokens_per_s"]),
        ("(a) batched / naive (target >= 3)", result["a_batched_over_naive"]),
        ("end-to-end chunks/s", e2e_chunks_per_s),
        ("bare backend chunks/s", bare_chunks_per_s),
        ("(b) end-to-end / bare (target >= 0.90)", result["b_end_to_end_over_bare"]),
    ]
    print(f"{args.target.name}, {n_chunks} chunks of {args.chunk} (overlap {args.overlap}), batch {args.batch_size}")
    for label, value in rows:
        print(f"{label:42s} {value:12.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
