"""Where an INT8 transformer engine spends its GPU time on TensorRT 8.6, kernel by kernel.

Every variant is built with the same single profile (batch 1..64, seq 1..512, opt 16x128) so that only
the graph differs; `ncu` (Nsight Compute) lists each kernel of one execution with its
duration, which says whether the GEMMs ran int8 (i8/imma kernels) and what the Q/DQ cost around them.

    python3 benchmarks/gpu/int8_probe.py variants CLEAN.onnx INT8.onnx OUTDIR     (numpy/onnx/ORT side)
    $PY310  benchmarks/gpu/int8_probe.py build VARIANT.onnx ENGINE [--int8] [--fp16]
    $PY310  benchmarks/gpu/int8_probe.py time ENGINE CLEAN.onnx --json OUT.json
    ncu --profile-from-start off ... $PY310 benchmarks/gpu/int8_probe.py once ENGINE 16x128   (images: 16x224)
    python3 benchmarks/gpu/int8_probe.py kernels NCU.csv [--json OUT.json]

Variants: fp16 (trtforge's fp16 conversion of the clean ONNX), best (trtforge build --precision best: Q/DQ
and their GEMMs fp32 islands in an fp16 graph), best_cast (the GEMMs fp16 too, behind a Cast after each
DequantizeLinear), best_mm_epilogue (best, with each INT8 MatMul's epilogue kept fp32 up to the next
QuantizeLinear, as `best` does for convolutions), int8flags (the Q/DQ ONNX as it is, INT8 + FP16 flags).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = ((16, 128), (16, 512), (64, 512))
VOCAB = (1000, 30000)


def variants(clean: str, int8: str, out: str) -> None:
    import onnx

    from trtforge.build import precision
    from trtforge.core.onnxio import load_onnx, save_onnx

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    feeds = [
        {"input_ids": rng.integers(*VOCAB, size=(4, 128)).astype(np.int64), "attention_mask": np.ones((4, 128), np.int64)} for _ in range(4)
    ]
    model = load_onnx(Path(clean))
    fp16, rep = precision.convert_fp16(model, feeds)
    save_onnx(fp16, outdir / "fp16.onnx")
    qdq = load_onnx(Path(int8))
    best, rep_best = precision.convert_fp16(qdq, feeds)
    save_onnx(best, outdir / "best.onnx")
    original = precision.nodes_to_keep_fp32

    def without_gemm_islands(*args, **kwargs):
        keep = original(*args, **kwargs)
        return {k: v for k, v in keep.items() if not v.startswith("reads an fp32 DequantizeLinear")}

    precision.nodes_to_keep_fp32 = without_gemm_islands
    try:
        cast, rep_cast = precision.convert_fp16(qdq, feeds)
    finally:
        precision.nodes_to_keep_fp32 = original
    save_onnx(cast, outdir / "best_cast.onnx")
    # best_mm_epilogue: the convolution-epilogue rule applied to INT8 MatMuls too (bias Add, GELU, residual Add
    # stay fp32 up to the next QuantizeLinear): whether Myelin then fuses the requantization into the GEMM.
    saved = precision.CONV_OPS, precision.CONV_EPILOGUE_OPS
    precision.CONV_OPS = saved[0] + ("MatMul", "Gemm")
    precision.CONV_EPILOGUE_OPS = saved[1] + ("Div", "Erf", "Tanh", "Pow")
    try:
        mm_epilogue, rep_mm = precision.convert_fp16(qdq, feeds)
    finally:
        precision.CONV_OPS, precision.CONV_EPILOGUE_OPS = saved
    save_onnx(mm_epilogue, outdir / "best_mm_epilogue.onnx")
    onnx.save(qdq, str(outdir / "int8flags.onnx"), save_as_external_data=True, location="int8flags.onnx.data")
    print(
        json.dumps(
            {
                "fp16_kept": len(rep.kept_fp32),
                "best_kept": len(rep_best.kept_fp32),
                "best_cast_kept": len(rep_cast.kept_fp32),
                "best_mm_epilogue_kept": len(rep_mm.kept_fp32),
            }
        )
    )


def build(onnx_path: str, engine: str, int8: bool, fp16: bool) -> None:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx_path):
        raise SystemExit("parse failed: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    for flag, on in (("INT8", int8), ("FP16", fp16)):
        if on:
            config.set_flag(getattr(trt.BuilderFlag, flag))
    off = sum(1 << int(getattr(trt.TacticSource, n)) for n in ("CUBLAS", "CUBLAS_LT", "CUDNN") if hasattr(trt.TacticSource, n))
    config.set_tactic_sources(config.get_tactic_sources() & ~off)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        profile.set_shape(name, (1, 1), (16, 128), (64, 512))
    config.add_optimization_profile(profile)
    start = time.perf_counter()
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise SystemExit("build failed")
    Path(engine).write_bytes(bytes(blob))
    print(json.dumps({"engine": engine, "build_s": round(time.perf_counter() - start, 1), "mb": round(blob.nbytes / 2**20, 1)}))


class Engine:
    def __init__(self, path: str):
        import tensorrt as trt

        from trtforge.backends.cuda_memory import cuda_check, cuda_runtime

        self.trt, self.cudart, self.cuda_check = trt, cuda_runtime(), cuda_check
        from trtforge.backends.plugin_libraries import load_engine_plugin_libraries
        from trtforge.backends.tensorrt import load_trt
        from trtforge.core.artifacts import read_sidecar

        logger = trt.Logger(trt.Logger.WARNING)
        trt.init_libnvinfer_plugins(logger, "")
        side = read_sidecar(Path(path), required=False) or {}
        load_engine_plugin_libraries(load_trt("tensorrt"), side, path)  # trtforge's plugin layers
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(Path(path).read_bytes())
        self.context = self.engine.create_execution_context()
        self.stream = cuda_check(self.cudart.cudaStreamCreate())
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.buffers: dict[str, int] = {}
        size = 64 * 512 * 768 * 4 * 2
        for n in self.names:
            self.buffers[n] = cuda_check(self.cudart.cudaMalloc(size))

    def set(self, b: int, s: int, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == self.trt.TensorIOMode.INPUT]
        feeds = {"input_ids": rng.integers(*VOCAB, size=(b, s)).astype(np.int64), "attention_mask": np.ones((b, s), np.int64)}
        for n in inputs:  # an image input [N, C, H, W]: "16x224" means 16 images of 224x224
            dims = tuple(self.engine.get_tensor_shape(n))
            if len(dims) == 4:
                feeds[n] = rng.standard_normal((b, dims[1], s, s)).astype(np.float32)
        for k in range(self.engine.num_optimization_profiles):  # the first profile that admits (b, s)
            ranges = [self.engine.get_tensor_profile_shape(n, k) for n in inputs]
            if all(lo[0] <= b <= hi[0] and lo[-1] <= s <= hi[-1] for lo, _opt, hi in ranges):
                from trtforge.backends.cuda_memory import cuda_handle

                self.context.set_optimization_profile_async(k, cuda_handle(self.stream))
                break
        for n in self.names:
            if self.engine.get_tensor_mode(n) == self.trt.TensorIOMode.INPUT:
                host = np.ascontiguousarray(feeds[n].astype(self.trt.nptype(self.engine.get_tensor_dtype(n))))
                self.context.set_input_shape(n, host.shape)
                self.cuda_check(
                    self.cudart.cudaMemcpy(
                        self.buffers[n], host.ctypes.data, host.nbytes, self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
                    )
                )
            self.context.set_tensor_address(n, self.buffers[n])
        return feeds

    def execute(self) -> None:
        from trtforge.backends.cuda_memory import cuda_handle

        self.context.execute_async_v3(cuda_handle(self.stream))

    def output(self, name: str) -> np.ndarray:
        shape = tuple(self.context.get_tensor_shape(name))
        host = np.empty(shape, dtype=self.trt.nptype(self.engine.get_tensor_dtype(name)))
        self.cuda_check(self.cudart.cudaStreamSynchronize(self.stream))
        self.cuda_check(
            self.cudart.cudaMemcpy(host.ctypes.data, self.buffers[name], host.nbytes, self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        )
        return host.astype(np.float32)

    def time_ms(self, iters: int = 50) -> float:
        c, ok = self.cudart, self.cuda_check
        for _ in range(5):
            self.execute()
        times = []
        for _ in range(5):
            start, end = ok(c.cudaEventCreate()), ok(c.cudaEventCreate())
            ok(c.cudaEventRecord(start, self.stream))
            for _ in range(iters // 5):
                self.execute()
            ok(c.cudaEventRecord(end, self.stream))
            ok(c.cudaEventSynchronize(end))
            times.append(ok(c.cudaEventElapsedTime(start, end)) / (iters // 5))
        return float(np.median(times))


def time_engine(engine: str, clean: str, out: str) -> None:
    import onnxruntime as ort

    e = Engine(engine)
    result: dict = {"engine": engine, "ms": {}}
    for b, s in SHAPES:
        e.set(b, s)
        result["ms"][f"{b}x{s}"] = round(e.time_ms(), 4)
    sess = ort.InferenceSession(clean, providers=["CPUExecutionProvider"])
    cos, rel = [], []
    for seed in range(3):
        feeds = e.set(8, 128, seed=100 + seed)
        e.execute()
        got = e.output("last_hidden_state")
        ref = sess.run(["last_hidden_state"], feeds)[0]
        pg, pr = got.mean(1), ref.mean(1)
        cos += list((pg * pr).sum(1) / (np.linalg.norm(pg, axis=1) * np.linalg.norm(pr, axis=1)))
        rel.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
    result.update(pooled_cosine_mean=float(np.mean(cos)), pooled_cosine_min=float(np.min(cos)), rel_l2_max=max(rel))
    Path(out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


def once(engine: str, shape: str) -> None:
    b, s = (int(x) for x in shape.split("x"))
    e = Engine(engine)
    e.set(b, s)
    for _ in range(3):
        e.execute()
    e.output(e.names[-1])
    e.cuda_check(e.cudart.cudaProfilerStart())
    e.execute()
    e.output(e.names[-1])
    e.cuda_check(e.cudart.cudaProfilerStop())


def _category(name: str) -> str:
    n = name.lower()
    if any(t in n for t in ("i8", "imma", "int8", "s8")) and "gemm" in n:
        return "gemm int8"
    if "gemm" in n or "xmma" in n or "matmul" in n:
        return "gemm float"
    if "softmax" in n:
        return "softmax"
    if "norm" in n:
        return "layernorm"
    if "quant" in n or "reformat" in n or "copy" in n or "cast" in n:
        return "reformat/quant"
    return "other"


def kernels(path: str, out: str | None) -> None:
    rows = []
    with open(path, newline="") as fh:
        lines = [ln for ln in fh if ln.startswith('"')]
    for rec in csv.DictReader(lines):
        if rec.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(rec["Metric Value"].replace(",", ""))
        unit = rec.get("Metric Unit", "nsecond")
        us = value / 1e3 if unit.startswith("n") else value if unit.startswith("u") else value * 1e3
        rows.append((rec["Kernel Name"], us))
    by_cat: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for name, us in rows:
        by_cat[_category(name)] = by_cat.get(_category(name), 0.0) + us
        by_name.setdefault(name, []).append(us)
    total = sum(us for _, us in rows)
    print(f"{len(rows)} kernels, {total / 1e3:.3f} ms (serialized by ncu)")
    for cat, us in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"  {cat:16s} {us / 1e3:8.3f} ms  {100 * us / max(total, 1e-9):5.1f}%")
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    for name, uss in top:
        print(f"  {sum(uss) / 1e3:8.3f} ms x{len(uss):3d}  {name[:150]}")
    if out:
        Path(out).write_text(
            json.dumps(
                {
                    "total_ms": total / 1e3,
                    "categories_ms": {k: v / 1e3 for k, v in by_cat.items()},
                    "kernels": [{"name": n, "us": u} for n, u in rows],
                },
                indent=1,
            )
        )


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("variants")
    v.add_argument("clean")
    v.add_argument("int8")
    v.add_argument("out")
    b = sub.add_parser("build")
    b.add_argument("onnx")
    b.add_argument("engine")
    b.add_argument("--int8", action="store_true")
    b.add_argument("--fp16", action="store_true")
    t = sub.add_parser("time")
    t.add_argument("engine")
    t.add_argument("clean")
    t.add_argument("--json", required=True)
    o = sub.add_parser("once")
    o.add_argument("engine")
    o.add_argument("shape")
    k = sub.add_parser("kernels")
    k.add_argument("csv")
    k.add_argument("--json")
    a = p.parse_args()
    if a.cmd == "variants":
        variants(a.clean, a.int8, a.out)
    elif a.cmd == "build":
        build(a.onnx, a.engine, a.int8, a.fp16)
    elif a.cmd == "time":
        time_engine(a.engine, a.clean, a.json)
    elif a.cmd == "once":
        once(a.engine, a.shape)
    else:
        kernels(a.csv, a.json)


if __name__ == "__main__":
    main()
