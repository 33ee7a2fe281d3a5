"""benchmarks/ray_scaling.py: `trtforge run` throughput in one process vs on Ray with 1 and N actors.

A corpus of >= --min-tokens tokens is made by repeating the shipped long documents (one file per copy,
in a temp dir), then the same `run` (engine or ONNX) goes through:
  single   run.run in this process (the baseline)
  ray x1   run --ray with one actor (Ray's cost on top of one device)
  ray xN   run --ray with N actors (N = the GPUs Ray sees for an engine, or --actors)
reporting tokens/s on the inference clock (warm-up and the precision/chunking checks excluded, as in
`run`), the ratio to one actor (the aim on two GPUs: >= 1.8), and whether the errors agree.
Prints a table, writes JSON.

    python benchmarks/ray_scaling.py TARGET [--reference REF.onnx] [--min-tokens 200000] [--actors N]
        [--chunk 256 --overlap 32 --batch-size 16] [--json out/ray_scaling.json]

Ray unpacked from a wheel with Python's zipfile loses the exec bits of its two binaries
(ray/core/src/ray/gcs/gcs_server and ray/core/src/ray/raylet/raylet in Ray 2.60): fix_exec_bits() sets
them back (it prints what it changed) before the local cluster starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def fix_exec_bits() -> list[str]:
    """chmod +x every ELF executable (not a shared library) under ray/core that lacks its exec bit."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.origin:
        raise SystemExit("ray is not importable; install it (pip install 'trtforge[ray]') or put its unpacked wheel on PYTHONPATH.")
    core = Path(spec.origin).parent / "core"
    fixed = []
    for path in core.rglob("*"):
        if not path.is_file() or path.suffix == ".so" or ".so." in path.name:
            continue
        with open(path, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
        mode = path.stat().st_mode
        if not mode & stat.S_IXUSR:
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            fixed.append(str(path.relative_to(core.parent)))
    return fixed


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def make_corpus(source: Path, reference: Path, min_tokens: int, into: Path) -> tuple[int, int]:
    """Copies of the .txt documents in `source` until >= min_tokens tokens (the model's tokenizer)."""
    from trtforge.runtime.tokenize import TextTokenizer, find_tokenizer_dir

    directory = find_tokenizer_dir(reference)
    if directory is None:
        raise SystemExit(f"no tokenizer found for {reference}; export the model with trtforge first.")
    tokenizer = TextTokenizer(directory)
    files = sorted(source.glob("*.txt"))
    per_pass = sum(int(tokenizer.document(f.read_text()).size) for f in files)
    copies = max(1, math.ceil(min_tokens / per_pass))
    for k in range(copies):
        for f in files:
            shutil.copyfile(f, into / f"{k:03d}_{f.name}")
    return per_pass * copies, copies * len(files)


def summary(report: dict, total_s: float) -> dict:
    return {
        "tokens_per_s": report["throughput"]["tokens_per_s"],
        "seconds": report["throughput"]["seconds"],
        "total_s": total_s,
        "batches": report["batches"],
        "backend": report["backend"],
        "precision_worst": report["precision_error"].get("worst"),
        "chunking_worst": report["chunking_error"].get("worst"),
        "workers": [
            {k: w[k] for k in ("worker", "host", "devices", "documents", "chunks", "tokens_per_s", "busy_s")}
            for w in report.get("workers", [])
        ],
        "latency_p50_ms": report["latency"]["all"]["wall"].get("p50_ms"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="engine or ONNX")
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--docs", type=Path, default=ROOT / "calib_data/minilm_long")
    parser.add_argument("--min-tokens", type=int, default=200_000)
    parser.add_argument("--actors", type=int, help="N for the 'ray xN' row (default: Ray's GPUs for an engine, CPUs for an ONNX)")
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--overlap", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--json", type=Path, default=ROOT / "out/ray_scaling.json")
    args = parser.parse_args()

    fixed = fix_exec_bits()
    print(f"ray binaries made executable: {', '.join(fixed) if fixed else 'none needed'}", flush=True)
    import ray

    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run
    from trtforge.scaleout.ray_run import RayOptions, run_ray

    is_engine = args.target.suffix != ".onnx"
    reference = args.reference or args.target
    if is_engine and args.reference is None:
        from trtforge.build.engine_record import read_engine_sidecar

        side = read_engine_sidecar(args.target)
        reference = Path(side.get("reference_onnx") or side["source_onnx"])
    gpus = gpu_count()
    ray.init(
        include_dashboard=False,
        logging_level="WARNING",
        num_gpus=gpus,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}},
    )
    resources = ray.cluster_resources()
    n = args.actors or (int(resources.get("GPU", 0)) if is_engine else int(resources.get("CPU", 1)))
    print(f"Ray: {resources.get('CPU', 0):.0f} CPUs, {resources.get('GPU', 0):.0f} GPUs (nvidia-smi: {gpus}); N = {n}", flush=True)

    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tokens, docs = make_corpus(args.docs, reference, args.min_tokens, Path(tmp))
        print(f"corpus: {docs} documents, {tokens} tokens", flush=True)
        options = RunOptions(
            inputs=Path(tmp),
            chunk=args.chunk,
            overlap=args.overlap,
            batch_size=args.batch_size,
            warmup=2,
            reference=args.reference,
            min_cosine=-1.0,
            max_rel_l2=1e9,
        )
        plan = [] if args.skip_single else [("single", None)]
        plan += [("ray x1", 1)] + ([(f"ray x{n}", n)] if n > 1 else [])
        for name, actors in plan:
            start = time.perf_counter()
            try:
                report = run(args.target, options) if actors is None else run_ray(args.target, options, RayOptions("auto", actors=actors))
                rows[name] = summary(report, time.perf_counter() - start)
            except Exception as exc:  # record and go on: the other rows still mean something
                rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            print(f"{name}: {rows[name].get('tokens_per_s', rows[name].get('error'))}", flush=True)
    ray.shutdown()

    one = rows.get("ray x1", {}).get("tokens_per_s")
    print(f"\n{'run':<10} {'tokens/s':>12} {'x ray x1':>9} {'infer s':>9} {'total s':>9} {'p50 ms':>8}  precision worst rel-L2")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<10} error: {r['error']}")
            continue
        ratio = r["tokens_per_s"] / one if one else float("nan")
        rel = (r["precision_worst"] or {}).get("rel_l2")
        print(
            f"{name:<10} {r['tokens_per_s']:>12.0f} {ratio:>9.2f} {r['seconds']:>9.2f} {r['total_s']:>9.1f} "
            f"{(r['latency_p50_ms'] or 0):>8.2f}  {rel if rel is not None else 'not measured'}"
        )
        r["ratio_to_ray_x1"] = ratio
    out = {
        "target": str(args.target),
        "reference": str(reference),
        "tokens": tokens,
        "documents": docs,
        "gpus": gpus,
        "actors": n,
        "chunk": args.chunk,
        "overlap": args.overlap,
        "batch_size": args.batch_size,
        "ray_binaries_fixed": fixed,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
