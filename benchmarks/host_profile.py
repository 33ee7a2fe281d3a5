"""Where `trtforge run`'s host CPU goes, function by function, on a real engine (issue 11: run wall per batch <= 1.1x
GPU time; on the H200 MiniLM's loop is bound by the Python its threads run under one GIL).

Runs `trtforge run` (the Python API, the same loop) with the loop's functions wrapped to sum each call's thread CPU
time (time.thread_time: what the calling thread ran, not what it waited for), per function over all threads, and
prints microseconds per window and per batch with the run's own figures (tokens/s, wall/GPU). The wrappers cost
~1 us per call, so the totals run a little above an unwrapped run's; compare functions with each other, and the
tokens/s with a plain run of the same engine in the same window.

    python benchmarks/host_profile.py ENGINE --config zoo/configs/full/minilm.yaml --inputs DOCS --out prof.json \
        [--runs 2] [--set plan_workers=2 --set plugin_libraries=LIB.so --set pad_batches=false]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (module, attribute path) of what the loop runs per batch or per window, by the thread that runs it
WRAPPED = [
    ("trtforge.run", "plan_document"),  # planning threads
    ("trtforge.run", "_Merger.prepare"),  # planning threads: merged outputs allocated and paged in
    ("trtforge.run", "_Merger.add_plan"),  # the planner's producer thread
    ("trtforge.runloop", "Batcher.add_many"),  # the planner's producer thread
    ("trtforge.run", "batch_parts"),  # submitting thread
    ("trtforge.backends.tensorrt_runtime", "TrtRunner._submit"),  # submitting thread (includes the next three)
    ("trtforge.backends.tensorrt_runtime", "TrtRunner._stage"),
    ("trtforge.copymerge", "CopyEngineMerge.place"),
    ("trtforge.backends.tensorrt_runtime", "TrtRunner._copy_out"),
    ("trtforge.backends.tensorrt_runtime", "TrtRunner._collect"),  # collector thread (its GPU wait spins)
    ("trtforge.run", "_Merger.add"),  # merge threads
    ("trtforge.run", "_Merger._finish"),  # merge threads (inside add)
]


def wrap_all(totals: dict[str, list[float]]) -> None:
    import importlib

    lock = threading.Lock()
    for module_name, path in WRAPPED:
        owner: object = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = getattr(owner, name)

        def wrapped(*args, __original=original, __path=path, **kwargs):
            start = time.thread_time()
            try:
                return __original(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                with lock:
                    entry = totals[__path]
                    entry[0] += spent
                    entry[1] += 1

        setattr(owner, name, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", type=Path)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--inputs", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="options", action="append", default=[], metavar="KEY=VALUE",
                    help="a further RunOptions field (ints and true/false where they parse; plugin_libraries: comma-separated)")
    args = ap.parse_args()

    from trtforge.config import load_config
    from trtforge.run import RunOptions, run

    extra = {}
    for item in args.options:
        key, _, value = item.partition("=")
        extra[key] = (value.split(",") if key == "plugin_libraries" else int(value) if value.lstrip("-").isdigit()
                      else {"true": True, "false": False}.get(value.lower(), value))
    config = load_config(args.config)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    wrap_all(totals)
    rows = []
    for i in range(args.runs):
        totals.clear()
        section = config.run
        options = RunOptions(**{"inputs": args.inputs, "chunk": section.chunk, "overlap": section.overlap,
                                "batch_size": section.batch_size, "merge": section.merge, "last_window": section.last_window,
                                "warmup": section.warmup, "precision_check": False, "chunking_check": False, **extra})
        report = run(args.engine, options)
        windows = sum(d["chunks"] for d in report["inputs"])
        batches = report["batches"]
        functions = {path: {"cpu_s": round(cpu, 6), "calls": calls, "us_per_window": round(cpu / windows * 1e6, 2),
                            "us_per_batch": round(cpu / batches * 1e6, 1)} for path, (cpu, calls) in totals.items()}
        rows.append({"run": i + 1, "windows": windows, "batches": batches,
                     "tokens_per_s": report["throughput"]["tokens_per_s"],
                     "wall_over_gpu": report["latency"]["all"].get("wall_over_gpu"),
                     "gpu_p50_ms": report["latency"]["all"]["gpu_compute"]["p50_ms"],
                     "loop_wall_s": report["runtime"]["host"]["loop_wall_s"], "stages": report["runtime"]["host"]["stages"],
                     "padding": report["runtime"].get("padding"), "functions": functions})
        print(f"run {i + 1}: {windows} windows, {batches} batches, {report['throughput']['tokens_per_s'] / 1e6:.2f}M tokens/s, "
              f"wall/GPU {rows[-1]['wall_over_gpu']}, GPU p50 {rows[-1]['gpu_p50_ms']:.3f} ms")
        print(f"  {'function':<34} {'us/window':>10} {'us/batch':>10} {'calls':>7}")
        for path, f in sorted(functions.items(), key=lambda kv: -kv[1]["cpu_s"]):
            print(f"  {path:<34} {f['us_per_window']:>10.2f} {f['us_per_batch']:>10.1f} {f['calls']:>7}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps({"engine": str(args.engine), "inputs": str(args.inputs), "options": extra,
                               "python": sys.version.split()[0], "runs": rows}, indent=1))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
