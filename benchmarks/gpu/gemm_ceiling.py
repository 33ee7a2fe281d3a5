"""The INT8 ceiling: can TensorRT 8.6 run an INT8 GEMM faster than an fp16 one on this GPU at all?

In the sixth session's kernel list, every INT8 GEMM of BERT-base ran an `sm80_xmma_..._i8...` kernel (an
Ampere kernel) and took as long as the fp16 GEMM it replaced, which ran a Hopper `sm90_xmma_..._f16...`
kernel. If TensorRT 8.6 has no Hopper INT8 GEMM, no Q/DQ placement can make the INT8 engine 0.6x the fp16
one. This measures that bound directly, on one layer, without the rest of a model:

    python3 benchmarks/gpu/gemm_ceiling.py models DIR        # single-GEMM ONNX files (onnx + numpy only)
    $PY310  benchmarks/gpu/gemm_ceiling.py build DIR/X.onnx  # one engine + the tactics TensorRT timed for it
    $PY310  benchmarks/gpu/gemm_ceiling.py time DIR --json OUT.json   # every engine alone; prints a table
    $PY310  benchmarks/gpu/gemm_ceiling.py scan --json OUT.json       # kernel names in TensorRT's libraries

Variants of each GEMM (M tokens x K in -> N out, BERT-base's shapes): `fp16` (fp16 in and out), `int8`
(fp32 Q/DQ input and int8 weights, as `calibrate` writes them), `int8_requant` (the same with its output
quantized, so that TensorRT may write int8), `int8_fp16io` (fp16 in and out around the Q/DQ, as `best` does).
The builder's verbose log names every tactic it timed; the report keeps, per engine, the tactics by
architecture and the fastest one, which says whether any Hopper INT8 kernel was even a candidate.
"""

from __future__ import annotations

import argparse
import gzip
import json
import mmap
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = ((2048, 768, 2304), (8192, 768, 3072), (8192, 3072, 768))  # QKV at 16x128, FC1 and FC2 at 16x512
VARIANTS = ("fp16", "int8", "int8_requant", "int8_fp16io")
KERNEL_NAME = re.compile(rb"sm(\d{2,3})[a-z]?_xmma_[A-Za-z0-9_]{8,240}")
TACTIC_LINE = re.compile(r"Tactic Name: (\S+) Tactic: (0x[0-9a-fA-F]+)(?: Time: ([0-9.]+))?")
FASTEST_LINE = re.compile(r"Fastest Tactic: (0x[0-9a-fA-F]+) Time: ([0-9.]+)")
INT8_KERNEL = re.compile(r"(^|_)i8|imma|int8")  # `sm80_xmma_..._i8i8_...`, `..._imma_...`, `..._int8int8_...`


def _name(m: int, k: int, n: int, variant: str) -> str:
    return f"gemm_{m}x{k}x{n}_{variant}"


