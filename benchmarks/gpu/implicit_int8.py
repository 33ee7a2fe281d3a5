"""The INT8 anchor: TensorRT 8.6's own implicit INT8 vs trtforge's INT8 engine and the fp16 engine.

The anchor is what a user gets without trtforge: an IInt8EntropyCalibrator2 fed the same calibration
samples trtforge uses (read by trtforge's calibrate/data.py with the model's own tokenizer; text padded to
one calibration shape), INT8 + FP16 flags, built from the fp32 (clean) ONNX, one profile. Every engine is
then judged alike: held-out mean/min cosine against ONNX Runtime fp32 (mean-pooled for token outputs,
trtforge's calibrate/evaluate.py and comparator), top-1 agreement for logits, and GPU ms (CUDA events
around execute, median) at the shapes of the issue's done-when. Runs under TensorRT 8.6's $PY310 (no torch):

    $PY310 benchmarks/gpu/implicit_int8.py build CLEAN.onnx ENGINE --data calib_data/minilm --max-samples 64 --seq 128
    $PY310 benchmarks/gpu/implicit_int8.py compare CLEAN.onnx --eval-data calib_data/minilm_eval \\
        --engine implicit=ENGINE --engine trtforge_int8=X.best.engine --engine fp16=X.fp16.engine --json OUT.json

`build` also keeps the builder's layer report (ENGINE.layers.log) and the inspector's JSON at the opt
shapes (ENGINE.inspector.json): what TensorRT 8.6 shows of an INT8 engine, for `trtforge inspect`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TEXT_SHAPES = ((16, 128), (16, 512), (64, 512))
IMAGE_BATCHES = (16, 64)
TACTICS_OFF = ("CUBLAS", "CUBLAS_LT", "CUDNN")


def _model(clean: Path):
    from trtforge.core.onnxio import load_onnx
    from trtforge.graph.index import io_specs

    model = load_onnx(clean, load_external_data=False)
    specs, axes, side = io_specs(clean, model)
    return specs, axes, side or {}


def _samples(clean: Path, folder: Path, max_samples: int | None, max_len: int | None = None):
    from trtforge.calibrate import data as data_mod
    from trtforge.calibrate.data import max_sample_length, tokenizer_factory

    specs, axes, _ = _model(clean)
    _, samples = data_mod.load_samples(folder, specs, tokenizer_factory(clean), max_len or max_sample_length(specs, axes), max_samples)
    return specs, axes, samples


def _one_profile(specs, axes) -> dict:
    """The profile every engine of this benchmark is built with: each axis' declared min/opt/max."""
    from trtforge.build.profiles import plan_profiles

    return plan_profiles(specs, axes, {})[0]


def _calibration_batches(specs, samples, batch: int, seq: int | None) -> list[dict[str, np.ndarray]]:
    """Fixed-shape batches for the calibrator (implicit INT8 calibrates at one shape): text padded with
    token 0 and mask 0 (or truncated) to `seq`; images as they are."""
    fixed = []
    for s in samples:
        out = {}
        for spec in specs:
            a = s[spec.name]
            if seq is not None and a.ndim == 2:
                a = a[:, :seq]
                a = np.pad(a, ((0, 0), (0, seq - a.shape[1])), constant_values=0)
            out[spec.name] = a
        fixed.append(out)
    return [{k: np.concatenate([f[k] for f in fixed[i : i + batch]]) for k in fixed[0]} for i in range(0, len(fixed) - batch + 1, batch)]


class _Capture:
    """A TensorRT logger that keeps warnings/errors and the builder's layer report."""

    def __init__(self, trt):
        from trtforge.backends.tensorrt import LAYER_LOG_HEADERS

        class Logger(trt.ILogger):
            def __init__(inner):
                trt.ILogger.__init__(inner)
                inner.layer_log, inner.errors = [], []

            def log(inner, severity, msg):
                if severity == trt.ILogger.Severity.VERBOSE:
                    if msg.startswith(LAYER_LOG_HEADERS):
                        inner.layer_log.append(msg)
                elif severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                    inner.errors.append(msg)

        self.impl = Logger()


