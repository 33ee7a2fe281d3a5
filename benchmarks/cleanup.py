"""benchmarks/cleanup.py: `trtforge clean` against onnxslim, onnxsim and `polygraphy surgeon sanitize --fold-constants`.

Each zoo model (zoo/configs/NAME.yaml, the small random-init configs; exported here unless WORK/NAME.onnx exists) is
cleaned by each tool. Per tool and model: nodes left, wall seconds (trtforge's includes its ONNX Runtime parity
proof at every checked shape; the others prove nothing), ONNX Runtime CPU latency at the axes' opt sizes (one
intra-op thread, median of --repeats runs) and the rel-L2 of the first output against the original graph's on the
same feed. A tool that cannot be imported or run is listed with the reason. Prints a table, writes JSON.

    python benchmarks/cleanup.py [--models swin bert gpt2 vit t5-encoder] [--exporter legacy] [--work out/cleanup]
    python benchmarks/cleanup.py --configs zoo/configs/full --models bert-base gpt2 vit-b16 --repeats 10
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ("swin", "bert", "gpt2", "vit", "t5-encoder")
TOOLS = ("trtforge clean", "onnxslim", "onnxsim", "polygraphy")


def export(name: str, exporter: str, work: Path, configs: Path) -> Path:
    """The zoo model's ONNX in WORK (exported once; the configs name paths relative to the repository root)."""
    path = work / f"{name}.{exporter}.onnx"
    if path.exists():
        return path
    from trtforge.core.config import apply_overrides, load_config
    from trtforge.export.step import export_model

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        cfg = apply_overrides(load_config(configs / f"{name}.yaml"), {"export.exporter": exporter})
        export_model(cfg, path)
    finally:
        os.chdir(before)
    return path


def run_trtforge(source: Path, target: Path) -> str | None:
    from trtforge.graph.index import clean_file

    result = clean_file(source, target)
    slim = result.sidecar["slim"]
    return slim.get("note") or f"parser target {result.sidecar['parser']}, parity rel-L2 {max(result.rel_l2.values()):.1e}"


def run_onnxslim(source: Path, target: Path) -> str | None:
    import onnxslim

    with contextlib.redirect_stdout(io.StringIO()):
        onnx.save(onnxslim.slim(str(source)), str(target))
    return None


def run_onnxsim(source: Path, target: Path) -> str | None:
    import onnxsim

    model, checked = onnxsim.simplify(onnx.load(str(source)))
    onnx.save(model, str(target))
    return None if checked else "onnxsim's own check failed"


def run_polygraphy(source: Path, target: Path) -> str | None:
    exe = shutil.which("polygraphy") or str(Path(sys.executable).parent / "polygraphy")
    if not Path(exe).exists():
        raise ImportError("polygraphy is not installed (pip install polygraphy)")
    proc = subprocess.run([exe, "surgeon", "sanitize", str(source), "--fold-constants", "-o", str(target)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["no message"])[-1])
    return None


RUNNERS: dict[str, Callable[[Path, Path], str | None]] = {
    "trtforge clean": run_trtforge,
    "onnxslim": run_onnxslim,
    "onnxsim": run_onnxsim,
    "polygraphy": run_polygraphy,
}


def ort_latency(path: Path, feeds: dict[str, np.ndarray], repeats: int) -> tuple[float, dict[str, np.ndarray]]:
    """Median ms of one ONNX Runtime CPU session (one intra-op thread) on `feeds`, and its outputs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in names}
    outputs = session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times)), dict(zip([o.name for o in session.get_outputs()], outputs))


def rel_l2(reference: np.ndarray, candidate: np.ndarray) -> float:
    reference, candidate = reference.astype(np.float64), candidate.astype(np.float64)
    return float(np.linalg.norm(candidate - reference) / max(np.linalg.norm(reference), 1e-300))


def measure(name: str, source: Path, work: Path, repeats: int) -> list[dict[str, Any]]:
    from trtforge.graph.index import io_specs
    from trtforge.runtime.feeds import random_feeds

    model = onnx.load(str(source))
    specs, axes, _ = io_specs(source, model)
    feeds = random_feeds(specs, {axis: rng.opt for axis, rng in axes.items()}, seed=0)
    base_ms, base_out = ort_latency(source, feeds, repeats)
    first = next(iter(base_out))
    rows = [{"model": name, "tool": "(original)", "nodes": len(model.graph.node), "seconds": 0.0, "ort_ms": base_ms, "rel_l2": 0.0}]
    for tool in TOOLS:
        target = work / "cleaned" / f"{source.stem}.{tool.split()[0]}.onnx"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        row: dict[str, Any] = {"model": name, "tool": tool}
        start = time.perf_counter()
        try:
            row["note"] = RUNNERS[tool](source, target)
        except ImportError as exc:
            row["error"] = f"not installed: {exc}"
        except Exception as exc:
            row["error"] = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        row["seconds"] = time.perf_counter() - start
        if "error" not in row:
            row["nodes"] = len(onnx.load(str(target), load_external_data=False).graph.node)
            row["ort_ms"], outputs = ort_latency(target, feeds, repeats)
            row["rel_l2"] = rel_l2(base_out[first], outputs[first]) if first in outputs else None
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'model':<12} {'tool':<15} {'nodes':>6} {'x slim':>7} {'seconds':>8} {'ORT ms':>8} {'rel-L2':>8}  note"]
    slim = {r["model"]: r.get("nodes") for r in rows if r["tool"] == "onnxslim"}
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:<12} {r['tool']:<15} {'-':>6} {'-':>7} {r['seconds']:>8.2f} {'-':>8} {'-':>8}  {r['error']}")
            continue
        ratio = f"{r['nodes'] / slim[r['model']]:.2f}" if slim.get(r["model"]) else "-"
        err = f"{r['rel_l2']:.1e}" if r.get("rel_l2") is not None else "-"
        lines.append(
            f"{r['model']:<12} {r['tool']:<15} {r['nodes']:>6} {ratio:>7} {r['seconds']:>8.2f} {r['ort_ms']:>8.3f} {err:>8}  {r.get('note') or ''}"
        )
    return "\n".join(lines)


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for package in ("trtforge", "onnxslim", "onnxsim", "polygraphy", "onnx", "onnxruntime"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="config names (CONFIGS/NAME.yaml)")
    parser.add_argument("--configs", type=Path, default=ROOT / "zoo" / "configs", help="zoo/configs/full for the published sizes")
    parser.add_argument("--exporter", default="legacy", choices=["legacy", "dynamo"])
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "cleanup", help="exports and cleaned models go here")
    parser.add_argument("--repeats", type=int, default=50, help="ONNX Runtime runs per model for the median")
    parser.add_argument("--json", type=Path, default=None, help="default: WORK/cleanup.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name in args.models:
        rows += measure(name, export(name, args.exporter, args.work, args.configs.resolve()), args.work, args.repeats)
    print(table(rows))
    out = args.json or args.work / "cleanup.json"
    record = {"configs": str(args.configs), "exporter": args.exporter, "repeats": args.repeats, "versions": versions(), "rows": rows}
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