def gemm_model(m: int, k: int, n: int, variant: str, seed: int = 0):
    """One MatMul [m,k] x [k,n] in the given precision variant (opset 17, what TensorRT 8.6 parses)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    nodes, inits = [], []
    io_type = TensorProto.FLOAT16 if variant in ("fp16", "int8_fp16io") else TensorProto.FLOAT
    x_in = "x"
    if variant == "fp16":
        inits.append(numpy_helper.from_array(w.astype(np.float16), "w"))
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["y"]))
    else:
        if variant == "int8_fp16io":
            nodes.append(helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT))
            x_in = "x32"
        w_scale = np.maximum(np.abs(w).max(axis=0), 1e-8) / 127.0
        w_q = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
        inits += [
            numpy_helper.from_array(w_q, "w_q"),
            numpy_helper.from_array(w_scale.astype(np.float32), "w_scale"),
            numpy_helper.from_array(np.zeros(n, np.int8), "w_zp"),
            numpy_helper.from_array(np.array(4.0 / 127, np.float32), "x_scale"),
            numpy_helper.from_array(np.array(0, np.int8), "zp"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", [x_in, "x_scale", "zp"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "x_scale", "zp"], ["x_dq"]),
            helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w_dq"], axis=1),
        ]
        mm_out = "mm" if variant != "int8" else "y"
        nodes.append(helper.make_node("MatMul", ["x_dq", "w_dq"], [mm_out]))
        if variant == "int8_requant":
            inits.append(numpy_helper.from_array(np.array(8.0 / 127, np.float32), "y_scale"))
            nodes += [
                helper.make_node("QuantizeLinear", ["mm", "y_scale", "zp"], ["y_q"]),
                helper.make_node("DequantizeLinear", ["y_q", "y_scale", "zp"], ["y"]),
            ]
        elif variant == "int8_fp16io":
            nodes.append(helper.make_node("Cast", ["mm"], ["y"], to=TensorProto.FLOAT16))
    graph = helper.make_graph(
        nodes,
        _name(m, k, n, variant),
        [helper.make_tensor_value_info("x", io_type, [m, k])],
        [helper.make_tensor_value_info("y", io_type, [m, n])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def models(out: Path) -> None:
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    for m, k, n in SHAPES:
        for v in VARIANTS:
            onnx.save(gemm_model(m, k, n, v), str(out / f"{_name(m, k, n, v)}.onnx"))
    print(json.dumps({"models": len(SHAPES) * len(VARIANTS), "dir": str(out)}))


def tactic_summary(log: str) -> dict:
    """What the builder's verbose log says it timed: every named tactic by architecture prefix and
    whether it is an INT8 kernel, and the name of each layer's fastest tactic."""
    names: dict[str, str] = {}
    for name, tactic, _ in TACTIC_LINE.findall(log):
        names[tactic.lower()] = name
    by_arch: dict[str, dict[str, int]] = {}
    examples: dict[str, list[str]] = {}
    for name in sorted(set(names.values())):
        arch = name.split("_", 1)[0] if name.startswith("sm") else "other"
        kind = "int8" if INT8_KERNEL.search(name) else "float"
        by_arch.setdefault(arch, {}).setdefault(kind, 0)
        by_arch[arch][kind] += 1
        if by_arch[arch][kind] <= 4:
            examples.setdefault(f"{arch} {kind}", []).append(name)
    fastest = [{"tactic": t, "ms": float(ms), "name": names.get(t.lower(), "")} for t, ms in FASTEST_LINE.findall(log)]
    return {"timed_tactics": len(names), "by_arch": by_arch, "examples": examples, "fastest": fastest}


