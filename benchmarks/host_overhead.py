"""What `trtforge run` costs the host per batch on an ENGINE when the GPU costs nothing (`run` aims at a wall time per
batch <= 1.1x its GPU time; a host-bound loop shows `wait_gpu` ~0 s).

The real `run` loop (planning threads, pinned staging, CUDA-graph capture and replay, the submitting and
collecting threads, the merge) drives a real TensorRT-RTX engine file through the fake CUDA of
tests/test_runloop.py, with a kernel and device copies that do nothing. So the loop's wall time per batch is its
host overhead: what the GPU must outlast for the loop to keep it busy. Not a GPU figure: the fake driver's calls
are Python functions (~1 us, the real ones are ~2-5 us), and this machine's core count shapes the thread
contention. Compare settings on one machine; a GPU machine may have 16 CPUs.

    python benchmarks/host_overhead.py out/minilm.clean.onnx --docs calib_data/minilm_long --repeat 4 --out host.json \
        [--tokenizer out/minilm.tokenizer]   # pre-tokenized input: the loop without the tokenizer
        [--plan-processes 0 2]               # planning threads against worker processes (loop CPU: this process's only)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _null_engine(onnx_path: Path, engine_path: Path) -> None:
    """Patch trtforge so that TrtTarget loads `engine_path` and executes nothing (test fakes, no GPU)."""
    import pytest
    from test_run_engine_emulated import NullEngine, _emulate

    emulated = _emulate(pytest.MonkeyPatch(), onnx_path, engine_path, NullEngine)
    emulated["cudart"].cudaMemcpyAsync = lambda dst, src, n, kind, stream: (0,)  # DMA: not the host's time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("onnx", type=Path, help="a cleaned ONNX (MiniLM: out/minilm.clean.onnx from `make demo`)")
    ap.add_argument("--docs", type=Path, default=ROOT / "calib_data" / "minilm_long")
    ap.add_argument("--repeat", type=int, default=4, help="the documents, this many times")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per setting (median)")
    ap.add_argument("--merge-workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--plan-workers", type=int, default=None)
    ap.add_argument(
        "--plan-processes",
        type=int,
        nargs="+",
        default=[0],
        help="worker processes planning the text inputs (0: the planning threads); each a setting of its own",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        default=["copy-engine", "host"],
        choices=["copy-engine", "host"],
        help="token outputs merged by the GPU's copy engine (--copy-engine-merge) or on the host",
    )
    ap.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="pre-tokenize the documents with this tokenizer first (a .jsonl input: the loop without tokenizing)",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from trtforge.build.step import build
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    work = Path(tempfile.mkdtemp(prefix="trtforge-host-"))
    engine = build(args.onnx, work / "m.engine", "fp32", "seq=256", backend="tensorrt_rtx").engine_path
    docs = work / "docs"
    docs.mkdir()
    for k in range(args.repeat):
        for f in sorted(args.docs.glob("*.txt")):
            (docs / f"{k}_{f.name}").write_text(f.read_text())
    if args.tokenizer:
        import subprocess

        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "gpu" / "pretokenize.py"), str(docs), str(args.tokenizer), str(work / "docs.jsonl")],
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
        )
        docs = work / "docs.jsonl"
    _null_engine(args.onnx, engine)
    rows = []
    settings = [(w, m, pp) for m in args.merge for w in args.merge_workers for pp in args.plan_processes]
    for workers, merge, processes in settings:
        reports = [
            run(
                engine,
                RunOptions(
                    inputs=docs,
                    chunk=256,
                    overlap=32,
                    batch_size=16,
                    precision_check=False,
                    chunking_check=False,
                    merge_workers=workers,
                    plan_workers=args.plan_workers,
                    warmup=1,
                    copy_engine_merge=merge == "copy-engine",
                    plan_processes=processes,
                ),
            )
            for _ in range(args.runs)
        ]
        loop = statistics.median(r["runtime"]["host"]["loop_wall_s"] for r in reports)
        cpu = statistics.median(r["runtime"]["host"]["loop_cpu_s"] for r in reports)
        batches = reports[0]["batches"]
        windows = sum(i["chunks"] for i in reports[0]["inputs"])
        rows.append(
            {
                "merge": merge,
                "merge_workers": workers,
                "plan_processes": processes,
                "batches": batches,
                "windows": windows,
                "loop_s": loop,
                "host_ms_per_batch": loop / batches * 1e3,
                "loop_cpu_s": cpu,
                "cpu_us_per_window": cpu / windows * 1e6,
                "tokens_per_s": statistics.median(r["throughput"]["tokens_per_s"] for r in reports),
                "stages": reports[0]["runtime"]["host"]["stages"],
            }
        )
    print(
        f"{args.repeat} x {args.docs}{' (pre-tokenized)' if args.tokenizer else ''}, {os.cpu_count()} CPUs ({platform.node()}); null kernel, median of {args.runs}"
    )
    print(
        f"{'merge':>12}{'merge workers':>14}{'plan procs':>11}{'batches':>9}{'host ms/batch':>15}{'loop CPU us/window':>20}{'tokens/s':>12}"
    )
    for r in rows:
        print(
            f"{r['merge']:>12}{r['merge_workers']:>14}{r['plan_processes']:>11}{r['batches']:>9}{r['host_ms_per_batch']:>15.3f}"
            f"{r['cpu_us_per_window']:>20.1f}{r['tokens_per_s']:>12,.0f}"
        )
    args.out.write_text(json.dumps({"cpus": os.cpu_count(), "onnx": str(args.onnx), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