def build_implicit(clean: Path, engine: Path, data: Path, max_samples: int, seq: int | None, batch: int) -> None:
    import tensorrt as trt

    from trtforge.backends.cuda_memory import DeviceBuffer, cuda_check, cuda_runtime

    specs, axes, samples = _samples(clean, data, max_samples, seq)
    calib = _calibration_batches(specs, samples, batch, seq)
    if not calib:
        raise SystemExit(f"fewer than {batch} calibration samples in {data}")
    cap = _Capture(trt)
    builder = trt.Builder(cap.impl)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, cap.impl)
    if not parser.parse_from_file(str(clean)):
        raise SystemExit("parse failed: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    dtypes = {network.get_input(i).name: np.dtype(trt.nptype(network.get_input(i).dtype)) for i in range(network.num_inputs)}
    cudart = cuda_runtime()
    buffers = {n: DeviceBuffer(max(b[n].astype(dtypes[n]).nbytes for b in calib)) for n in dtypes}
    cache_path = engine.with_name(engine.name + ".calib.cache")

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(inner):
            trt.IInt8EntropyCalibrator2.__init__(inner)
            inner.i = 0

        def get_batch_size(inner):
            return batch

        def get_batch(inner, names):
            if inner.i >= len(calib):
                return None
            for n in names:
                host = np.ascontiguousarray(calib[inner.i][n].astype(dtypes[n]))
                cuda_check(cudart.cudaMemcpy(buffers[n].ptr, host.ctypes.data, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            inner.i += 1
            return [buffers[n].ptr for n in names]

        def read_calibration_cache(inner):
            return None  # always calibrate: the anchor is measured, not reused

        def write_calibration_cache(inner, cache):
            cache_path.write_bytes(bytes(cache))

    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_flag(trt.BuilderFlag.FP16)
    off = sum(1 << int(getattr(trt.TacticSource, n)) for n in TACTICS_OFF if hasattr(trt.TacticSource, n))
    config.set_tactic_sources(config.get_tactic_sources() & ~off)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    profile = _one_profile(specs, axes)
    trt_profile, calib_profile = builder.create_optimization_profile(), builder.create_optimization_profile()
    for name, (lo, opt, hi) in profile.shapes.items():
        trt_profile.set_shape(name, lo, opt, hi)
        shape = calib[0][name].shape
        calib_profile.set_shape(name, shape, shape, shape)
    config.add_optimization_profile(trt_profile)
    config.set_calibration_profile(calib_profile)
    calibrator = Calibrator()
    config.int8_calibrator = calibrator
    start = time.perf_counter()
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise SystemExit("build failed: " + "; ".join(cap.impl.errors[:3]))
    engine.write_bytes(bytes(blob))
    sidecar = {
        "kind": "engine",
        "backend": "tensorrt",
        "tensorrt_version": trt.__version__,
        "precision": "implicit-int8",
        "profiles": [profile.to_json()],
        "inputs": [s.model_dump() for s in specs],
        "source_onnx": str(clean),
        "calibration": {"data": str(data), "samples": len(calib) * batch, "shape": {k: list(v.shape) for k, v in calib[0].items()}},
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    engine.with_name(engine.name + ".json").write_text(json.dumps(sidecar, indent=1))
    _layer_evidence(engine, bytes(blob), profile, "\n".join(cap.impl.layer_log))
    for b in buffers.values():
        b.free()
    print(json.dumps({"engine": str(engine), "build_s": sidecar["build_seconds"], "calibration": sidecar["calibration"]}))


def _layer_evidence(engine: Path, blob: bytes, profile, layer_log: str) -> dict:
    """What TensorRT shows of the engine's precisions: the build log's report and the inspector at the
    opt shapes, each summarized with trtforge's parser (and the raw text kept for the parser's sake)."""
    from trtforge.backends.engine_layers import engine_layers, parse_layer_log, summarize_layers
    from trtforge.backends.tensorrt import load_trt

    engine.with_name(engine.name + ".layers.log").write_text(layer_log)
    evidence = {"build_log": summarize_layers(parse_layer_log(layer_log)) if layer_log else None}
    try:
        layers, why = engine_layers(load_trt("tensorrt"), blob, profile)
        engine.with_name(engine.name + ".inspector.json").write_text(json.dumps(layers, indent=1))
        evidence["inspector"] = summarize_layers(layers) if layers else why
    except Exception as exc:  # the evidence is a by-product; the benchmark goes on
        evidence["inspector"] = f"{type(exc).__name__}: {exc}"
    engine.with_name(engine.name + ".evidence.json").write_text(json.dumps(evidence, indent=1))
    print(json.dumps({"layer_evidence": {k: (v.get("int8_verdict") if isinstance(v, dict) else v) for k, v in evidence.items()}}))
    return evidence


def _gpu_ms(runner, feeds: dict, repeat: int = 30) -> float:
    for _ in range(5):
        runner.run(feeds)
    runner.timings.clear()
    for _ in range(repeat):
        runner.run(feeds)
    return statistics.median(t.gpu_ms for t in runner.timings)


def compare(clean: Path, eval_data: Path, engines: list[str], max_samples: int | None, out: Path) -> None:
    from trtforge.backends.onnxruntime import OrtRunner
    from trtforge.backends.tensorrt import load_trt
    from trtforge.backends.tensorrt_runtime import TrtRunner
    from trtforge.calibrate.data import limited_batches
    from trtforge.calibrate.engine_check import NamedOutputs
    from trtforge.calibrate.evaluate import evaluate, reference_outputs
    from trtforge.calibrate.step import output_kinds_of
    from trtforge.core.onnxio import load_onnx
    from trtforge.runtime.feeds import random_feeds

    specs, axes, _ = _model(clean)
    _, _, samples = _samples(clean, eval_data, max_samples)
    batches = limited_batches(samples, max_samples)
    reference = OrtRunner(load_onnx(clean).SerializeToString())
    kinds = output_kinds_of(reference, clean, specs, axes)  # declared in the sidecar chain, as calibrate reads them
    refs = reference_outputs(reference, batches)
    text = any(s.name == "input_ids" for s in specs)
    shapes = [{"batch": b, "seq": s} for b, s in TEXT_SHAPES] if text else [{"batch": b} for b in IMAGE_BATCHES]
    mod = load_trt("tensorrt")
    rows = []
    for item in engines:
        label, _, path = item.partition("=")
        path = Path(path)
        row: dict = {"variant": label, "engine": str(path)}
        try:
            sidecar = json.loads(path.with_name(path.name + ".json").read_text())
            runner = TrtRunner(mod, path, sidecar)
            acc = evaluate(NamedOutputs(runner, reference.output_names), batches, refs, kinds)
            row.update(
                mean_cosine=acc.mean_cosine,
                min_cosine=acc.min_cosine,
                samples=int(acc.sample_cosines.size),
                top1_agreement=min((m["top1_agreement"] for m in acc.per_output.values() if "top1_agreement" in m), default=None),
            )
            row["gpu_ms"] = {}
            for sizes in shapes:
                key = "x".join(str(v) for v in sizes.values())
                try:
                    row["gpu_ms"][key] = round(_gpu_ms(runner, random_feeds(specs, sizes)), 4)
                except Exception as exc:  # a shape outside the engine's profile: say so, go on
                    row["gpu_ms"][key] = f"{type(exc).__name__}: {str(exc)[:120]}"
            row["engine_mb"] = round(path.stat().st_size / 2**20, 1)
            row["build_s"] = sidecar.get("build_seconds")
            row["layer_summary"] = (sidecar.get("layer_summary") or {}).get("int8_verdict")
            runner.close()
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = ["x".join(str(v) for v in s.values()) for s in shapes]
    print(f"\n{clean.name}: held-out {len(samples)} samples from {eval_data}, ORT fp32 reference")
    header = ["variant", "mean cos", "min cos", "top-1"] + [f"ms {k}" for k in keys]
    print(" | ".join(header))
    for r in rows:
        if "error" in r:
            print(f"{r['variant']} | error: {r['error'][:150]}")
            continue
        cells = [
            r["variant"],
            f"{r['mean_cosine']:.5f}",
            f"{r['min_cosine']:.5f}",
            "-" if r["top1_agreement"] is None else f"{r['top1_agreement']:.4f}",
        ]
        cells += [f"{r['gpu_ms'][k]:.3f}" if isinstance(r["gpu_ms"][k], float) else "n/a" for k in keys]
        print(" | ".join(cells))
    out.write_text(json.dumps({"onnx": str(clean), "eval_data": str(eval_data), "samples": len(samples), "rows": rows}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="TensorRT's implicit INT8 engine (IInt8EntropyCalibrator2, INT8 + FP16)")
    b.add_argument("clean", type=Path)
    b.add_argument("engine", type=Path)
    b.add_argument("--data", type=Path, required=True)
    b.add_argument("--max-samples", type=int, default=64)
    b.add_argument("--seq", type=int, default=None, help="text: the calibration length (samples padded/truncated)")
    b.add_argument("--batch", type=int, default=8)
    c = sub.add_parser("compare", help="held-out accuracy vs ORT fp32 and GPU ms of several engines")
    c.add_argument("clean", type=Path)
    c.add_argument("--eval-data", type=Path, required=True)
    c.add_argument("--engine", action="append", required=True, help="LABEL=PATH (an engine with its .json sidecar)")
    c.add_argument("--max-samples", type=int, default=None)
    c.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    if a.cmd == "build":
        build_implicit(a.clean, a.engine, a.data, a.max_samples, a.seq, a.batch)
    else:
        compare(a.clean, a.eval_data, a.engine, a.max_samples, a.json)


if __name__ == "__main__":
    main()