def build(onnx_path: Path) -> None:
    import tensorrt as trt

    lines: list[str] = []

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            lines.append(msg)

    logger = Logger()
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise SystemExit("parse failed: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    if "int8" in onnx_path.stem:
        config.set_flag(trt.BuilderFlag.INT8)
    off = sum(1 << int(getattr(trt.TacticSource, s)) for s in ("CUBLAS", "CUBLAS_LT", "CUDNN") if hasattr(trt.TacticSource, s))
    config.set_tactic_sources(config.get_tactic_sources() & ~off)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    start = time.perf_counter()
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise SystemExit(f"{onnx_path.name}: build failed: " + " | ".join(lines[-5:]))
    engine = onnx_path.with_suffix(".engine")
    engine.write_bytes(bytes(blob))
    log = "\n".join(lines)
    with gzip.open(onnx_path.with_suffix(".log.gz"), "wt") as fh:
        fh.write(log)
    report = {"engine": engine.name, "build_s": round(time.perf_counter() - start, 1), **tactic_summary(log)}
    runtime = trt.Runtime(logger)
    eng = runtime.deserialize_cuda_engine(bytes(blob))
    inspector = eng.create_engine_inspector()
    report["layers"] = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON), strict=False).get("Layers", [])
    onnx_path.with_suffix(".build.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("engine", "build_s", "timed_tactics", "by_arch")}))


def _time_engine(path: Path, iters: int = 200, profile_once: bool = False) -> float:
    import tensorrt as trt

    from trtforge.backends.cuda_memory import cuda_check, cuda_handle, cuda_runtime

    cudart = cuda_runtime()
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(path.read_bytes())
    context = engine.create_execution_context()
    stream = cuda_check(cudart.cudaStreamCreate())
    buffers = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        nbytes = int(np.prod(engine.get_tensor_shape(name))) * np.dtype(trt.nptype(engine.get_tensor_dtype(name))).itemsize
        buffers.append(cuda_check(cudart.cudaMalloc(nbytes)))
        cuda_check(cudart.cudaMemset(buffers[-1], 0, nbytes))
        context.set_tensor_address(name, buffers[-1])
    for _ in range(20):
        context.execute_async_v3(cuda_handle(stream))
    if profile_once:  # under `ncu --profile-from-start off`: one execution's kernels
        cuda_check(cudart.cudaStreamSynchronize(stream))
        cuda_check(cudart.cudaProfilerStart())
        context.execute_async_v3(cuda_handle(stream))
        cuda_check(cudart.cudaStreamSynchronize(stream))
        cuda_check(cudart.cudaProfilerStop())
        return 0.0
    times = []
    for _ in range(5):
        start, end = cuda_check(cudart.cudaEventCreate()), cuda_check(cudart.cudaEventCreate())
        cuda_check(cudart.cudaEventRecord(start, stream))
        for _ in range(iters // 5):
            context.execute_async_v3(cuda_handle(stream))
        cuda_check(cudart.cudaEventRecord(end, stream))
        cuda_check(cudart.cudaEventSynchronize(end))
        times.append(cuda_check(cudart.cudaEventElapsedTime(start, end)) / (iters // 5))
    for b in buffers:
        cuda_check(cudart.cudaFree(b))
    return float(np.median(times))


def timing(folder: Path, out: Path) -> None:
    rows = []
    for m, k, n in SHAPES:
        for v in VARIANTS:
            stem = folder / _name(m, k, n, v)
            row = {"gemm": f"{m}x{k}x{n}", "variant": v}
            if not stem.with_suffix(".engine").exists():
                row["error"] = "no engine (build failed)"
                rows.append(row)
                continue
            ms = _time_engine(stem.with_suffix(".engine"))
            built = json.loads(stem.with_suffix(".build.json").read_text())
            kernels = [f["name"] for f in built.get("fastest", []) if f.get("name")]
            row.update(
                ms=round(ms, 4),
                tops=round(2 * m * k * n / ms / 1e9, 1),
                by_arch=built.get("by_arch"),
                layers=[layer.get("LayerType", "") if isinstance(layer, dict) else str(layer)[:80] for layer in built.get("layers", [])],
                fastest_kernels=kernels,
            )
            rows.append(row)
    fp16 = {r["gemm"]: r.get("ms") for r in rows if r["variant"] == "fp16"}
    print(f"{'GEMM MxKxN':18s} {'variant':13s} {'ms':>8s} {'TOP/s':>7s} {'vs fp16':>8s}  tactics timed by arch (int8/float)")
    for r in rows:
        if "ms" not in r:
            print(f"{r['gemm']:18s} {r['variant']:13s} {r['error']}")
            continue
        ratio = r["ms"] / fp16[r["gemm"]] if fp16.get(r["gemm"]) else float("nan")
        r["vs_fp16"] = round(ratio, 3)
        arch = " ".join(f"{a}:{d.get('int8', 0)}/{d.get('float', 0)}" for a, d in sorted((r["by_arch"] or {}).items()))
        print(f"{r['gemm']:18s} {r['variant']:13s} {r['ms']:8.4f} {r['tops']:7.1f} {ratio:8.3f}  {arch}")
        for name in r["fastest_kernels"]:
            print(f"{'':41s}fastest: {name[:110]}")
    out.write_text(json.dumps({"rows": rows}, indent=1))


def kernel_names(blob: bytes) -> dict[str, set[str]]:
    """Kernel names embedded in a library, by architecture: `sm90_xmma_gemm_...` and the like."""
    found: dict[str, set[str]] = {}
    for match in KERNEL_NAME.finditer(blob):
        found.setdefault("sm" + match.group(1).decode(), set()).add(match.group(0).decode())
    return found


def scan(out: Path) -> None:
    import tensorrt as trt

    dirs = {Path(trt.__file__).resolve().parent}
    try:
        import tensorrt_libs

        dirs.add(Path(tensorrt_libs.__file__).resolve().parent)
    except ImportError:
        pass
    result: dict = {"tensorrt": trt.__version__, "libraries": {}}
    for d in sorted(dirs):
        for lib in sorted(d.glob("libnvinfer*.so*")):
            with open(lib, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                names = kernel_names(mm)
            summary = {}
            for arch, found in sorted(names.items()):
                int8 = sorted(n for n in found if INT8_KERNEL.search(n))
                summary[arch] = {
                    "kernels": len(found),
                    "int8": len(int8),
                    "int8_examples": int8[:12],
                    "float_examples": sorted(found - set(int8))[:6],
                }
            result["libraries"][lib.name] = summary
            print(lib.name, json.dumps({a: (s["kernels"], s["int8"]) for a, s in summary.items()}))
    out.write_text(json.dumps(result, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("models").add_argument("dir", type=Path)
    sub.add_parser("build").add_argument("onnx", type=Path)
    sub.add_parser("once").add_argument("engine", type=Path)
    t = sub.add_parser("time")
    t.add_argument("dir", type=Path)
    t.add_argument("--json", type=Path, required=True)
    s = sub.add_parser("scan")
    s.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    if a.cmd == "models":
        models(a.dir)
    elif a.cmd == "build":
        build(a.onnx)
    elif a.cmd == "once":
        _time_engine(a.engine, profile_once=True)
    elif a.cmd == "time":
        timing(a.dir, a.json)
    else:
        scan(a.json)


if __name__ == "__main__":
    main()
