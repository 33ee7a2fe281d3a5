"""Engines with and without the attention pass, side by side on the GPU: accuracy against ONNX
Runtime fp32 on the ORIGINAL graph, GPU ms per batch, and which layers the engine runs (plugin layers, and
how TensorRT grouped LayerNorm and GELU: the evidence for or against skip-LayerNorm / bias+GELU passes).

Runs under TensorRT 8.6's Python ($PY310: numpy, onnxruntime, cuda.bindings; no torch):
    $PY310 benchmarks/gpu/attention_compare.py --reference M.clean.onnx --engine fused=M.fused.engine \\
        --engine unfused=M.fp16.engine --check 2x128,2x512 --time 16x128,16x512,64x512 --json out.json
Shapes are BATCHxSEQ (or BATCH for models whose only dynamic axis is the batch). Inputs are random within
each input's declared range, attention masks all ones (the fused engines are unmasked). Timing: 10 warm-up
runs, then the mean of 50 back-to-back executions between two CUDA events. Every engine and shape records
its error and the script goes on.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trtforge.backends.cuda_memory import DeviceBuffer, cuda_check, cuda_handle, cuda_runtime  # noqa: E402
from trtforge.backends.onnxruntime import OrtRunner  # noqa: E402
from trtforge.core.onnxio import load_onnx  # noqa: E402
from trtforge.graph.index import io_specs  # noqa: E402
from trtforge.runtime.feeds import random_feeds  # noqa: E402

FUSED_WORDS = re.compile(r"qkv_to_context|CustomQKV|fmha|mha|flash|attention", re.I)
NORM_WORDS = re.compile(r"LayerNorm|LayerNormalization|Erf|gelu|intermediate", re.I)


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in part.split("x")) for part in text.split(",") if part.strip()]


def sizes_for(axes: dict, shape: tuple[int, ...]) -> dict[str, int]:
    sizes = {name: rng.opt for name, rng in axes.items()}
    if "batch" in sizes:
        sizes["batch"] = shape[0]
    seq = next((a for a in axes if a != "batch"), None)
    if len(shape) > 1 and seq is not None:
        sizes[seq] = shape[1]
    return sizes


class Engine:
    """A bare TensorRT 8.6 executor (independent of trtforge's run loop, which another change is reworking)."""

    def __init__(self, trt, path: Path):
        self.trt = trt
        logger = trt.Logger(trt.Logger.ERROR)
        trt.init_libnvinfer_plugins(logger, "")
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {path}")
        self.sidecar = json.loads(Path(str(path) + ".json").read_text())
        self.path = path
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.stream = cuda_check(cuda_runtime().cudaStreamCreate())
        self.contexts: dict[int, object] = {}

    def profile_for(self, feeds: dict[str, np.ndarray]) -> int:
        for p in self.sidecar["profiles"]:
            shapes = p["shapes"]
            if all(
                all(lo <= d <= hi for d, lo, hi in zip(feeds[n].shape, shapes[n]["min"], shapes[n]["max"]))
                for n in self.inputs
                if n in shapes
            ):
                return p["index"]
        raise ValueError(f"no profile of {self.path.name} admits { ({n: feeds[n].shape for n in self.inputs}) }")

    def bind(self, feeds: dict[str, np.ndarray]):
        cudart = cuda_runtime()
        index = self.profile_for(feeds)
        if index not in self.contexts:
            ctx = self.engine.create_execution_context()
            ctx.set_optimization_profile_async(index, cuda_handle(self.stream))
            cuda_check(cudart.cudaStreamSynchronize(self.stream))
            self.contexts[index] = ctx
        ctx = self.contexts[index]
        buffers = {}
        for name in self.inputs:
            host = np.ascontiguousarray(feeds[name].astype(self.dtypes[name]))
            buf = DeviceBuffer(max(host.nbytes, 1))
            cuda_check(cudart.cudaMemcpy(buf.ptr, host.ctypes.data, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            ctx.set_input_shape(name, host.shape)
            ctx.set_tensor_address(name, buf.ptr)
            buffers[name] = buf
        shapes = {}
        for name in self.outputs:
            shapes[name] = tuple(ctx.get_tensor_shape(name))
            buf = DeviceBuffer(max(int(np.prod(shapes[name])) * self.dtypes[name].itemsize, 1))
            ctx.set_tensor_address(name, buf.ptr)
            buffers[name] = buf
        return ctx, buffers, shapes

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart = cuda_runtime()
        ctx, buffers, shapes = self.bind(feeds)
        if not ctx.execute_async_v3(cuda_handle(self.stream)):
            raise RuntimeError("execute_async_v3 failed")
        cuda_check(cudart.cudaStreamSynchronize(self.stream))
        out = {}
        for name, shape in shapes.items():
            host = np.empty(shape, self.dtypes[name])
            cuda_check(cudart.cudaMemcpy(host.ctypes.data, buffers[name].ptr, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
            out[name] = host
        for buf in buffers.values():
            buf.free()
        return out

    def time_ms(self, feeds: dict[str, np.ndarray], warmup: int = 10, iters: int = 50) -> float:
        cudart = cuda_runtime()
        ctx, buffers, _ = self.bind(feeds)
        for _ in range(warmup):
            ctx.execute_async_v3(cuda_handle(self.stream))
        start, end = cuda_check(cudart.cudaEventCreate()), cuda_check(cudart.cudaEventCreate())
        cuda_check(cudart.cudaEventRecord(start, self.stream))
        for _ in range(iters):
            ctx.execute_async_v3(cuda_handle(self.stream))
        cuda_check(cudart.cudaEventRecord(end, self.stream))
        cuda_check(cudart.cudaEventSynchronize(end))
        ms = float(cuda_check(cudart.cudaEventElapsedTime(start, end))) / iters
        for buf in buffers.values():
            buf.free()
        return ms

    def layers(self) -> dict:
        """From the build's layers file (trtforge build writes ENGINE.layers.json): plugin / attention layers,
        Myelin groups, and the layers whose names show how LayerNorm and GELU were grouped."""
        name = self.sidecar.get("layer_info")
        if not name:
            return {"unavailable": self.sidecar.get("layer_info_unavailable")}
        layers = json.loads((self.path.parent / name).read_text()).get("layers") or []
        as_pairs = [
            (str(l.get("Name", l)) if isinstance(l, dict) else str(l), str(l.get("LayerType", "")) if isinstance(l, dict) else "")
            for l in layers
        ]
        return {
            "count": len(as_pairs),
            "plugin_or_attention": [f"{t}: {n[:160]}" for n, t in as_pairs if "plugin" in t.lower() or FUSED_WORDS.search(n)],
            "myelin": sum("foreign" in (n + t).lower() or "myelin" in t.lower() for n, t in as_pairs),
            "norm_and_gelu": [f"{t}: {n[:160]}" for n, t in as_pairs if NORM_WORDS.search(n)][:40],
            "by_type": self.sidecar.get("layer_summary", {}).get("by_type"),
        }


def compare(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    out = {}
    for name, ref in expected.items():
        if name not in got:
            continue
        a, b = got[name].astype(np.float64).reshape(-1), ref.astype(np.float64).reshape(-1)
        rows_a, rows_b = got[name].astype(np.float64).reshape(-1, ref.shape[-1]), ref.astype(np.float64).reshape(-1, ref.shape[-1])
        row_cos = (rows_a * rows_b).sum(1) / np.maximum(np.linalg.norm(rows_a, axis=1) * np.linalg.norm(rows_b, axis=1), 1e-30)
        out[name] = {
            "rel_l2": float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)),
            "cosine": float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30)),
            "min_row_cosine": float(row_cos.min()),
            "finite": bool(np.isfinite(a).all()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", type=Path, required=True, help="the ORIGINAL (clean) ONNX, run by ORT fp32")
    parser.add_argument("--engine", action="append", default=[], help="LABEL=PATH (repeatable)")
    parser.add_argument("--check", default="2x128", help="shapes checked against ORT")
    parser.add_argument("--time", default="", help="shapes timed")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    trt = __import__("tensorrt") if args.engine else None

    model = load_onnx(args.reference)
    specs, axes, _ = io_specs(args.reference, model)
    del model
    ort = OrtRunner(args.reference, threads=8)
    result: dict = {"reference": str(args.reference), "tensorrt": trt.__version__ if trt else None, "engines": {}}

    def save():
        args.json.write_text(json.dumps(result, indent=1, default=str))

    checks = [(shape, random_feeds(specs, sizes_for(axes, shape), seed=11)) for shape in parse_shapes(args.check)]
    expected = {}
    for shape, feeds in checks:
        try:
            expected[shape] = ort.run(feeds)
        except Exception as exc:
            result.setdefault("errors", []).append(f"ORT at {shape}: {exc}")
    for spec in args.engine:
        label, _, path = spec.partition("=")
        entry = result["engines"].setdefault(label, {"path": path, "accuracy": {}, "gpu_ms": {}, "errors": []})
        try:
            engine = Engine(trt, Path(path))
            entry["attention_fusion"] = {k: v for k, v in (engine.sidecar.get("attention_fusion") or {}).items() if k != "refused"}
            entry["refused"] = sorted({r["reason"] for r in (engine.sidecar.get("attention_fusion") or {}).get("refused") or []})
            entry["layers"] = engine.layers()
        except Exception as exc:
            entry["errors"].append(f"load: {type(exc).__name__}: {exc}")
            entry["trace"] = traceback.format_exc()[-1200:]
            save()
            continue
        for shape, feeds in checks:
            key = "x".join(map(str, shape))
            try:
                entry["accuracy"][key] = compare(expected[shape], engine.run(feeds))
            except Exception as exc:
                entry["errors"].append(f"check {key}: {type(exc).__name__}: {exc}")
            save()
        for shape in parse_shapes(args.time):
            key = "x".join(map(str, shape))
            try:
                entry["gpu_ms"][key] = round(engine.time_ms(random_feeds(specs, sizes_for(axes, shape), seed=1)), 4)
            except Exception as exc:
                entry["errors"].append(f"time {key}: {type(exc).__name__}: {exc}")
            save()
        print(json.dumps({label: {k: entry[k] for k in ("accuracy", "gpu_ms", "errors")}}, default=str), flush=True)
    save()
    print(f"\n{args.reference.name}")
    print("| engine | replaced | shape | output | rel-L2 | cosine | min row cos |")
    print("|---|---|---|---|---|---|---|")
    for label, e in result["engines"].items():
        n = len((e.get("attention_fusion") or {}).get("replaced") or [])
        for shape, outs in e["accuracy"].items():
            for out, m in outs.items():
                print(f"| {label} | {n} | {shape} | {out} | {m['rel_l2']:.2e} | {m['cosine']:.6f} | {m['min_row_cosine']:.5f} |")
    if args.time:
        print("\n| engine | " + " | ".join(f"{s} ms" for s in args.time.split(",")) + " |")
        print("|---|" + "---|" * len(args.time.split(",")))
        for label, e in result["engines"].items():
            print(f"| {label} | " + " | ".join(str(e["gpu_ms"].get(s, "-")) for s in args.time.split(",")) + " |")


if __name__ == "__main__":
    main()
